package director

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// TestDirectorAuth: the director mints client tokens with the fleet's keys
// and passes Authorization through, so the transceiver behind it accepts
// the session's token and refuses requests without one.
func TestDirectorAuth(t *testing.T) {
	const apiKey = "sk-0123456789abcdef0123456789abcdef"
	ac := auth.Config{APIKeys: []string{apiKey}, SigningKey: base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, _ := token.NewKeyring(token.Key{Secret: secret})
	log := slog.New(slog.DiscardHandler)
	backend := httptest.NewServer(agent.NewEcho(log))
	defer backend.Close()
	trx, err := transceiver.New(transceiver.Config{
		ID: 1, ListenAddr: "127.0.0.1:0", Advertise: "127.0.0.1:3478", Auth: ac,
		BackendURL: "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
	}, keys, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	defer trx.Close()
	up := httptest.NewServer(trx.Handler())
	defer up.Close()
	d, err := New(Config{Regions: map[string]Region{"us": {Cluster: "c1"}}, DefaultRegion: "us",
		Clusters: map[string][]string{"c1": {up.URL}}, Auth: ac}, log)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(d.Handler())
	defer front.Close()

	do := func(method, url, bearer, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/sdp")
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	resp := do(http.MethodPost, front.URL+auth.MintPath, apiKey, "")
	var tok auth.Token
	if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&tok) != nil {
		t.Fatalf("mint at the director: %d", resp.StatusCode)
	}
	if resp := do(http.MethodPost, front.URL+"/v1/calls", "", offer(t)); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("offer without a token through the director: %d, want 401", resp.StatusCode)
	}
	resp = do(http.MethodPost, front.URL+"/v1/calls", tok.Value, offer(t))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("offer with the minted token: %d", resp.StatusCode)
	}
	loc := front.URL + resp.Header.Get("Location")
	if resp := do(http.MethodDelete, loc, "", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("DELETE without a token through the director: %d, want 401", resp.StatusCode)
	}
	if resp := do(http.MethodDelete, loc, tok.Value, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE with the session's token: %d, want 204", resp.StatusCode)
	}
}

func TestDirectorAuthConfig(t *testing.T) {
	_, err := New(Config{Regions: map[string]Region{"us": {Cluster: "c1"}}, DefaultRegion: "us",
		Clusters: map[string][]string{"c1": {"http://127.0.0.1:1"}}, Auth: auth.Config{SigningKey: "x"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "signing_key") {
		t.Fatalf("New with a bad auth config: %v", err)
	}
}

// TestDirectorRefusesAtTheEdge: with auth on, the director itself refuses
// an offer without a valid token, even in front of a transceiver that
// would take it.
func TestDirectorRefusesAtTheEdge(t *testing.T) {
	const apiKey = "sk-0123456789abcdef0123456789abcdef"
	ac := auth.Config{APIKeys: []string{apiKey}, SigningKey: base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))}
	hits := 0
	open := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits++; w.WriteHeader(http.StatusCreated) }))
	defer open.Close()
	d, err := New(Config{Regions: map[string]Region{"us": {Cluster: "c1"}}, DefaultRegion: "us",
		Clusters: map[string][]string{"c1": {open.URL}}, Auth: ac}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(d.Handler())
	defer front.Close()
	for _, bearer := range []string{"", "garbage"} {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/calls", strings.NewReader("v=0"))
		req.Header.Set("Content-Type", "application/sdp")
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("offer with bearer %q: %d, want 401 from the director", bearer, resp.StatusCode)
		}
	}
	if hits != 0 {
		t.Fatalf("%d unauthenticated offers reached the transceiver", hits)
	}
}
