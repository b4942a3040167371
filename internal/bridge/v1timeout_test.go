package bridge_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// sendUntilErr sends 64 KiB frames on c with context.Background() until
// a send fails, and returns that error; waitErr bounds the wait.
func sendUntilErr(t *testing.T, send func(bridge.AudioFrame) error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		f := bridge.AudioFrame{Payload: make([]byte, 64<<10)}
		for i := 0; ; i++ {
			f.Seq = uint16(i)
			if err := send(f); err != nil {
				errc <- err
				return
			}
		}
	}()
	return waitErr(t, errc)
}

// recvUntilErr reads c until Recv fails and returns that error.
func recvUntilErr(c interface {
	Recv(context.Context) (bridge.Message, error)
}) error {
	for {
		if _, err := c.Recv(context.Background()); err != nil {
			return err
		}
	}
}

// TestV1WriteTimeout: a v1 backend that stops reading fails the
// transceiver's sends after the Pool's write timeout (ErrClosed, counted
// in WriteTimeouts) and ends the session, instead of blocking its sender
// for as long as TCP keeps the connection (the sender used
// context.Background(), as the transceiver's media path does).
func TestV1WriteTimeout(t *testing.T) {
	release := make(chan struct{})
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{KeepAlive: time.Hour})
		if err != nil {
			t.Errorf("Accept: %v", err)
			return
		}
		defer sc.Close()
		<-release // never reads
	}))
	defer close(release)
	p := bridge.NewPool(url, bridge.PoolOptions{WriteTimeout: 300 * time.Millisecond, KeepAlive: time.Hour})
	t.Cleanup(func() { _ = p.Close() })
	c := poolDial(t, p, "a")
	if n := p.Conns(); n != 0 {
		t.Fatalf("%d v2 connections to a v1 backend, want 0", n)
	}
	err := sendUntilErr(t, func(f bridge.AudioFrame) error { return c.SendAudio(context.Background(), f) })
	if !errors.Is(err, bridge.ErrClosed) || !strings.Contains(err.Error(), "write timeout") {
		t.Errorf("send to a backend that stopped reading: %v, want ErrClosed (write timeout)", err)
	}
	if err := recvUntilErr(c); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("Recv after the write timeout: %v, want ErrClosed", err)
	}
	if n := p.Stats().WriteTimeouts(); n != 1 {
		t.Errorf("WriteTimeouts() = %d, want 1", n)
	}
}

// TestV1AcceptWriteTimeout: the same on the backend side: a transceiver
// that stops reading (its Conn never calls Recv) fails the backend's
// sends after AcceptOptions.WriteTimeout, counted in its Stats.
func TestV1AcceptWriteTimeout(t *testing.T) {
	stats := new(bridge.MuxStats)
	sendErr := make(chan error, 1)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{WriteTimeout: 300 * time.Millisecond, KeepAlive: time.Hour, Stats: stats})
		if err != nil {
			t.Errorf("Accept: %v", err)
			return
		}
		defer sc.Close()
		sendErr <- sendUntilErr(t, func(f bridge.AudioFrame) error { return sc.SendAudio(context.Background(), f) })
	}))
	c := dial(t, url) // never reads
	if err := waitErr(t, sendErr); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("backend send to a transceiver that stopped reading: %v, want ErrClosed", err)
	}
	if n := stats.WriteTimeouts(); n != 1 {
		t.Errorf("WriteTimeouts() = %d, want 1", n)
	}
	_ = c.Close()
}

// TestV1KeepAlive: a v1 connection on which nothing arrives any more (a
// half-open TCP connection) fails once a ping gets no pong, so the
// session ends without traffic of its own; counted in PongTimeouts.
func TestV1KeepAlive(t *testing.T) {
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{KeepAlive: time.Hour, WriteTimeout: time.Hour})
		if err != nil {
			return
		}
		defer sc.Close()
		echoSession(sc)
	}))
	host := strings.SplitN(strings.TrimPrefix(url, "ws://"), "/", 2)[0]
	px := newStallProxy(t, host)
	p := bridge.NewPool(strings.Replace(url, host, px.ln.Addr().String(), 1), bridge.PoolOptions{KeepAlive: 100 * time.Millisecond})
	t.Cleanup(func() { _ = p.Close() })
	c := halfOpen(t, p, px)
	errc := make(chan error, 1)
	go func() { errc <- recvUntilErr(c) }()
	if err := waitErr(t, errc); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("Recv on a half-open v1 connection: %v, want ErrClosed", err)
	}
	if n := p.Stats().PongTimeouts(); n != 1 {
		t.Errorf("PongTimeouts() = %d, want 1", n)
	}
}

// TestV1KeepAliveIdle: an idle v1 session whose backend answers pings
// stays up across keepalive periods: it was pinged idlePings times, and
// still carries audio. The pongs are read by a Recv in progress, as the
// transceiver always has one.
func TestV1KeepAliveIdle(t *testing.T) {
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The backend does not ping: only the transceiver side's pings
		// are counted.
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{KeepAlive: time.Hour})
		if err != nil {
			return
		}
		defer sc.Close()
		echoSession(sc)
	}))
	host := strings.SplitN(strings.TrimPrefix(url, "ws://"), "/", 2)[0]
	px := newStallProxy(t, host)
	p := bridge.NewPool(strings.Replace(url, host, px.ln.Addr().String(), 1), bridge.PoolOptions{KeepAlive: idleKeepAlive})
	t.Cleanup(func() { _ = p.Close() })
	c := poolDial(t, p, "a")
	type result struct {
		m   bridge.Message
		err error
	}
	got := make(chan result, 1)
	go func() {
		m, err := c.Recv(context.Background())
		got <- result{m, err}
	}()
	waitPings(t, px.conn(t, 0), idlePings, p.Stats())
	if err := c.SendAudio(context.Background(), bridge.AudioFrame{Seq: 1, Payload: []byte("after idle")}); err != nil {
		t.Fatalf("SendAudio after idle keepalives: %v", err)
	}
	select {
	case r := <-got:
		if r.err != nil || r.m.Audio == nil || string(r.m.Audio.Payload) != "after idle" {
			t.Fatalf("Recv after idle keepalives: %+v, %v", r.m, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no echo after idle keepalives")
	}
	if n := p.Stats().PongTimeouts(); n != 0 {
		t.Errorf("PongTimeouts() = %d, want 0", n)
	}
}
