package transceiver

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// echoEvents connects a live call and checks that an event comes back
// through the echo backend.
func echoEvents(t *testing.T, api, tag string) *liveCall {
	t.Helper()
	c := dialLive(t, api, nil)
	got := make(chan string, 4)
	c.dc.OnMessage(func(m webrtc.DataChannelMessage) { got <- string(m.Data) })
	waitFor(t, c.dcOpen, 20*time.Second, tag+": data channel open")
	want := fmt.Sprintf(`{"type":"ping","id":%q}`, tag)
	if err := c.dc.SendText(want); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m != want {
			t.Fatalf("%s: echo %q, want %q", tag, m, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no echo", tag)
	}
	return c
}

// TestBridgeV2SharedConnection: sessions to a v2 backend (the echo agent)
// share one bridge connection; when it drops, every session on it ends
// with backend_gone.
func TestBridgeV2SharedConnection(t *testing.T) {
	var (
		mu     sync.Mutex
		conns  []net.Conn
		served sync.WaitGroup
	)
	echo := agent.NewEcho(slog.New(slog.DiscardHandler))
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		defer served.Done()
		echo.ServeHTTP(w, r)
	}))
	backend.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateHijacked {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}
	backend.Start()
	t.Cleanup(func() { backend.Close(); served.Wait() })
	s, api := directServer(t, func(c *Config) {
		c.BackendURL = "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge"
	})
	const n = 3
	for i := range n {
		c := echoEvents(t, api, fmt.Sprint("call-", i))
		t.Cleanup(func() { _ = c.pc.Close() })
	}
	if got := s.bridges.Conns(); got != 1 {
		t.Errorf("%d sessions on %d bridge v2 connections, want 1", n, got)
	}
	if s.bridges.Stats().Records() == 0 {
		t.Error("no bridge v2 records written")
	}
	mu.Lock()
	for _, c := range conns {
		_ = c.Close() // the backend's process dies
	}
	mu.Unlock()
	gone := s.metrics.sessionsEnded.WithLabelValues(bridge.ReasonBackendGone)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for testutil.ToFloat64(gone) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("%v of %d sessions ended backend_gone after the bridge connection dropped", testutil.ToFloat64(gone), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if s.bridges.Conns() != 0 {
		t.Errorf("%d bridge v2 connections after the drop, want 0", s.bridges.Conns())
	}
}

// TestBridgeV1Backend: a backend that speaks only v1 gets one WebSocket
// per session, as before v2.
func TestBridgeV1Backend(t *testing.T) {
	url := backendFunc(t, func(sc *bridge.ServerConn) {
		defer sc.Close()
		ctx := context.Background()
		for {
			m, err := sc.Recv(ctx)
			if err != nil || m.End != nil {
				return
			}
			if m.Event != nil && sc.SendEvent(ctx, m.Event) != nil {
				return
			}
		}
	})
	s, api := directServer(t, func(c *Config) { c.BackendURL = url })
	for i := range 2 {
		c := echoEvents(t, api, fmt.Sprint("v1-", i))
		t.Cleanup(func() { _ = c.pc.Close() })
	}
	if got := s.bridges.Conns(); got != 0 {
		t.Errorf("%d bridge v2 connections to a v1 backend, want 0", got)
	}
}

// stalledV2Backend is a raw bridge v2 backend that answers the
// connection hello and each session's hello, then, once a session.start
// has arrived, stops reading (a backend whose event loop is stuck). It
// returns the URL; started is closed at the first session.start.
func stalledV2Backend(t *testing.T) (url string, started <-chan struct{}) {
	t.Helper()
	stop, st := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{bridge.SubprotocolV2}})
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		if _, _, err := ws.Read(ctx); err != nil { // the connection hello
			return
		}
		if ws.Write(ctx, websocket.MessageBinary, bridge.AppendRecord(nil, 0, bridge.RecordText, []byte(`{"type":"hello","version":2}`))) != nil {
			return
		}
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			for len(b) > 0 {
				rec, rest, err := bridge.ParseRecord(b)
				if err != nil {
					return
				}
				b = rest
				switch {
				case bytes.Contains(rec.Payload, []byte(`"type":"hello"`)):
					hello := fmt.Sprintf(`{"type":"hello","version":%d,"audio_format":%q}`, bridge.Version, bridge.FormatOpus)
					if ws.Write(ctx, websocket.MessageBinary, bridge.AppendRecord(nil, rec.Session, bridge.RecordText, []byte(hello))) != nil {
						return
					}
				case bytes.Contains(rec.Payload, []byte(`"type":"session.start"`)):
					once.Do(func() { close(st) })
					<-stop // never read again
					return
				}
			}
		}
	}))
	t.Cleanup(func() { close(stop); srv.Close() })
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/bridge", st
}

// TestCloseStalledV2Backend: Server.Close returns while a session's
// bridge sends are blocked on a v2 backend that stopped reading (review
// T1: teardown's End waited for the blocked send forever, and so did
// Close). The client floods the events channel until the bridge's
// records stop moving (TCP buffers full), then the server closes.
func TestCloseStalledV2Backend(t *testing.T) {
	url, started := stalledV2Backend(t)
	s, api := directServer(t, func(c *Config) { c.BackendURL = url })
	c := dialLive(t, api, nil)
	t.Cleanup(func() { _ = c.pc.Close() })
	waitFor(t, c.dcOpen, 20*time.Second, "data channel open")
	waitFor(t, started, 20*time.Second, "session.start at the backend")
	pad := strings.Repeat("x", 30<<10)
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		for i := 0; i < 1000; i++ { // 30 MB, far beyond the socket buffers
			if c.dc.SendText(fmt.Sprintf(`{"type":"x","i":%d,"pad":%q}`, i, pad)) != nil {
				return
			}
		}
	}()
	// Wait until the bridge stops taking records: its send is blocked.
	last, since := uint64(0), time.Now()
	for time.Since(since) < 1500*time.Millisecond {
		time.Sleep(100 * time.Millisecond)
		if n := s.bridges.Stats().Records(); n != last {
			last, since = n, time.Now()
		}
	}
	t.Logf("bridge records before the stall: %d", last)
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	waitFor(t, closed, 30*time.Second, "Server.Close with a stalled v2 backend")
	_ = c.pc.Close()
	<-flood
}
