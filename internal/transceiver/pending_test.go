package transceiver

import (
	"encoding/json"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/httpapi"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
)

// countingBackend is a bridge backend that counts open sessions and the
// reasons they ended with.
type countingBackend struct {
	open    atomic.Int64
	mu      sync.Mutex
	reasons map[string]int
}

func newCountingBackend(t *testing.T) (*countingBackend, string) {
	b := &countingBackend{reasons: map[string]int{}}
	url := backendFunc(t, func(sc *bridge.ServerConn) {
		b.open.Add(1)
		defer b.open.Add(-1)
		defer sc.Close()
		for {
			m, err := sc.Recv(t.Context())
			if err != nil {
				return
			}
			if m.End != nil {
				b.mu.Lock()
				b.reasons[m.End.Reason]++
				b.mu.Unlock()
				_ = sc.End(t.Context(), m.End.Reason)
				return
			}
		}
	})
	return b, url
}

func (b *countingBackend) ended(reason string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reasons[reason]
}

// offerFrom posts an offer as if from client ip, through a trusted proxy
// at 127.0.0.1 that names it in X-Forwarded-For; ip "" posts directly.
func offerFrom(t *testing.T, url, ip, offer string) (int, httpapi.Error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/calls", strings.NewReader(offer))
	req.Header.Set("Content-Type", "application/sdp")
	if ip != "" {
		req.Header.Set("X-Forwarded-For", "203.0.113.250, "+ip)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e httpapi.Error
	if resp.StatusCode >= 400 {
		_ = json.NewDecoder(resp.Body).Decode(&e)
		if resp.Header.Get("Retry-After") == "" && resp.StatusCode != http.StatusBadRequest {
			t.Errorf("status %d without Retry-After", resp.StatusCode)
		}
	}
	return resp.StatusCode, e
}

// TestPendingBounds: sessions not yet connected are bounded per client
// address (429) and in total (503), each refusal counted; sessions that
// receive no authenticated check end with no_check, releasing their
// backend sessions and their slots; a connected session is not pending.
func TestPendingBounds(t *testing.T) {
	b, backend := newCountingBackend(t)
	s, url := directServer(t, func(c *Config) {
		c.BackendURL, c.MaxPendingPerClient, c.MaxPending, c.CheckTimeout = backend, 2, 5, time.Second
		c.TrustedProxies = []string{"127.0.0.0/8"}
	})
	offer := clientOffer(t, true) // never connects: nobody applies the answer
	for _, tt := range []struct {
		ip   string
		want int
		code string
	}{
		{"198.51.100.1", http.StatusCreated, ""},
		{"198.51.100.1", http.StatusCreated, ""},
		{"198.51.100.1", http.StatusTooManyRequests, "too_many_pending"},
		{"2001:db8:1:2::1", http.StatusCreated, ""},
		{"2001:db8:1:2::99", http.StatusCreated, ""}, // the same /64
		{"2001:db8:1:2::7", http.StatusTooManyRequests, "too_many_pending"},
		{"198.51.100.2", http.StatusCreated, ""},
		{"198.51.100.3", http.StatusServiceUnavailable, "unavailable"}, // 5 pending in total
	} {
		if got, e := offerFrom(t, url, tt.ip, offer); got != tt.want || e.Error.Code != tt.code {
			t.Fatalf("offer from %s: %d %+v, want %d %s", tt.ip, got, e.Error, tt.want, tt.code)
		}
	}
	refused := func(r string) float64 { return testutil.ToFloat64(s.metrics.offersRefused.WithLabelValues(r)) }
	if refused(refusedPendingClient) != 2 || refused(refusedPendingTotal) != 1 {
		t.Fatalf("refused: %v per client, %v in total; want 2 and 1", refused(refusedPendingClient), refused(refusedPendingTotal))
	}
	if s.Pending() != 5 {
		t.Fatalf("%d pending, want 5", s.Pending())
	}
	// No check comes: after CheckTimeout all five end and free their slots.
	deadline := time.Now().Add(15 * time.Second)
	for (s.Sessions() > 0 || b.open.Load() > 0) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if s.Sessions() != 0 || s.Pending() != 0 || b.ended(bridge.ReasonNoCheck) != 5 || b.open.Load() != 0 {
		t.Fatalf("after the check timeout: %d sessions, %d pending, backend told no_check %d times, %d backend sessions open",
			s.Sessions(), s.Pending(), b.ended(bridge.ReasonNoCheck), b.open.Load())
	}
	// Each is a setup failure at the first phase (issue 28: a firewall
	// shows as ice/no_check, not as a bare setup timeout).
	if n := testutil.ToFloat64(s.metrics.setupFailures.WithLabelValues(phaseICE, failNoCheck)); n != 5 {
		t.Fatalf("setup failures ice/no_check: %v, want 5", n)
	}
	// A client that connects leaves the pending count, and having checked
	// it outlives the check timeout.
	c := dialLive(t, url, nil)
	waitFor(t, c.connected, 10*time.Second, "the client's connection")
	for deadline := time.Now().Add(10 * time.Second); s.Pending() != 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if s.Pending() != 0 {
		t.Fatalf("%d pending with one connected session, want 0", s.Pending())
	}
	time.Sleep(s.cfg.CheckTimeout + 500*time.Millisecond)
	if s.Sessions() != 1 || b.ended(bridge.ReasonNoCheck) != 5 {
		t.Fatalf("%d sessions, %d ended no_check: a session that checked was ended", s.Sessions(), b.ended(bridge.ReasonNoCheck))
	}
}

// TestUnconnectedOfferFlood measures what 200 offers from one address
// that never send a check hold, and for how long, with the default bounds
// and, as the baseline, with them lifted (the behaviour before them: no
// per-address bound, ended only by the 30 s setup timeout). Run with
// SWITCHBOARD_MEASURE=1.
func TestUnconnectedOfferFlood(t *testing.T) {
	if os.Getenv("SWITCHBOARD_MEASURE") == "" {
		t.Skip("set SWITCHBOARD_MEASURE=1 to measure")
	}
	for _, tt := range []struct {
		name   string
		mutate func(*Config)
	}{
		{"defaults", func(*Config) {}},
		{"unbounded", func(c *Config) { c.MaxPendingPerClient, c.CheckTimeout = 1000, 30*time.Second }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, backend := newCountingBackend(t)
			s, url := directServer(t, func(c *Config) { c.BackendURL = backend }, tt.mutate)
			offers := make([]string, 200)
			for i := range offers {
				offers[i] = webrtctest.AudioOffer(t, true, true)
			}
			runtime.GC()
			var m0 runtime.MemStats
			runtime.ReadMemStats(&m0)
			g0 := runtime.NumGoroutine()
			codes := map[int]int{}
			start := time.Now()
			for _, o := range offers {
				code, _ := offerFrom(t, url, "", o)
				codes[code]++
			}
			runtime.GC()
			var m1 runtime.MemStats
			runtime.ReadMemStats(&m1)
			g1 := runtime.NumGoroutine()
			held, pend := b.open.Load(), s.Pending()
			for s.Sessions() > 0 || b.open.Load() > 0 {
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("%s: 200 offers from one address, no checks: statuses %v; %d pending, %d backend sessions, +%d goroutines, +%.1f MB heap; all released %v after the first offer",
				tt.name, codes, pend, held, g1-g0, float64(int64(m1.HeapInuse)-int64(m0.HeapInuse))/1e6, time.Since(start).Round(100*time.Millisecond))
		})
	}
}
