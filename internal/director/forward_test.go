package director

import (
	"crypto/rand"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// TestDirectorNamesTheClient: a proxied offer carries the client's
// address in X-Forwarded-For, so a transceiver that trusts the director
// bounds pending sessions per client, not per director.
func TestDirectorNamesTheClient(t *testing.T) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, _ := token.NewKeyring(token.Key{Secret: secret})
	log := slog.New(slog.DiscardHandler)
	backend := httptest.NewServer(agent.NewEcho(log))
	defer backend.Close()
	trx, err := transceiver.New(transceiver.Config{
		ID: 1, ListenAddr: "127.0.0.1:0", Advertise: "127.0.0.1:3478",
		BackendURL:          "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
		MaxPendingPerClient: 1, TrustedProxies: []string{"127.0.0.0/8"},
	}, keys, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	defer trx.Close()
	srv := httptest.NewServer(trx.Handler())
	defer srv.Close()
	d, err := New(Config{
		Regions:        map[string]Region{"eu": {Cluster: "c1"}},
		DefaultRegion:  "eu",
		Clusters:       map[string][]string{"c1": {srv.URL}},
		TrustedProxies: []string{"127.0.0.0/8"},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(d.Handler())
	defer front.Close()
	for i, tt := range []struct {
		client string
		want   int
	}{
		{"198.51.100.7", http.StatusCreated},
		{"198.51.100.7", http.StatusTooManyRequests}, // its one pending session is not connected
		{"203.0.113.9", http.StatusCreated},          // another client behind the same director
	} {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/calls", strings.NewReader(offer(t)))
		req.Header.Set("Content-Type", "application/sdp")
		req.Header.Set("X-Forwarded-For", tt.client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Fatalf("offer %d from %s: %d, want %d", i, tt.client, resp.StatusCode, tt.want)
		}
	}
}
