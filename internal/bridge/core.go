package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/coder/websocket"
)

// core is the session phase shared by Conn and ServerConn: sending and
// receiving audio, events and session.end over one WebSocket.
type core struct {
	// Set once before the core is shared, never mutated.
	t      transport // the WebSocket (v1) or one session of a v2 connection
	format string
	// noClientEvents: the backend's hello had
	// "output_audio_buffer_events": false.
	noClientEvents bool
	// noInputEvents: the backend's hello had
	// "input_audio_buffer_events": false.
	noInputEvents bool
	// turnDetection: the backend hello's turn_detection, as sent (nil
	// when absent).
	turnDetection json.RawMessage

	// wmu guards wbuf, the reused encode buffer for outgoing messages.
	// Holding it across ws.Write also keeps messages in call order.
	wmu   sync.Mutex
	wbuf  []byte
	ended bool // guarded by wmu: End ran; nothing may follow session.end

	rframe AudioFrame // the frame Recv returns a pointer to; only the single Recv caller touches it

	ignored   atomic.Uint64 // messages ignored: unknown type or frame kind
	peerEnded atomic.Bool   // a session.end was received
	endOnce   sync.Once
	closeOnce sync.Once
	endErr    error // written in endOnce
}

func newCore(t transport) *core {
	return &core{t: t, wbuf: make([]byte, 0, 2048)}
}

// Format returns the audio format agreed in the hello exchange, e.g.
// FormatOpus.
func (c *core) Format() string { return c.format }

// OutputAudioBufferEvents reports whether the backend lets the
// transceiver send the client OpenAI's output_audio_buffer.started,
// .stopped and .cleared events (true unless its hello said
// "output_audio_buffer_events": false).
func (c *core) OutputAudioBufferEvents() bool { return !c.noClientEvents }

// InputAudioBufferEvents reports whether the backend lets the
// transceiver send the client OpenAI's input_audio_buffer.speech_started
// and .speech_stopped events (true unless its hello said
// "input_audio_buffer_events": false).
func (c *core) InputAudioBufferEvents() bool { return !c.noInputEvents }

// TurnDetection returns the turn_detection member of the backend's hello
// exactly as sent: nil when absent, "null" for off, else a JSON object
// (OpenAI's turn_detection, docs/bridge.md §4.2). The bridge does not
// interpret it.
func (c *core) TurnDetection() json.RawMessage { return c.turnDetection }

// Ignored returns how many messages from the peer were ignored because
// their "type" (text) or kind byte (binary) is unknown to v1.
func (c *core) Ignored() uint64 { return c.ignored.Load() }

// SendAudio sends one audio frame. It copies f.Payload before returning,
// so the caller may reuse it at once. Safe for concurrent use with
// SendEvent, Recv, End and Close; concurrent sends are written whole, in
// the order they take the write lock.
//
// If ctx ends during the write, the WebSocket library closes the
// connection: pass a context that lives as long as the session. With a
// ctx whose Done channel is nil (context.Background()), SendAudio and
// Recv of audio do not allocate in the steady state; a cancellable ctx
// costs the library a context.AfterFunc (a few allocations) per call. A
// caller that wants zero allocations uses context.Background() and
// unblocks with Close or End; a write the peer does not take within the
// write timeout (DefaultWriteTimeout, or the Pool's or AcceptOptions')
// closes the connection and fails with ErrClosed.
func (c *core) SendAudio(ctx context.Context, f AudioFrame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = AppendAudioFrame(c.wbuf[:0], f)
	return c.write(ctx, websocket.MessageBinary, c.wbuf)
}

// SendEvent sends one data-channel message (any text; JSON for
// oai-events) to the peer as an event. data must be valid UTF-8 (else
// ErrInvalidEvent); it is not retained. Safe for concurrent use.
func (c *core) SendEvent(ctx context.Context, data []byte) error {
	if !utf8.Valid(data) {
		return ErrInvalidEvent
	}
	return c.sendJSON(ctx, eventMsg{Type: typeEvent, Data: string(data)})
}

func (c *core) sendJSON(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("bridge: encode: %w", err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.write(ctx, websocket.MessageText, b)
}

func (c *core) write(ctx context.Context, typ websocket.MessageType, b []byte) error {
	if c.ended {
		return fmt.Errorf("%w: the session was ended", ErrClosed)
	}
	if err := c.t.write(ctx, typ, b); err != nil {
		return closedErr(ctx, err)
	}
	return nil
}

// Message is one message received from the peer: exactly one of Audio,
// Event, Control, End and Connection is set.
type Message struct {
	// Audio is an audio frame. Its Payload is valid only until the next
	// Recv.
	Audio *AudioFrame
	// Event is the text of a data-channel message (for oai-events, one
	// JSON event). It is a fresh copy the caller owns; it is non-nil
	// (possibly empty) when the message is an event.
	Event []byte
	// Control is an output.* or error message (docs/bridge.md §4.5). It is
	// a fresh value the caller owns.
	Control *Control
	// End reports that the peer ended the session. The peer then closes
	// the WebSocket; call Close (or End) to release the connection.
	End *SessionEnd
	// Connection reports the client's connection state (transceiver →
	// backend only; state.go).
	Connection *ConnectionState
}

// SessionEnd is the content of a session.end message.
type SessionEnd struct {
	// Reason says why the session ended, e.g. ReasonClientHangup. Any
	// string is allowed; it may be empty.
	Reason string
}

// Recv returns the next audio frame, event or session end from the
// peer, skipping (and counting, see Ignored) messages of unknown type or
// kind. Only one goroutine may call Recv at a time.
//
// Errors: a malformed or out-of-order message closes the connection with
// status 1002 and returns an error wrapping ErrProtocol. Once the
// connection is closed, by either side, Recv returns an error wrapping
// ErrClosed (and ErrVersion, ErrFormat or ErrProtocol when the peer's
// close code says so). If ctx ends while Recv waits, the session is
// aborted as by Close (the peer sees close code 1006): on v1 the
// WebSocket library closes the connection, on v2 the session alone ends.
//
// The returned Audio frame and its Payload alias an internal buffer
// valid until the next Recv; the frame struct itself is reused.
func (c *core) Recv(ctx context.Context) (Message, error) {
	for {
		typ, b, err := c.read(ctx)
		if err != nil {
			return Message{}, err
		}
		if typ == websocket.MessageBinary {
			f, err := ParseAudioFrame(b)
			if errors.Is(err, ErrFrameKind) {
				c.ignored.Add(1)
				continue
			}
			if err != nil {
				return Message{}, c.protocolError(err)
			}
			c.rframe = f
			return Message{Audio: &c.rframe}, nil
		}
		m, err := parseText(b)
		if err != nil {
			return Message{}, c.protocolError(err)
		}
		switch m.Type {
		case typeEvent:
			if m.Data == nil {
				return Message{}, c.protocolError(fmt.Errorf(`%w: event without a string "data"`, ErrProtocol))
			}
			ev := make([]byte, len(*m.Data))
			copy(ev, *m.Data)
			return Message{Event: ev}, nil
		case typeSessionEnd:
			c.peerEnded.Store(true)
			return Message{End: &SessionEnd{Reason: m.Reason}}, nil
		case TypeOutputClear, TypeOutputCleared, TypeOutputMark, TypeOutputStarted, TypeOutputStopped, TypeOutputResponse, TypeError,
			TypeInputSpeechStarted, TypeInputSpeechStopped, TypeInputTurnDetection, TypeInputSpeechPaused, TypeInputSpeechResumed,
			TypeInputTimeoutTriggered, TypeOutputPaused, TypeOutputResumed:
			ctl, err := parseControl(m)
			if err != nil {
				return Message{}, c.protocolError(err)
			}
			return Message{Control: ctl}, nil
		case typeConnection:
			return Message{Connection: &ConnectionState{State: m.State}}, nil
		case typeHello, typeSessionStart:
			return Message{}, c.protocolError(fmt.Errorf("%w: %q after the handshake", ErrProtocol, m.Type))
		default:
			c.ignored.Add(1)
		}
	}
}

// read reads one whole message; b is valid until the next read.
func (c *core) read(ctx context.Context) (websocket.MessageType, []byte, error) {
	typ, b, err := c.t.read(ctx)
	if err != nil {
		return 0, nil, closedErr(ctx, err)
	}
	return typ, b, nil
}

// readText reads the next known text message during the handshake,
// skipping unknown types like Recv does.
func (c *core) readText(ctx context.Context) (inMsg, error) {
	for {
		typ, b, err := c.read(ctx)
		if err != nil {
			return inMsg{}, err
		}
		if typ != websocket.MessageText {
			return inMsg{}, c.protocolError(fmt.Errorf("%w: binary message during the handshake", ErrProtocol))
		}
		m, err := parseText(b)
		if err != nil {
			return inMsg{}, c.protocolError(err)
		}
		switch m.Type {
		case typeHello, typeSessionStart, typeEvent, typeSessionEnd:
			return m, nil
		}
		c.ignored.Add(1)
	}
}

// protocolError closes the connection with 1002 and returns err, which
// wraps ErrProtocol.
func (c *core) protocolError(err error) error {
	c.closeWith(websocket.StatusProtocolError, err.Error())
	return err
}

// fail closes the connection with code and returns err.
func (c *core) fail(code websocket.StatusCode, err error) error {
	c.closeWith(code, err.Error())
	return err
}

// closeWith runs the WebSocket close handshake with code and reason
// (truncated to the 123 bytes a close frame holds). The library bounds
// it to 5 s for the write and 5 s for the peer's reply.
func (c *core) closeWith(code websocket.StatusCode, reason string) {
	c.closeOnce.Do(func() { _ = c.t.close(code, truncReason(reason)) })
}

// maxCloseReason is how many bytes of reason a WebSocket close frame
// holds (RFC 6455 §5.5: 125-byte control payload, 2 for the code).
const maxCloseReason = 123

// truncReason cuts a close reason to the 123 bytes a close frame holds,
// on a rune boundary.
func truncReason(reason string) string {
	if len(reason) > maxCloseReason {
		reason = reason[:maxCloseReason]
		for !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	return reason
}

// End sends session.end with reason (unless the peer already ended the
// session), then closes the WebSocket with status 1000. Sends that come
// after session.end return an error wrapping ErrClosed, never a message
// after it. It is
// idempotent: later calls return the first call's result. The close
// handshake waits for the peer's reply for at most about 10 s (library
// bound); ctx bounds the session.end write and the wait for a send in
// progress: if a send is blocked on a backend that does not read (a send
// with context.Background() waits until the write timeout, 5 s by
// default, closes the connection) and ctx ends first, the connection is closed at once, as by Close, that
// send fails with ErrClosed, and End returns an error wrapping ErrClosed.
func (c *core) End(ctx context.Context, reason string) error {
	c.endOnce.Do(func() {
		b, err := json.Marshal(sessionEndMsg{Type: typeSessionEnd, Reason: reason})
		// Under the write lock, so that no send from another goroutine
		// can follow session.end: later sends fail with ErrClosed.
		c.lockForEnd(ctx)
		if !c.peerEnded.Load() {
			c.endErr = err
			if err == nil {
				c.endErr = c.write(ctx, websocket.MessageText, b)
			}
		}
		c.ended = true
		c.wmu.Unlock()
		c.closeWith(websocket.StatusNormalClosure, typeSessionEnd)
	})
	return c.endErr
}

// lockForEnd takes wmu. A send holding it blocks only while the peer does
// not read; when ctx ends first, Close fails that send, which frees wmu.
func (c *core) lockForEnd(ctx context.Context) {
	if c.wmu.TryLock() {
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	c.wmu.Lock()
	stop()
}

// Close closes the connection at once, without session.end and without
// the WebSocket close handshake; the peer sees the connection drop. Use
// End to end a session gracefully. Close is idempotent, safe for
// concurrent use, and unblocks Recv and pending sends.
func (c *core) Close() error {
	c.closeOnce.Do(func() { _ = c.t.closeNow() })
	return nil
}

// closedErr maps an error from the WebSocket library, after which the
// connection is closed, to this package's sentinels.
func closedErr(ctx context.Context, err error) error {
	switch websocket.CloseStatus(err) {
	case CloseVersion:
		return fmt.Errorf("%w: %w: %w", ErrClosed, ErrVersion, err)
	case CloseFormat:
		return fmt.Errorf("%w: %w: %w", ErrClosed, ErrFormat, err)
	case websocket.StatusProtocolError:
		return fmt.Errorf("%w: %w: %w", ErrClosed, ErrProtocol, err)
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		return fmt.Errorf("%w: %w: %w", ErrClosed, ctxErr, err)
	}
	return fmt.Errorf("%w: %w", ErrClosed, err)
}
