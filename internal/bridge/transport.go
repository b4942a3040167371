package bridge

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// transport carries one session's messages: a whole WebSocket (v1,
// wsTransport) or one session of a multiplexed v2 connection (stream).
// Errors are the transport's own; core maps them with closedErr.
type transport interface {
	// write sends one message; b is not retained after write returns.
	write(ctx context.Context, typ websocket.MessageType, b []byte) error
	// read returns the next message; b is valid until the next read.
	// Only one goroutine reads at a time.
	read(ctx context.Context) (typ websocket.MessageType, b []byte, err error)
	// close ends the session with a close code and reason (v1: the
	// WebSocket close handshake).
	close(code websocket.StatusCode, reason string) error
	// closeNow ends the session at once; the peer sees it dropped.
	closeNow() error
}

// wsTransport is bridge v1: one session per WebSocket.
//
// Like a v2 connection (muxConn) it bounds each write by a write timeout
// and pings the peer after a keepalive period without input; either
// failing closes the WebSocket at once (docs/bridge.md §12.5, which v1
// follows). Both run on timers (time.AfterFunc) rather than a goroutine or
// a deadline context per write, so the audio path allocates nothing.
type wsTransport struct {
	ws   *websocket.Conn
	rbuf []byte // reused read buffer; only the single reader touches it

	// Set once, never mutated.
	stats                   *MuxStats // never nil
	writeTimeout, keepAlive time.Duration
	wtimer                  *time.Timer // armed while a write is in flight: writeTimedOut
	ktimer                  *time.Timer // keepalive period: keepAliveTick

	timedOut atomic.Bool // the write timer fired: the WebSocket is closed
	rx       atomic.Bool // a message arrived since the last keepalive tick
	over     atomic.Bool // close or closeNow ran: the timers stay stopped
}

// newWSTransport wraps a v1 WebSocket; writeTimeout and keepAlive ≤ 0
// mean DefaultWriteTimeout and DefaultKeepAlive, stats nil counts
// nowhere.
func newWSTransport(ws *websocket.Conn, stats *MuxStats, writeTimeout, keepAlive time.Duration) *wsTransport {
	if stats == nil {
		stats = new(MuxStats)
	}
	if writeTimeout <= 0 {
		writeTimeout = DefaultWriteTimeout
	}
	if keepAlive <= 0 {
		keepAlive = DefaultKeepAlive
	}
	ws.SetReadLimit(MaxMessageSize)
	t := &wsTransport{ws: ws, rbuf: make([]byte, 0, 4096), stats: stats, writeTimeout: writeTimeout, keepAlive: keepAlive}
	t.wtimer = time.AfterFunc(time.Hour, t.writeTimedOut)
	t.wtimer.Stop()
	t.ktimer = time.AfterFunc(keepAlive, t.keepAliveTick)
	return t
}

// write sends one message. Writes never overlap (core holds wmu), so one
// timer serves them all.
func (t *wsTransport) write(ctx context.Context, typ websocket.MessageType, b []byte) error {
	t.wtimer.Reset(t.writeTimeout)
	err := t.ws.Write(ctx, typ, b)
	t.wtimer.Stop()
	if t.timedOut.Load() {
		return fmt.Errorf("%w: write not done within %v", errWriteTimeout, t.writeTimeout)
	}
	return err
}

// writeTimedOut runs when a write has been in flight for writeTimeout:
// the peer stopped reading. Closing the WebSocket ends the write (and the
// session: its Recv returns ErrClosed).
func (t *wsTransport) writeTimedOut() {
	if t.over.Load() {
		return
	}
	t.timedOut.Store(true)
	t.stats.writeTimeouts.Add(1)
	_ = t.ws.CloseNow()
}

// keepAliveTick pings the peer when nothing arrived for a keepalive
// period and closes the WebSocket when the pong does not come back within
// another. The pong is read by the session's Recv, which the transceiver
// always runs.
func (t *wsTransport) keepAliveTick() {
	if t.over.Load() {
		return
	}
	if !t.rx.Swap(false) {
		ctx, cancel := context.WithTimeout(context.Background(), t.keepAlive)
		err := t.ws.Ping(ctx)
		expired := ctx.Err() != nil
		cancel()
		if err != nil {
			if expired && !t.over.Load() {
				t.stats.pongTimeouts.Add(1)
			}
			_ = t.ws.CloseNow()
			return
		}
	}
	if !t.over.Load() {
		t.ktimer.Reset(t.keepAlive)
	}
}

// stop stops the timers for good.
func (t *wsTransport) stop() {
	t.over.Store(true)
	t.wtimer.Stop()
	t.ktimer.Stop()
}

func (t *wsTransport) read(ctx context.Context) (websocket.MessageType, []byte, error) {
	typ, r, err := t.ws.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	b, err := readAll(r, t.rbuf[:0])
	t.rbuf = b
	t.rx.Store(true)
	return typ, b, err
}

// readAll reads r to EOF into b, growing it as needed, and returns it.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

func (t *wsTransport) close(code websocket.StatusCode, reason string) error {
	t.stop()
	return t.ws.Close(code, reason)
}

func (t *wsTransport) closeNow() error {
	t.stop()
	return t.ws.CloseNow()
}
