package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// DefaultSessionsPerConn is PoolOptions.SessionsPerConn's default: a v2
// connection carries up to 128 sessions before the pool opens another.
// More sessions per connection mean more frames per write; fewer mean
// less head-of-line blocking on one TCP stream. At 50 frames a second
// each way, 128 sessions are 6 400 frames a second per connection.
const DefaultSessionsPerConn = 128

// PoolOptions configures a Pool. The zero value is ready to use.
type PoolOptions struct {
	// SessionsPerConn is how many sessions one v2 connection carries
	// before the pool dials another. Default DefaultSessionsPerConn.
	SessionsPerConn int
	// HTTPClient dials the WebSocket upgrade; nil means
	// http.DefaultClient.
	HTTPClient *http.Client
	// WriteTimeout bounds each write of a batch on a v2 connection, and
	// of a message on a v1 one; on expiry the connection fails and its
	// sessions end (ErrClosed), counted in Stats().WriteTimeouts. Default
	// DefaultWriteTimeout. A v2 connection whose write has been in flight
	// for a quarter of it (at most 1 s) gets no new sessions.
	WriteTimeout time.Duration
	// KeepAlive is how long a connection, v1 or v2, may receive nothing
	// before it is pinged, and how long the pong may take before the
	// connection fails (counted in Stats().PongTimeouts). Default
	// DefaultKeepAlive.
	KeepAlive time.Duration
}

// Pool opens bridge sessions to one backend URL: over shared v2
// connections when the backend selects SubprotocolV2, else one v1
// WebSocket per session exactly as Dial does. The transceiver keeps one
// Pool per backend URL.
//
// Each connection the Pool dials offers SubprotocolV2 then Subprotocol.
// A v2 connection is closed (with 1000, after its last records) when its
// last session ends, and lost with all its sessions when it drops: their
// Recv returns ErrClosed, as for a dropped v1 connection; nothing is
// retried (docs/bridge.md §12.5).
type Pool struct {
	// Set once.
	url   string
	opts  PoolOptions
	stats MuxStats

	mu      sync.Mutex
	conns   map[*muxConn]int      // live sessions per v2 connection not draining; guarded by mu
	open    map[*muxConn]struct{} // every v2 connection not yet failed, draining ones too; guarded by mu
	dialing chan struct{}         // closed when the v2 dial in progress is done; guarded by mu
	v1      bool                  // the last connection dialed chose v1; guarded by mu
	closed  bool                  // guarded by mu
	all     sync.WaitGroup        // every v2 connection's loops
}

// NewPool returns a Pool for the backend at url (ws://, wss://, http://
// or https://). It dials nothing until Dial.
func NewPool(url string, opts PoolOptions) *Pool {
	if opts.SessionsPerConn <= 0 {
		opts.SessionsPerConn = DefaultSessionsPerConn
	}
	return &Pool{url: url, opts: opts, conns: make(map[*muxConn]int), open: make(map[*muxConn]struct{})}
}

// Stats returns the counters of the Pool's v2 connections (and the
// timeouts of its v1 ones).
func (p *Pool) Stats() *MuxStats { return &p.stats }

// Conns returns how many v2 connections are open.
func (p *Pool) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Dial opens one bridge session as Dial does (hello exchange, then
// session.start; the same errors), on a v2 connection with room, a new
// connection, or, when the backend selects v1, a WebSocket of its own.
// ctx bounds the setup only.
func (p *Pool) Dial(ctx context.Context, start SessionStart) (*Conn, error) {
	if err := checkStart(start); err != nil {
		return nil, err
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("%w: pool closed", ErrClosed)
		}
		if m := p.pick(); m != nil {
			p.conns[m]++
			p.mu.Unlock()
			s := m.open()
			if s == nil { // failed between pick and open
				p.release(m)
				continue
			}
			c := newCore(s)
			if err := c.dialHandshake(ctx, start); err != nil {
				_ = c.Close()
				return nil, err
			}
			return &Conn{core: c}, nil
		}
		if p.dialing != nil && !p.v1 {
			ch := p.dialing
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("bridge: dial %s: %w", p.url, ctx.Err())
			}
		}
		var ch chan struct{}
		if p.dialing == nil {
			ch = make(chan struct{})
			p.dialing = ch
		}
		p.mu.Unlock()
		c, err := p.dialConn(ctx, start)
		if ch != nil {
			p.mu.Lock()
			p.dialing = nil
			p.mu.Unlock()
			close(ch)
		}
		if err != nil || c != nil {
			return c, err
		}
		// A new v2 connection is in the pool: take a session on it.
	}
}

// pick returns the fullest v2 connection with room whose write is not
// stuck (a new session there would wait for its hello to be written);
// p.mu is held.
func (p *Pool) pick() *muxConn {
	var best *muxConn
	n := -1
	now := time.Now()
	for m, live := range p.conns {
		if live < p.opts.SessionsPerConn && live > n && !m.stuck(now) {
			best, n = m, live
		}
	}
	return best
}

// dialConn dials a connection offering v2 and v1. For v1 it returns the
// session's Conn; for v2 it adds the connection to the pool and returns
// nil, nil.
func (p *Pool) dialConn(ctx context.Context, start SessionStart) (*Conn, error) {
	ws, _, err := websocket.Dial(ctx, p.url, &websocket.DialOptions{
		Subprotocols: []string{SubprotocolV2, Subprotocol},
		HTTPClient:   p.opts.HTTPClient,
	})
	if err != nil {
		return nil, fmt.Errorf("bridge: dial %s: %w", p.url, err)
	}
	switch ws.Subprotocol() {
	case Subprotocol:
		p.mu.Lock()
		p.v1 = true
		p.mu.Unlock()
		return handshakeV1(ctx, ws, start, &p.stats, p.opts.WriteTimeout, p.opts.KeepAlive)
	case SubprotocolV2:
	default:
		err := fmt.Errorf("%w: backend selected subprotocol %q, want %q or %q", ErrVersion, ws.Subprotocol(), SubprotocolV2, Subprotocol)
		_ = ws.Close(CloseVersion, truncReason(err.Error()))
		return nil, err
	}
	m := newMuxConn(ws, true, &p.stats, p.opts.WriteTimeout, p.opts.KeepAlive)
	if err := m.helloExchange(ctx); err != nil {
		return nil, err
	}
	m.onGone = func() { p.release(m) }
	m.onFail = func() { p.forget(m) }
	p.mu.Lock()
	p.v1 = false
	if p.closed {
		p.mu.Unlock()
		_ = ws.CloseNow()
		return nil, fmt.Errorf("%w: pool closed", ErrClosed)
	}
	p.conns[m] = 0
	p.open[m] = struct{}{}
	p.all.Add(1)
	p.mu.Unlock()
	m.start()
	go func() {
		defer p.all.Done()
		m.readLoop()
		m.wait()
	}()
	return nil, nil
}

// release counts a session's end; a connection left with none drains.
func (p *Pool) release(m *muxConn) {
	p.mu.Lock()
	live, ok := p.conns[m]
	if !ok {
		p.mu.Unlock()
		return
	}
	if live--; live > 0 {
		p.conns[m] = live
		p.mu.Unlock()
		return
	}
	delete(p.conns, m)
	p.mu.Unlock()
	m.drain()
}

// forget drops a failed or drained connection from the pool.
func (p *Pool) forget(m *muxConn) {
	p.mu.Lock()
	delete(p.conns, m)
	delete(p.open, m)
	p.mu.Unlock()
}

// Close closes every v2 connection at once, draining ones included
// (their sessions' Recv return ErrClosed), and waits for their goroutines; later Dials fail. v1
// sessions are the caller's to end. Idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	ms := make([]*muxConn, 0, len(p.open))
	for m := range p.open {
		ms = append(ms, m)
	}
	p.mu.Unlock()
	for _, m := range ms {
		m.fail(fmt.Errorf("%w: pool closed", errSessionClosed))
	}
	p.all.Wait()
	return nil
}

// checkStart validates a SessionStart before dialing.
func checkStart(start SessionStart) error {
	if start.SessionID == "" {
		return errors.New("bridge: dial: empty SessionStart.SessionID")
	}
	if start.Session != nil && !IsJSONObject(start.Session) {
		return errors.New("bridge: dial: SessionStart.Session is not a JSON object")
	}
	return nil
}
