package bridge

import (
	"context"
	"io"

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
type wsTransport struct {
	ws   *websocket.Conn
	rbuf []byte // reused read buffer; only the single reader touches it
}

func newWSTransport(ws *websocket.Conn) *wsTransport {
	ws.SetReadLimit(MaxMessageSize)
	return &wsTransport{ws: ws, rbuf: make([]byte, 0, 4096)}
}

func (t *wsTransport) write(ctx context.Context, typ websocket.MessageType, b []byte) error {
	return t.ws.Write(ctx, typ, b)
}

func (t *wsTransport) read(ctx context.Context) (websocket.MessageType, []byte, error) {
	typ, r, err := t.ws.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	b, err := readAll(r, t.rbuf[:0])
	t.rbuf = b
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
	return t.ws.Close(code, reason)
}

func (t *wsTransport) closeNow() error { return t.ws.CloseNow() }
