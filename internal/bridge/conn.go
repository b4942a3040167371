package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/coder/websocket"
)

// SessionStart is the content of session.start, which the transceiver
// sends once the hello exchange agreed on a format.
type SessionStart struct {
	// SessionID identifies the session (the transceiver's id, unique per
	// session). It must not be empty.
	SessionID string
	// Metadata is optional call metadata as string pairs (for example
	// client address, user agent, model requested). It may be nil.
	Metadata map[string]string
	// Session is the session configuration the client's application sent
	// with its offer (the "session" part of a multipart/form-data call,
	// as in OpenAI's POST /v1/realtime/calls: instructions, voice, turn
	// detection, …), a JSON object passed through untouched; nil when the
	// call carried none. Dial sends it only if it is a JSON object.
	Session json.RawMessage
}

// Conn is the transceiver side of one bridge session, returned by Dial.
//
// SendAudio, SendEvent, End and Close are safe for concurrent use with
// each other and with Recv; Recv must be called by one goroutine at a
// time.
type Conn struct {
	*core
}

// offeredFormats is what Dial offers, in order of preference.
var offeredFormats = []string{FormatOpus, FormatPCM24k, FormatPCM16k}

// Dial opens a bridge session to the backend at url (ws://, wss://,
// http:// or https://): it offers Subprotocol, does the hello exchange
// and sends session.start. ctx bounds the whole setup; it is not used
// after Dial returns.
//
// Errors wrap ErrVersion when the backend does not select Subprotocol or
// answers with another version (closing with CloseVersion), ErrFormat
// when it picks no format or one Dial did not offer (closing with
// CloseFormat), ErrProtocol on a malformed answer, and ErrClosed when
// the connection closes during setup. On error no connection is left
// open.
//
// The connection has DefaultWriteTimeout and DefaultKeepAlive (a Pool
// sets its own): a send the backend does not take within the write
// timeout closes the connection and fails with ErrClosed, and so does a
// keepalive ping left unanswered.
func Dial(ctx context.Context, url string, start SessionStart) (*Conn, error) {
	if err := checkStart(start); err != nil {
		return nil, err
	}
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		Subprotocols: []string{Subprotocol},
	})
	if err != nil {
		return nil, fmt.Errorf("bridge: dial %s: %w", url, err)
	}
	return handshakeV1(ctx, ws, start, nil, 0, 0)
}

// handshakeV1 runs a v1 session's setup on a dialed WebSocket; stats,
// writeTimeout and keepAlive go to its transport (newWSTransport).
func handshakeV1(ctx context.Context, ws *websocket.Conn, start SessionStart, stats *MuxStats, writeTimeout, keepAlive time.Duration) (*Conn, error) {
	c := newCore(newWSTransport(ws, stats, writeTimeout, keepAlive))
	if got := ws.Subprotocol(); got != Subprotocol {
		err := fmt.Errorf("%w: backend selected subprotocol %q, want %q", ErrVersion, got, Subprotocol)
		_ = c.fail(CloseVersion, err)
		_ = c.Close()
		return nil, err
	}
	if err := c.dialHandshake(ctx, start); err != nil {
		_ = c.Close()
		return nil, err
	}
	return &Conn{core: c}, nil
}

func (c *core) dialHandshake(ctx context.Context, start SessionStart) error {
	if err := c.sendJSON(ctx, helloOffer{Type: typeHello, Version: Version, AudioFormats: offeredFormats}); err != nil {
		return err
	}
	m, err := c.readText(ctx)
	if err != nil {
		return err
	}
	switch {
	case m.Type != typeHello:
		return c.protocolError(fmt.Errorf("%w: got %q, want hello", ErrProtocol, m.Type))
	case m.Version != Version:
		return c.fail(CloseVersion, fmt.Errorf("%w: backend hello version %d, want %d", ErrVersion, m.Version, Version))
	case !slices.Contains(offeredFormats, m.AudioFormat):
		return c.fail(CloseFormat, fmt.Errorf("%w: backend chose audio format %q, offered %q", ErrFormat, m.AudioFormat, offeredFormats))
	case m.TurnDetection != nil && !isObjectOrNull(m.TurnDetection):
		return c.protocolError(fmt.Errorf(`%w: backend hello "turn_detection" is neither an object nor null`, ErrProtocol))
	}
	c.format = m.AudioFormat
	c.noClientEvents = m.OutputAudioBufferEvents != nil && !*m.OutputAudioBufferEvents
	c.noInputEvents = m.InputAudioBufferEvents != nil && !*m.InputAudioBufferEvents
	c.turnDetection = m.TurnDetection
	return c.sendJSON(ctx, sessionStartMsg{Type: typeSessionStart, SessionID: start.SessionID, Metadata: start.Metadata, Session: start.Session})
}

// IsJSONObject reports whether b is one valid JSON object (RFC 8259 §4),
// the only shape session.start's "session" may have.
func IsJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}
