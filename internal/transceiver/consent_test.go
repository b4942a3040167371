package transceiver

import (
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
)

// cuttableConn is a client's UDP socket whose sends can be cut, as if the
// client had lost its network.
type cuttableConn struct {
	net.PacketConn
	cut atomic.Bool
}

func (c *cuttableConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if c.cut.Load() {
		return len(b), nil
	}
	return c.PacketConn.WriteTo(b, addr)
}

// cuttablePeer returns a Pion client whose UDP traffic goes through one
// cuttable socket.
func cuttablePeer(t *testing.T) (*webrtc.PeerConnection, *cuttableConn) {
	t.Helper()
	udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conn := &cuttableConn{PacketConn: udp}
	mux := ice.NewUDPMuxDefault(ice.UDPMuxParams{UDPConn: conn})
	t.Cleanup(func() { _ = mux.Close() })
	var se webrtc.SettingEngine
	// Consent checks every 500 ms, so that a test's disconnected timeout
	// of 2 s sees no silence while the client is there.
	se.SetICETimeouts(5*time.Second, 25*time.Second, 500*time.Millisecond)
	se.SetICEUDPMux(mux)
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	pc, err := webrtc.NewAPI(webrtc.WithSettingEngine(se)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc, conn
}

// stateBackend is a bridge backend that records, per session, the
// connection states and the end reason it is told, with when.
type stateBackend struct {
	mu     sync.Mutex
	seen   []string
	at     []time.Time
	notify chan struct{}
}

func newStateBackend(t *testing.T) (*stateBackend, string) {
	b := &stateBackend{notify: make(chan struct{}, 16)}
	url := backendFunc(t, func(sc *bridge.ServerConn) {
		defer sc.Close()
		for {
			m, err := sc.Recv(t.Context())
			switch {
			case err != nil:
				return
			case m.Connection != nil:
				b.add(m.Connection.State)
			case m.End != nil:
				b.add("end:" + m.End.Reason)
				_ = sc.End(t.Context(), m.End.Reason)
				return
			}
		}
	})
	return b, url
}

func (b *stateBackend) add(s string) {
	b.mu.Lock()
	b.seen, b.at = append(b.seen, s), append(b.at, time.Now())
	b.mu.Unlock()
	b.notify <- struct{}{}
}

// wait waits for the backend's nth message (1-based) and returns it with
// when it came.
func (b *stateBackend) wait(t *testing.T, n int, within time.Duration) (string, time.Time) {
	t.Helper()
	deadline := time.After(within)
	for {
		b.mu.Lock()
		if len(b.seen) >= n {
			s, at := b.seen[n-1], b.at[n-1]
			b.mu.Unlock()
			return s, at
		}
		b.mu.Unlock()
		select {
		case <-b.notify:
		case <-deadline:
			b.mu.Lock()
			defer b.mu.Unlock()
			t.Fatalf("the backend got %q, not %d messages, within %v", b.seen, n, within)
		}
	}
}

// connectCuttable connects a cuttable Pion client to the transceiver at api.
func connectCuttable(t *testing.T, api string) *cuttableConn {
	t.Helper()
	pc, conn := cuttablePeer(t)
	connected := make(chan struct{})
	var once sync.Once
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		if st == webrtc.PeerConnectionStateConnected {
			once.Do(func() { close(connected) })
		}
	})
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.CreateDataChannel(EventsLabel, nil); err != nil {
		t.Fatal(err)
	}
	resp := post(t, api+"/v1/calls", "application/sdp", webrtctest.Offer(t, pc))
	answer := readAll(t, resp.Body)
	if resp.StatusCode != 201 {
		t.Fatalf("offer: %d %s", resp.StatusCode, answer)
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, connected, 10*time.Second, "the client's connection")
	return conn
}

// TestVanishedClient: a client whose traffic stops is reported to the
// backend as disconnected, then its session ends with ice_failed; one
// whose traffic resumes in time is reported connected again.
func TestVanishedClient(t *testing.T) {
	t.Run("gone", func(t *testing.T) {
		b, url := newStateBackend(t)
		s, api := directServer(t, func(c *Config) {
			c.BackendURL, c.DisconnectedTimeout, c.ConsentTimeout = url, 2*time.Second, 4*time.Second
		})
		conn := connectCuttable(t, api)
		conn.cut.Store(true)
		if st, _ := b.wait(t, 1, 10*time.Second); st != bridge.StateDisconnected {
			t.Fatalf("first message %q, want %q", st, bridge.StateDisconnected)
		}
		if st, _ := b.wait(t, 2, 10*time.Second); st != "end:"+bridge.ReasonICEFailed {
			t.Fatalf("second message %q, want end:%s", st, bridge.ReasonICEFailed)
		}
		if n := testutil.ToFloat64(s.metrics.clientConnection.WithLabelValues(bridge.StateDisconnected)); n != 1 {
			t.Fatalf("client_connection_total{state=disconnected} = %v, want 1", n)
		}
	})
	t.Run("back", func(t *testing.T) {
		b, url := newStateBackend(t)
		s, api := directServer(t, func(c *Config) {
			c.BackendURL, c.DisconnectedTimeout, c.ConsentTimeout = url, 2*time.Second, 20*time.Second
		})
		conn := connectCuttable(t, api)
		conn.cut.Store(true)
		if st, _ := b.wait(t, 1, 10*time.Second); st != bridge.StateDisconnected {
			t.Fatalf("first message %q, want %q", st, bridge.StateDisconnected)
		}
		conn.cut.Store(false) // the client's consent checks reach us again
		if st, _ := b.wait(t, 2, 10*time.Second); st != bridge.StateConnected {
			t.Fatalf("second message %q, want %q", st, bridge.StateConnected)
		}
		if s.Sessions() != 1 {
			t.Fatal("the session ended although its client came back")
		}
	})
}

// TestVanishedClientDefaults measures, with the default bounds, how long
// after a client's traffic stops the backend is told and the session
// ends. It takes over 30 s, so it runs only with SWITCHBOARD_MEASURE=1.
func TestVanishedClientDefaults(t *testing.T) {
	if os.Getenv("SWITCHBOARD_MEASURE") == "" {
		t.Skip("set SWITCHBOARD_MEASURE=1 to measure (takes over 30 s)")
	}
	b, url := newStateBackend(t)
	_, api := directServer(t, func(c *Config) { c.BackendURL = url })
	conn := connectCuttable(t, api)
	time.Sleep(3 * time.Second) // a settled call: consent checks flowing
	cut := time.Now()
	conn.cut.Store(true)
	st1, at1 := b.wait(t, 1, 60*time.Second)
	st2, at2 := b.wait(t, 2, 60*time.Second)
	t.Logf("traffic cut → backend told %q after %v; → %q after %v", st1, at1.Sub(cut).Round(10*time.Millisecond), st2, at2.Sub(cut).Round(10*time.Millisecond))
}
