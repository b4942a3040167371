package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// TestManyClientsFromOneAddress: fifty Pion clients on one IP address (an
// office, a carrier-grade NAT) start within one second, or all at the same
// moment, through a relay with the default per-source limits. Every one
// must connect, and no first request may be refused (a held request that
// expired, or one the waiting room had no room for): a Pion client gives
// up a candidate pair after about 1.6 s of unanswered checks, so the relay
// may delay a client with a valid token, never refuse it outright. Before
// the waiting room and the burst of 64 (docs/security.md, "Caps"), the
// clients starting at once were refused (source_rate_limit 4 to 35 and
// source_pending_limit up to 68 per run) and left to their
// retransmissions; against `switchboard demo`, 48 or 49 of 50 connected.
func TestManyClientsFromOneAddress(t *testing.T) {
	for _, spread := range []time.Duration{time.Second, 0} {
		t.Run("within "+spread.String(), func(t *testing.T) { testManyClientsFromOneAddress(t, spread) })
	}
}

func testManyClientsFromOneAddress(t *testing.T, spread time.Duration) {
	s := startStack(t, 6)
	const n = 50
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Gather and build every offer first, so that the POSTs (and the
	// first checks right after them) all fall within one second.
	type client struct {
		pc        *webrtc.PeerConnection
		offer     string
		connected chan struct{}
	}
	clients := make([]*client, n)
	for i := range clients {
		pc := webrtctest.PeerConnection(t)
		if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
			t.Fatal(err)
		}
		if _, err := pc.CreateDataChannel(transceiver.EventsLabel, nil); err != nil {
			t.Fatal(err)
		}
		c := &client{pc: pc, connected: make(chan struct{})}
		var once sync.Once
		pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
			if st == webrtc.PeerConnectionStateConnected {
				once.Do(func() { close(c.connected) })
			}
		})
		c.offer = webrtctest.Offer(t, pc)
		clients[i] = c
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * spread / n)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.signaling.URL+"/v1/calls", strings.NewReader(c.offer))
			req.Header.Set("Content-Type", "application/sdp")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				errs <- &statusError{resp.StatusCode, string(answer)}
				return
			}
			if err := c.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(answer)}); err != nil {
				errs <- err
				return
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("offer: %v", err)
	}
	t.Logf("%d offers answered in %v", n, time.Since(start).Round(time.Millisecond))
	failed := 0
	for i, c := range clients {
		select {
		case <-c.connected:
			continue
		case <-ctx.Done():
		}
		select {
		case <-c.connected:
		default:
			failed++
			t.Errorf("client %d: %v, not connected", i, c.pc.ConnectionState())
		}
	}
	st := s.relay.Stats()
	t.Logf("relay: %d flows created; held %d (admitted %d, expired %d, no room %d); drops: source_rate_delayed %d, source_rate_limit %d, source_pending_limit %d, new_flow_rate_limit %d",
		st.FlowsCreated, st.Held, st.Admitted, st.Expired, st.NotHeld,
		st.Drops[relay.DropSourceRateDelayed], st.Drops[relay.DropSourceRateLimit], st.Drops[relay.DropSourcePendingLimit], st.Drops[relay.DropNewFlowRateLimit])
	if failed > 0 {
		t.Fatalf("%d of %d clients from one address did not connect", failed, n)
	}
	if st.Expired+st.NotHeld != 0 || st.Drops[relay.DropNewFlowRateLimit] != 0 {
		t.Fatalf("first requests refused: %d held ones expired, %d found no room, %d over the overall rate", st.Expired, st.NotHeld, st.Drops[relay.DropNewFlowRateLimit])
	}
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return http.StatusText(e.code) + ": " + e.body }
