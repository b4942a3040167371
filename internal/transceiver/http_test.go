package transceiver

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/httpapi"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newTestServer runs a transceiver whose backend is the echo agent.
func newTestServer(t *testing.T, mutate ...func(*Config)) (*Server, *httptest.Server, *token.Keyring) {
	t.Helper()
	return newTestServerLog(t, slog.New(slog.DiscardHandler), mutate...)
}

// newTestServerLog is newTestServer with the transceiver logging to log.
func newTestServerLog(t *testing.T, log *slog.Logger, mutate ...func(*Config)) (*Server, *httptest.Server, *token.Keyring) {
	t.Helper()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, err := token.NewKeyring(token.Key{ID: 3, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewServer(agent.NewEcho(slog.New(slog.DiscardHandler)))
	t.Cleanup(backend.Close)
	cfg := Config{
		ID: 9, Cluster: 2, ListenAddr: "127.0.0.1:0", Advertise: "127.0.0.1:3478",
		BackendURL: "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
	}
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := New(cfg, keys, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	api := httptest.NewServer(s.Handler())
	t.Cleanup(api.Close)
	return s, api, keys
}

// clientOffer makes a complete offer from a Pion client with an
// oai-events channel and, if audio, an audio transceiver.
func clientOffer(t *testing.T, audio bool) string { return webrtctest.AudioOffer(t, audio, true) }

func post(t *testing.T, url, contentType, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, contentType, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestOfferAnswer(t *testing.T) {
	s, api, keys := newTestServer(t)
	for _, path := range []string{"/v1/calls", "/v1/realtime/calls"} {
		t.Run(path, func(t *testing.T) {
			resp := post(t, api.URL+path, "application/sdp", clientOffer(t, true))
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/sdp" {
				t.Fatalf("content type %q", ct)
			}
			loc := resp.Header.Get("Location")
			if !strings.HasPrefix(loc, "/v1/calls/") {
				t.Fatalf("location %q", loc)
			}
			answer := string(body)
			// Exactly one candidate: the relay's address, never the transceiver's own port.
			var cands []string
			var ufrag string
			for _, line := range strings.Split(answer, "\r\n") {
				if strings.HasPrefix(line, "a=candidate:") {
					cands = append(cands, line)
				}
				if strings.HasPrefix(line, "a=ice-ufrag:") {
					ufrag = strings.TrimPrefix(line, "a=ice-ufrag:")
				}
			}
			if len(cands) != 1 || !strings.Contains(cands[0], " 127.0.0.1 3478 typ host") {
				t.Fatalf("candidates %q, want one host candidate 127.0.0.1 3478", cands)
			}
			if !strings.Contains(answer, "a=ice-lite") || !strings.Contains(answer, "a=end-of-candidates") {
				t.Fatalf("answer is not a complete ICE-lite answer:\n%s", answer)
			}
			if !strings.Contains(answer, "opus/48000/2") {
				t.Fatalf("answer has no Opus:\n%s", answer)
			}
			// The ufrag is a token naming this transceiver.
			c, err := keys.Open([]byte(ufrag), keysNow())
			if err != nil || c.Transceiver != 9 || c.Cluster != 2 {
				t.Fatalf("ufrag %q opens to %+v, %v", ufrag, c, err)
			}
			// DELETE ends it; a second DELETE is 404.
			for _, want := range []int{http.StatusNoContent, http.StatusNotFound} {
				req, _ := http.NewRequest(http.MethodDelete, api.URL+loc, nil)
				r, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				r.Body.Close()
				if r.StatusCode != want {
					t.Fatalf("DELETE: status %d, want %d", r.StatusCode, want)
				}
			}
			if n := s.Sessions(); n != 0 {
				t.Fatalf("%d sessions left", n)
			}
		})
	}
}

func TestOfferErrors(t *testing.T) {
	_, api, _ := newTestServer(t)
	noAudio := clientOffer(t, false)
	tests := []struct {
		name        string
		contentType string
		body        string
		status      int
		mention     string
	}{
		{"wrong content type", "application/json", `{"sdp":"v=0"}`, http.StatusUnsupportedMediaType, "application/sdp"},
		{"no content type", "", "v=0", http.StatusUnsupportedMediaType, "application/sdp"},
		{"empty", "application/sdp", "", http.StatusBadRequest, "empty"},
		{"malformed", "application/sdp", "hello there", http.StatusBadRequest, "does not parse"},
		{"no audio", "application/sdp", noAudio, http.StatusBadRequest, "no audio"},
		{"too large", "application/sdp", strings.Repeat("a", 70<<10), http.StatusRequestEntityTooLarge, "64 KiB"},
		// What curl -d does to a file: its line breaks are gone.
		{"line breaks stripped", "application/sdp", strings.NewReplacer("\r", "", "\n", "").Replace(clientOffer(t, true)), http.StatusBadRequest,
			"the offer has no line breaks: send the SDP as it is, one line per attribute (curl --data-binary @offer.sdp, not -d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, api.URL+"/v1/calls", tt.contentType, tt.body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			var e httpapi.Error
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("error body is not JSON: %v", err)
			}
			if !strings.Contains(e.Error.Message, tt.mention) {
				t.Fatalf("message %q does not mention %q", e.Error.Message, tt.mention)
			}
		})
	}
}

func TestCORS(t *testing.T) {
	_, api, _ := newTestServer(t)
	req, _ := http.NewRequest(http.MethodOptions, api.URL+"/v1/calls", nil)
	req.Header.Set("Origin", "https://app.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "content-type")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h := resp.Header
	if resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "Content-Type") {
		t.Fatalf("preflight: %d %v", resp.StatusCode, h)
	}
	r := post(t, api.URL+"/v1/calls", "text/plain", "x")
	if r.Header.Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(r.Header.Get("Access-Control-Expose-Headers"), "Location") {
		t.Fatalf("response CORS headers: %v", r.Header)
	}
}

func TestBackendDownIs502(t *testing.T) {
	secret := bytes.Repeat([]byte{1}, 32)
	keys, _ := token.NewKeyring(token.Key{Secret: secret})
	dead := httptest.NewServer(http.NotFoundHandler())
	url := "ws" + strings.TrimPrefix(dead.URL, "http")
	dead.Close()
	s, err := New(Config{ID: 1, ListenAddr: "127.0.0.1:0", Advertise: "127.0.0.1:3478", BackendURL: url}, keys, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	api := httptest.NewServer(s.Handler())
	defer api.Close()
	resp := post(t, api.URL+"/v1/calls", "application/sdp", clientOffer(t, true))
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	// The public client learns that the agent is down, not where it runs
	// (the body used to quote the bridge dial error with its URL).
	body, _ := io.ReadAll(resp.Body)
	if hostPort := strings.TrimPrefix(url, "ws://"); bytes.Contains(body, []byte(hostPort)) || bytes.Contains(body, []byte("dial")) ||
		!bytes.Contains(body, []byte("the agent behind this server is unavailable")) {
		t.Errorf("502 body %s: want the agent named unavailable, without %s or the dial error", body, hostPort)
	}
	if s.Sessions() != 0 {
		t.Fatal("a failed offer left a session")
	}
}

func TestConfigValidate(t *testing.T) {
	good := func() Config {
		return Config{ID: 1, Advertise: "127.0.0.1:3478", BackendURL: "ws://127.0.0.1:1/v1/bridge"}
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		mention string
	}{
		{"ok", func(*Config) {}, ""},
		{"no id", func(c *Config) { c.ID = 0 }, "id"},
		{"no advertise", func(c *Config) { c.Advertise = "" }, "advertise"},
		{"unspecified advertise", func(c *Config) { c.Advertise = "0.0.0.0:3478" }, "advertise"},
		{"bad prefix", func(c *Config) { c.AllowRelays = []string{"10.0.0.1"} }, "allow_relays"},
		{"http backend", func(c *Config) { c.BackendURL = "http://x/y" }, "backend_url"},
		{"consent within disconnected", func(c *Config) { c.DisconnectedTimeout, c.ConsentTimeout = 10*time.Second, 10*time.Second }, "consent_timeout"},
		{"check beyond setup", func(c *Config) { c.SetupTimeout, c.CheckTimeout = 5*time.Second, 6*time.Second }, "check_timeout"},
		{"bad trusted proxy", func(c *Config) { c.TrustedProxies = []string{"director"} }, "trusted_proxies"},
		{"output bitrate too low", func(c *Config) { c.OutputBitrate = 500 }, "output_bitrate"},
		{"output queue too short", func(c *Config) { c.OutputQueueMax = time.Millisecond }, "output_queue_max"},
		{"dtls 1.3", func(c *Config) { c.DTLSVersion = "1.3" }, ""},
		{"dtls 1.0", func(c *Config) { c.DTLSVersion = "1.0" }, "dtls_version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.mutate(&c)
			err := c.Validate()
			if tt.mention == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.SetupTimeout == 0 || c.MaxSessions == 0 || c.Cluster == 0 || c.ConsentTimeout != DefaultConsentTimeout ||
					c.DisconnectedTimeout != DefaultDisconnectedTimeout || c.CheckTimeout != DefaultCheckTimeout ||
					c.MaxPending != DefaultMaxPending || c.MaxPendingPerClient != DefaultMaxPendingPerClient ||
					c.OutputBitrate != 32000 || c.OutputQueueMax != time.Minute || c.dtlsVersion == 0 {
					t.Fatalf("defaults not filled: %+v", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %v does not mention %q", err, tt.mention)
			}
		})
	}
}

func keysNow() (t time.Time) { return time.Now() }

func candidates(answer string) []string {
	var out []string
	for _, line := range strings.Split(answer, "\r\n") {
		if strings.HasPrefix(line, "a=candidate:") {
			out = append(out, line)
		}
	}
	return out
}

func TestRegionIngress(t *testing.T) {
	_, api, _ := newTestServer(t, func(c *Config) {
		c.IngressByRegion = map[string]string{"eu": "127.0.0.2:3478", "us": "[::1]:3479"}
	})
	tests := []struct {
		region string
		want   string
	}{
		{"eu", " 127.0.0.2 3478 typ host"},
		{"us", " ::1 3479 typ host"},
		{"mars", " 127.0.0.1 3478 typ host"}, // unknown region: the default ingress
		{"", " 127.0.0.1 3478 typ host"},
	}
	for _, tt := range tests {
		t.Run(tt.region, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, api.URL+"/v1/calls", strings.NewReader(clientOffer(t, true)))
			req.Header.Set("Content-Type", "application/sdp")
			if tt.region != "" {
				req.Header.Set(RegionHeader, tt.region)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			c := candidates(string(body))
			if resp.StatusCode != http.StatusCreated || len(c) != 1 || !strings.Contains(c[0], tt.want) {
				t.Fatalf("status %d, candidates %q, want one with %q", resp.StatusCode, c, tt.want)
			}
		})
	}
}

// TestMaxSessionsUnderConcurrentOffers: offers being answered count
// against MaxSessions, so concurrent offers cannot overshoot it.
func TestMaxSessionsUnderConcurrentOffers(t *testing.T) {
	s, api, _ := newTestServer(t, func(c *Config) { c.MaxSessions = 2 })
	const n = 8
	offers := make([]string, n)
	for i := range offers {
		offers[i] = clientOffer(t, true)
	}
	codes := make(chan int, n)
	for _, o := range offers {
		go func() {
			resp, err := http.Post(api.URL+"/v1/calls", "application/sdp", strings.NewReader(o))
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	got := map[int]int{}
	for range n {
		got[<-codes]++
	}
	if got[http.StatusCreated] > 2 || got[http.StatusCreated]+got[http.StatusServiceUnavailable] != n {
		t.Fatalf("statuses %v: want at most 2 created and the rest 503", got)
	}
	if s.Sessions() > 2 {
		t.Fatalf("%d sessions, cap 2", s.Sessions())
	}
}
