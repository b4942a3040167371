package director

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster is one real transceiver (cluster id, echo backend) behind an HTTP server.
type cluster struct {
	trx *transceiver.Server
	srv *httptest.Server
}

func startCluster(t *testing.T, keys *token.Keyring, id uint16) cluster {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	backend := httptest.NewServer(agent.NewEcho(log))
	t.Cleanup(backend.Close)
	trx, err := transceiver.New(transceiver.Config{
		ID: 1, Cluster: id, ListenAddr: "127.0.0.1:0", Advertise: "127.0.0.1:3478",
		IngressByRegion: map[string]string{"eu": "127.0.0.11:3478", "us": "127.0.0.12:3478"},
		BackendURL:      "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
	}, keys, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = trx.Close() })
	srv := httptest.NewServer(trx.Handler())
	t.Cleanup(srv.Close)
	return cluster{trx, srv}
}

func offer(t *testing.T) string { return webrtctest.AudioOffer(t, true, false) }

func answerFacts(t *testing.T, keys *token.Keyring, answer string) (cluster uint16, candidate string) {
	t.Helper()
	for _, line := range strings.Split(answer, "\r\n") {
		if u, ok := strings.CutPrefix(line, "a=ice-ufrag:"); ok {
			c, err := keys.Open([]byte(u), time.Now())
			if err != nil {
				t.Fatalf("ufrag %q: %v", u, err)
			}
			cluster = c.Cluster
		}
		if strings.HasPrefix(line, "a=candidate:") {
			candidate = strings.Fields(line)[4]
		}
	}
	return cluster, candidate
}

func TestDirectorRoutesByRegion(t *testing.T) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, _ := token.NewKeyring(token.Key{Secret: secret})
	c1, c2 := startCluster(t, keys, 1), startCluster(t, keys, 2)
	d, err := New(Config{
		RegionHeader: "X-CDN-Region",
		Regions: map[string]Region{
			"eu": {Cluster: "c1", Prefixes: []string{"198.51.100.0/24"}},
			"us": {Cluster: "c2", Prefixes: []string{"203.0.113.0/24", "198.51.100.128/25"}},
		},
		DefaultRegion:  "eu",
		Clusters:       map[string][]string{"c1": {c1.srv.URL}, "c2": {c2.srv.URL}},
		TrustedProxies: []string{"127.0.0.0/8"},
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(d.Handler())
	defer front.Close()

	tests := []struct {
		name        string
		header      string
		xff         string
		wantCluster uint16
		wantIngress string
		trx         *transceiver.Server
	}{
		{"cdn header", "us", "", 2, "127.0.0.12", c2.trx},
		{"unknown header falls to prefix", "mars", "203.0.113.9", 2, "127.0.0.12", c2.trx},
		{"prefix", "", "198.51.100.7", 1, "127.0.0.11", c1.trx},
		{"longest prefix wins", "", "198.51.100.200", 2, "127.0.0.12", c2.trx},
		{"default", "", "192.0.2.1", 1, "127.0.0.11", c1.trx},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/calls", strings.NewReader(offer(t)))
			req.Header.Set("Content-Type", "application/sdp")
			if tt.header != "" {
				req.Header.Set("X-CDN-Region", tt.header)
			}
			if tt.xff != "" {
				req.Header.Set("X-Forwarded-For", tt.xff)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			cl, cand := answerFacts(t, keys, string(body))
			if cl != tt.wantCluster || cand != tt.wantIngress {
				t.Fatalf("cluster %d ingress %s, want %d %s", cl, cand, tt.wantCluster, tt.wantIngress)
			}
			if got := resp.Header.Values("Access-Control-Allow-Origin"); len(got) != 1 {
				t.Fatalf("Access-Control-Allow-Origin %q, want exactly one", got)
			}
			// DELETE through the director reaches the owning transceiver.
			if tt.trx.Sessions() != 1 {
				t.Fatalf("owning transceiver has %d sessions", tt.trx.Sessions())
			}
			del, _ := http.NewRequest(http.MethodDelete, front.URL+resp.Header.Get("Location"), nil)
			dresp, err := http.DefaultClient.Do(del)
			if err != nil {
				t.Fatal(err)
			}
			dresp.Body.Close()
			if dresp.StatusCode != http.StatusNoContent || tt.trx.Sessions() != 0 {
				t.Fatalf("DELETE %s: %d, %d sessions left", resp.Header.Get("Location"), dresp.StatusCode, tt.trx.Sessions())
			}
		})
	}
	// Unknown session references are 404, never proxied anywhere.
	for _, ref := range []string{"nope", "c9-0~abc", "c1-0~", "c1-0~..%2F..%2Flive", "c1-0~a%20b"} {
		del, _ := http.NewRequest(http.MethodDelete, front.URL+"/v1/calls/"+ref, nil)
		resp, err := http.DefaultClient.Do(del)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("DELETE %s: %d, want 404", ref, resp.StatusCode)
		}
	}
}

func TestDirectorRedirect(t *testing.T) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, _ := token.NewKeyring(token.Key{Secret: secret})
	c1 := startCluster(t, keys, 1)
	d, err := New(Config{
		Mode:          "redirect",
		Regions:       map[string]Region{"us": {Cluster: "c1"}},
		DefaultRegion: "us",
		Clusters:      map[string][]string{"c1": {c1.srv.URL}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(d.Handler())
	defer front.Close()
	// Go's client follows a 307 with the body, as browsers' fetch does.
	resp, err := http.Post(front.URL+"/v1/calls", "application/sdp", strings.NewReader(offer(t)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if _, cand := answerFacts(t, keys, string(body)); cand != "127.0.0.12" {
		t.Fatalf("ingress %s, want the us ingress 127.0.0.12", cand)
	}
	_ = c1.trx.Close()
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := func() Config {
		return Config{
			Regions:       map[string]Region{"eu": {Cluster: "c1", Prefixes: []string{"10.0.0.0/8"}}},
			DefaultRegion: "eu",
			Clusters:      map[string][]string{"c1": {"http://127.0.0.1:1"}},
		}
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		mention string
	}{
		{"mode", func(c *Config) { c.Mode = "teleport" }, "mode"},
		{"no clusters", func(c *Config) { c.Clusters = nil }, "clusters"},
		{"bad url", func(c *Config) { c.Clusters["c1"] = []string{"ftp://x"} }, "http(s)"},
		{"unknown cluster", func(c *Config) { c.Regions["eu"] = Region{Cluster: "c9"} }, "c9"},
		{"bad prefix", func(c *Config) { c.Regions["eu"] = Region{Cluster: "c1", Prefixes: []string{"10.0.0.1"}} }, "CIDR"},
		{"bad default", func(c *Config) { c.DefaultRegion = "mars" }, "default_region"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.mutate(&c)
			_, err := New(c, nil)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %v does not mention %q", err, tt.mention)
			}
		})
	}
}

// TestDirectorFailsOver: an offer that meets a dead (502) or draining
// (503) transceiver is tried on the cluster's next one, whichever the
// round-robin starts with.
func TestDirectorFailsOver(t *testing.T) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, _ := token.NewKeyring(token.Key{Secret: secret})
	live, draining := startCluster(t, keys, 1), startCluster(t, keys, 1)
	drained := make(chan int, 1)
	dctx, cancel := context.WithCancel(context.Background())
	go func() { drained <- draining.trx.Drain(dctx) }()
	defer func() { cancel(); <-drained }()
	for draining.trx.Ready() {
		time.Sleep(time.Millisecond)
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	d, err := New(Config{
		Regions:       map[string]Region{"eu": {Cluster: "c1"}},
		DefaultRegion: "eu",
		Clusters:      map[string][]string{"c1": {deadURL, draining.srv.URL, live.srv.URL}},
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(d.Handler())
	defer front.Close()
	for i := range 3 { // each round-robin starting point
		resp, err := http.Post(front.URL+"/v1/calls", "application/sdp", strings.NewReader(offer(t)))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || !strings.HasPrefix(resp.Header.Get("Location"), "/v1/calls/c1-2~") {
			t.Fatalf("offer %d: %d, Location %q: %s", i, resp.StatusCode, resp.Header.Get("Location"), body)
		}
	}
	if n := live.trx.Sessions(); n != 3 {
		t.Fatalf("live transceiver has %d sessions, want 3", n)
	}
}
