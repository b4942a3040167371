package bridge_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// stallProxy forwards TCP connections to a backend and can stall each
// one: stop reading what the client sends (a backend that stops reading),
// and stop forwarding what the backend sends (a half-open connection).
// It counts the WebSocket pings the client sends.
type stallProxy struct {
	ln   net.Listener
	quit chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns []*proxied
}

type proxied struct {
	up, down atomic.Bool // stalled: client → backend, backend → client
	c, b     net.Conn
	upFrames frameScanner // client → backend
}

// frameScanner follows the WebSocket frames (RFC 6455 §5.2) that a
// client sends, after skipping its HTTP upgrade request (up to the blank
// line that ends it; a client sends no frame before the response), and
// counts the ping frames (opcode 0x9).
type frameScanner struct {
	pings atomic.Int64

	// Owned by the pipe goroutine.
	upgraded bool   // the HTTP request ended: frames follow
	http     []byte // the HTTP request's last 4 bytes
	hdr      []byte // the current frame's header bytes so far
	skip     uint64 // payload bytes of the current frame still to skip
}

// feed scans the next bytes of the stream.
func (s *frameScanner) feed(b []byte) {
	for len(b) > 0 {
		if !s.upgraded {
			s.http = append(s.http, b[0])
			b = b[1:]
			if len(s.http) > 4 {
				s.http = s.http[1:]
			}
			s.upgraded = string(s.http) == "\r\n\r\n"
			continue
		}
		if s.skip > 0 {
			n := min(uint64(len(b)), s.skip)
			s.skip -= n
			b = b[n:]
			continue
		}
		s.hdr = append(s.hdr, b[0])
		b = b[1:]
		need := 2
		if len(s.hdr) >= 2 {
			switch s.hdr[1] & 0x7f {
			case 126:
				need += 2
			case 127:
				need += 8
			}
			if s.hdr[1]&0x80 != 0 { // masked: a 4-byte key
				need += 4
			}
		}
		if len(s.hdr) < need {
			continue
		}
		n := uint64(s.hdr[1] & 0x7f)
		switch n {
		case 126:
			n = uint64(binary.BigEndian.Uint16(s.hdr[2:]))
		case 127:
			n = binary.BigEndian.Uint64(s.hdr[2:])
		}
		if s.hdr[0]&0x0f == 0x9 {
			s.pings.Add(1)
		}
		s.hdr, s.skip = s.hdr[:0], n
	}
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, quit: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			pc := &proxied{c: c, b: b}
			p.mu.Lock()
			p.conns = append(p.conns, pc)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(pc, b, c, &pc.down, nil)
			go p.pipe(pc, c, b, &pc.up, &pc.upFrames)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		close(p.quit)
		p.mu.Lock()
		for _, pc := range p.conns {
			_ = pc.c.Close()
			_ = pc.b.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// pipe copies from src to dst, not reading src while stalled is set;
// scan, when set, follows the frames.
func (p *stallProxy) pipe(pc *proxied, src, dst net.Conn, stalled *atomic.Bool, scan *frameScanner) {
	defer p.wg.Done()
	defer func() { _ = pc.c.Close(); _ = pc.b.Close() }()
	buf := make([]byte, 4096)
	for {
		for stalled.Load() {
			select {
			case <-p.quit:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if scan != nil {
			scan.feed(buf[:n])
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// conn returns the i-th proxied connection.
func (p *stallProxy) conn(t *testing.T, i int) *proxied {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if i >= len(p.conns) {
		t.Fatalf("proxy has %d connections, want connection %d", len(p.conns), i)
	}
	return p.conns[i]
}

// proxiedV2 serves the echo session over Serve behind a stallProxy and
// returns a Pool with opts dialing through the proxy.
func proxiedV2(t *testing.T, opts bridge.PoolOptions) (*bridge.Pool, *stallProxy) {
	// The backend never pings: only the transceiver side may find a
	// stall.
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = bridge.Serve(w, r, bridge.AcceptOptions{KeepAlive: time.Hour, WriteTimeout: time.Hour}, echoSession)
	}))
	host := strings.SplitN(strings.TrimPrefix(url, "ws://"), "/", 2)[0]
	px := newStallProxy(t, host)
	p := bridge.NewPool(strings.Replace(url, host, px.ln.Addr().String(), 1), opts)
	t.Cleanup(func() { _ = p.Close() })
	return p, px
}

// sendUntilStalled sends 1000-byte frames on c with
// context.Background() from a goroutine, and returns once no send has
// completed for 1.5 s (the backend's socket buffers are full); the
// channel gets the error that ends the sends.
func sendUntilStalled(t *testing.T, c *bridge.Conn) <-chan error {
	t.Helper()
	var sent atomic.Int64
	errc := make(chan error, 1)
	go func() {
		payload := make([]byte, 1000)
		for i := 0; ; i++ {
			if err := c.SendAudio(context.Background(), bridge.AudioFrame{Seq: uint16(i), Payload: payload}); err != nil {
				errc <- err
				return
			}
			sent.Add(1)
		}
	}()
	last, since := int64(-1), time.Now()
	for time.Since(since) < 1500*time.Millisecond {
		select {
		case err := <-errc:
			t.Fatalf("sender returned before stalling: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if n := sent.Load(); n != last {
			last, since = n, time.Now()
		}
	}
	return errc
}

// waitErr waits for the end of a send or End; 20 s is far beyond any slowness
// of a loaded machine (the send ends at once, or never without the fix).
func waitErr(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the blocked send did not return")
		return nil
	}
}

// stalledV2 dials session id on a proxiedV2 pool whose write timeout
// and keepalive are an hour away, stops the proxy forwarding its
// connection's client-to-backend bytes, and fills that direction with
// sendUntilStalled; it returns the pool, the session and the channel
// that gets the error ending the stalled sends.
func stalledV2(t *testing.T, id string) (*bridge.Pool, *bridge.Conn, <-chan error) {
	t.Helper()
	p, px := proxiedV2(t, bridge.PoolOptions{WriteTimeout: time.Hour, KeepAlive: time.Hour})
	c := poolDial(t, p, id)
	px.conn(t, 0).up.Store(true)
	return p, c, sendUntilStalled(t, c)
}

// halfOpen dials session "a" on p, checks that 3 messages echo through
// px's first connection, then stops that connection forwarding in both
// directions, as a backend host that is gone leaves it.
func halfOpen(t *testing.T, p *bridge.Pool, px *stallProxy) *bridge.Conn {
	t.Helper()
	c := poolDial(t, p, "a")
	if err := exchange(testCtx(t), c, "a", 3); err != nil {
		t.Fatal(err)
	}
	pc := px.conn(t, 0)
	pc.up.Store(true)
	pc.down.Store(true)
	return c
}

// TestV2EndUnblocksStalledSend: End must return, and free the session's
// send blocked on a backend that stopped reading, when its ctx ends
// (review B0: End used to wait for the blocked send forever). The write
// timeout is out of reach here, so only End can free the sender.
func TestV2EndUnblocksStalledSend(t *testing.T) {
	p, c, sendErr := stalledV2(t, "x")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	endErr := make(chan error, 1)
	go func() { endErr <- c.End(ctx, bridge.ReasonClientHangup) }()
	if err := waitErr(t, endErr); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("End with a send blocked: %v, want ErrClosed", err)
	}
	if err := waitErr(t, sendErr); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("blocked send after End: %v, want ErrClosed", err)
	}
	// Pool.Close ends the connection whose write is still stuck.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestV2CloseUnblocksStalledSend: the same with Close.
func TestV2CloseUnblocksStalledSend(t *testing.T) {
	_, c, sendErr := stalledV2(t, "x")
	_ = c.Close()
	if err := waitErr(t, sendErr); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("blocked send after Close: %v, want ErrClosed", err)
	}
}

// TestV2WriteTimeout: a backend that stops reading one connection fails
// it after the write timeout: every session on it ends with ErrClosed
// (senders and readers), and a new Dial gets a fresh connection (review
// B1).
func TestV2WriteTimeout(t *testing.T) {
	p, px := proxiedV2(t, bridge.PoolOptions{WriteTimeout: 300 * time.Millisecond, KeepAlive: time.Hour})
	a, b := poolDial(t, p, "a"), poolDial(t, p, "b")
	if n := p.Conns(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	px.conn(t, 0).up.Store(true)
	errc := make(chan error, 2)
	for _, c := range []*bridge.Conn{a, b} {
		go func() {
			payload := make([]byte, 1000)
			for i := 0; ; i++ {
				if err := c.SendAudio(context.Background(), bridge.AudioFrame{Seq: uint16(i), Payload: payload}); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	for range 2 {
		if err := <-errc; !errors.Is(err, bridge.ErrClosed) {
			t.Errorf("send on the stalled connection: %v, want ErrClosed", err)
		}
	}
	// Counted before the sessions end.
	if n := p.Stats().WriteTimeouts(); n != 1 {
		t.Errorf("WriteTimeouts() = %d, want 1", n)
	}
	for _, c := range []*bridge.Conn{a, b} {
		for {
			_, err := c.Recv(context.Background())
			if err != nil {
				if !errors.Is(err, bridge.ErrClosed) {
					t.Errorf("Recv on the failed connection: %v, want ErrClosed", err)
				}
				break
			}
		}
	}
	c := poolDial(t, p, "c")
	if err := exchange(testCtx(t), c, "c", 10); err != nil {
		t.Fatal(err)
	}
}

// TestV2PickSkipsStuckConnection: while a connection's write is stuck
// (before its write timeout), new sessions go to a new connection rather
// than waiting behind it (review B1).
func TestV2PickSkipsStuckConnection(t *testing.T) {
	p, a, sendErr := stalledV2(t, "a")
	c := poolDial(t, p, "c")
	if n := p.Conns(); n != 2 {
		t.Errorf("%d connections, want 2 (a new one next to the stuck one)", n)
	}
	if err := exchange(testCtx(t), c, "c", 10); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	if err := waitErr(t, sendErr); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("blocked send after Close: %v, want ErrClosed", err)
	}
}

// TestV2KeepAlive: a connection on which nothing arrives any more (a
// half-open TCP connection: the backend's host is gone) fails once a ping
// gets no pong, so its sessions end without any traffic of their own
// (review B1).
func TestV2KeepAlive(t *testing.T) {
	p, px := proxiedV2(t, bridge.PoolOptions{KeepAlive: 100 * time.Millisecond})
	c := halfOpen(t, p, px)
	if _, err := c.Recv(context.Background()); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("Recv on a half-open connection: %v, want ErrClosed", err)
	}
	// Counted before the sessions end.
	if n := p.Stats().PongTimeouts(); n != 1 {
		t.Errorf("PongTimeouts() = %d, want 1", n)
	}
}

// The keepalive of the idle tests: long enough that a pong read late by
// a goroutine scheduled late (-race on a loaded machine) is still in
// time, short enough for a test of about a second.
const (
	idleKeepAlive = 250 * time.Millisecond
	// idlePings the transceiver side must have sent on an idle
	// connection: it sends each ping once the previous one's pong came
	// back (or fails the connection), so the connection lived through
	// idlePings−1 keepalive round trips.
	idlePings = 4
)

// waitPings waits until the client of pc has sent n WebSocket pings (20 s
// bounds the wait: a connection that was dropped sends no more).
func waitPings(t *testing.T, pc *proxied, n int64, stats *bridge.MuxStats) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for pc.upFrames.pings.Load() < n {
		if stats.PongTimeouts() != 0 {
			t.Fatalf("the idle connection was dropped after %d keepalive pings: PongTimeouts %d",
				pc.upFrames.pings.Load(), stats.PongTimeouts())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keepalive pings on the idle connection in 20 s, want %d (dropped? PongTimeouts %d)",
				pc.upFrames.pings.Load(), n, stats.PongTimeouts())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestV2KeepAliveIdle: an idle connection whose peer answers pings stays
// up across keepalive periods: it was pinged idlePings times, and still
// carries a session.
func TestV2KeepAliveIdle(t *testing.T) {
	p, px := proxiedV2(t, bridge.PoolOptions{KeepAlive: idleKeepAlive})
	c := poolDial(t, p, "a")
	waitPings(t, px.conn(t, 0), idlePings, p.Stats())
	if err := exchange(testCtx(t), c, "a", 3); err != nil {
		t.Fatalf("after idle keepalives: %v", err)
	}
	if n := p.Stats().PongTimeouts(); n != 0 {
		t.Errorf("PongTimeouts() = %d, want 0", n)
	}
}

// TestV2ConnQueueLimit: sessions whose backend handlers do not read,
// each below SessionQueueLimit, together pass ConnQueueLimit: the
// receiver ends the session with the largest queue (4003, queue_full)
// rather than holding every session's 4 MiB (review B2).
func TestV2ConnQueueLimit(t *testing.T) {
	stats := new(bridge.MuxStats)
	stop := make(chan struct{})
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = bridge.Serve(w, r, bridge.AcceptOptions{Stats: stats}, func(*bridge.ServerConn) { <-stop })
	}))
	t.Cleanup(func() { close(stop) })
	p := newPool(t, url, 0)
	sessions, frames, payload := overConnLimit(t)
	ctx := budgetCtx(t)
	for i, c := range dialOneConn(t, p, sessionIDs(sessions)...) {
		for j := range frames {
			err := c.SendAudio(ctx, bridge.AudioFrame{Seq: uint16(j), Payload: payload})
			if err == nil {
				continue
			}
			// Only the backend's budget may end the sends: its close
			// record arrived.
			if code := websocket.CloseStatus(err); code != bridge.CloseQueueFull {
				t.Fatalf("session %d frame %d: %v, want close code %d", i, j, err, bridge.CloseQueueFull)
			}
			break
		}
	}
	// The backend counts the drop once its read loop gets that far.
	for stats.Drops(bridge.DropQueueFull) == 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("queue_full %d after %d MiB queued on one connection, want ≥ 1", stats.Drops(bridge.DropQueueFull), sessions*frames*len(payload)>>20)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
