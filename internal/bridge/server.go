package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// AcceptOptions configures Accept. The zero value is ready to use.
type AcceptOptions struct {
	// Formats lists the audio formats the backend accepts, in order of
	// preference. Accept picks the first one the transceiver offered.
	// Default: [FormatOpus].
	Formats []string
	// HandshakeTimeout bounds the hello exchange and the wait for
	// session.start. Default: 10 s.
	HandshakeTimeout time.Duration
	// NoOutputAudioBufferEvents asks the transceiver, in the backend's
	// hello ("output_audio_buffer_events": false), not to send the client
	// OpenAI's output_audio_buffer.started, .stopped and .cleared events:
	// for a backend that sends its own. Default: the transceiver sends
	// them.
	NoOutputAudioBufferEvents bool
	// NoInputAudioBufferEvents: the same ("input_audio_buffer_events":
	// false) for OpenAI's input_audio_buffer.speech_started and
	// .speech_stopped events.
	NoInputAudioBufferEvents bool
	// TurnDetection, when set, is sent in the hello as "turn_detection":
	// OpenAI's turn_detection object (docs/bridge.md §4.8), asking the
	// transceiver to detect turns on the input and send
	// input.speech_started / input.speech_stopped. It must be a JSON
	// object (Accept fails before upgrading otherwise). Default: none.
	TurnDetection json.RawMessage
	// HandshakeError, when set, is called by Serve with the error of the
	// first v2 session on each connection whose setup failed (a v1 setup
	// error is Serve's result). A session costs the peer one record, so
	// the later failures of the connection are only counted
	// (MuxStats.SetupFailures, in Stats): a caller that logs here logs
	// once per connection, not once per bad record. It must not block.
	HandshakeError func(error)
	// Stats, when set, counts what Serve's v2 connections dropped and
	// wrote, and the timeouts of every connection, v1 or v2 (shared by
	// every connection given the same Stats).
	Stats *MuxStats
	// WriteTimeout and KeepAlive bound the connections of Accept and
	// Serve, v1 and v2, as PoolOptions' fields of the same names bound
	// the transceiver's. Defaults DefaultWriteTimeout and
	// DefaultKeepAlive.
	//
	// On a v1 connection (Accept, or Serve when the transceiver speaks
	// v1) WebSocket pings and pongs are read only inside the session's
	// Recv: the WebSocket library handles control frames in its reader,
	// and v1 has no reader besides Recv. A v1 backend that goes two to
	// three KeepAlive periods without a Recv running (30–45 s by
	// default) loses the session: the pong to its own ping is not read,
	// and the transceiver's pings (sent once the backend has sent nothing
	// for a period) go unanswered; its sends and Recv then fail with
	// ErrClosed. A handler that does long work between Recv calls
	// must keep a goroutine in Recv meanwhile (as the transceiver does);
	// a larger KeepAlive only delays the backend's own ping, not the
	// transceiver's. v2 connections read control frames in the
	// connection's own reader, whatever their sessions do.
	WriteTimeout, KeepAlive time.Duration
}

// ServerConn is the backend side of one bridge session, returned by
// Accept. Its methods have the same semantics as Conn's.
type ServerConn struct {
	*core
	session SessionStart
}

// Session returns the session.start the transceiver sent.
func (s *ServerConn) Session() SessionStart { return s.session }

// Accept upgrades r to a bridge WebSocket, answers the transceiver's
// hello with the first of opts.Formats it offered, and waits for
// session.start. The caller owns the returned ServerConn and must End or
// Close it; the handler may keep using it after Accept returns (the
// connection is hijacked, so do not use r.Context() for its lifetime).
//
// A request that does not offer Subprotocol gets HTTP 400 and an error
// wrapping ErrVersion. After the upgrade, errors wrap ErrVersion (hello
// version is not Version; closed with CloseVersion), ErrFormat (no
// common format; closed with CloseFormat), ErrProtocol (malformed or
// out-of-order message; closed with 1002) or ErrClosed. On error no
// connection is left open.
func Accept(w http.ResponseWriter, r *http.Request, opts AcceptOptions) (*ServerConn, error) {
	if !offersSubprotocol(r.Header, Subprotocol) {
		err := fmt.Errorf("%w: request does not offer WebSocket subprotocol %q", ErrVersion, Subprotocol)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, err
	}
	formats, timeout, err := opts.check(w)
	if err != nil {
		return nil, err
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}})
	if err != nil {
		return nil, fmt.Errorf("bridge: accept: %w", err)
	}
	return acceptV1(ws, formats, timeout, opts)
}

// check validates opts and returns its formats and handshake timeout
// with defaults filled; on error it answers HTTP 500.
func (opts AcceptOptions) check(w http.ResponseWriter) ([]string, time.Duration, error) {
	if opts.TurnDetection != nil && !IsJSONObject(opts.TurnDetection) {
		err := fmt.Errorf("bridge: AcceptOptions.TurnDetection is not a JSON object: %.64q", opts.TurnDetection)
		http.Error(w, "backend misconfigured", http.StatusInternalServerError)
		return nil, 0, err
	}
	formats := opts.Formats
	if len(formats) == 0 {
		formats = []string{FormatOpus}
	}
	timeout := opts.HandshakeTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return formats, timeout, nil
}

func acceptV1(ws *websocket.Conn, formats []string, timeout time.Duration, opts AcceptOptions) (*ServerConn, error) {
	c := newCore(newWSTransport(ws, opts.Stats, opts.WriteTimeout, opts.KeepAlive))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start, err := c.acceptHandshake(ctx, formats, opts)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &ServerConn{core: c, session: start}, nil
}

// Serve answers one bridge upgrade request in either version and runs
// serve for each session it carries: with v1 (the request offers only
// Subprotocol) once, in the calling goroutine; with v2 (it offers
// SubprotocolV2) in a new goroutine per session the transceiver opens on
// the connection (docs/bridge.md §12). serve gets a ServerConn exactly as
// Accept returns it, with the same methods and semantics, whichever the
// version; Serve closes it after serve returns.
//
// Serve returns when the connection is over and every serve has
// returned. Its error is the v1 setup error (as Accept's), the v2
// connection hello's, or nil; the first v2 session whose setup fails goes
// to opts.HandshakeError, and every one is counted in
// opts.Stats.SetupFailures. A request that offers neither subprotocol gets
// HTTP 400 and an error wrapping ErrVersion.
func Serve(w http.ResponseWriter, r *http.Request, opts AcceptOptions, serve func(*ServerConn)) error {
	if !offersSubprotocol(r.Header, Subprotocol) && !offersSubprotocol(r.Header, SubprotocolV2) {
		err := fmt.Errorf("%w: request offers neither WebSocket subprotocol %q nor %q", ErrVersion, SubprotocolV2, Subprotocol)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return err
	}
	formats, timeout, err := opts.check(w)
	if err != nil {
		return err
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{SubprotocolV2, Subprotocol}})
	if err != nil {
		return fmt.Errorf("bridge: accept: %w", err)
	}
	if ws.Subprotocol() != SubprotocolV2 {
		sc, err := acceptV1(ws, formats, timeout, opts)
		if err != nil {
			return err
		}
		defer sc.Close()
		serve(sc)
		return nil
	}
	m := newMuxConn(ws, false, opts.Stats, opts.WriteTimeout, opts.KeepAlive)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	err = m.helloExchange(ctx)
	cancel()
	if err != nil {
		return err
	}
	var (
		sessions sync.WaitGroup
		reported atomic.Bool // HandshakeError was called on this connection
	)
	m.onStream = func(s *stream) {
		sessions.Add(1)
		go func() {
			defer sessions.Done()
			c := newCore(s)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			start, err := c.acceptHandshake(ctx, formats, opts)
			cancel()
			if err != nil {
				m.stats.setupFailures.Add(1) // before the close record goes out
				_ = c.Close()
				if opts.HandshakeError != nil && !reported.Swap(true) {
					opts.HandshakeError(err)
				}
				return
			}
			sc := &ServerConn{core: c, session: start}
			defer sc.Close()
			serve(sc)
		}()
	}
	m.start()
	m.readLoop() // until the connection is over
	m.wait()
	sessions.Wait()
	return nil
}

func (c *core) acceptHandshake(ctx context.Context, formats []string, opts AcceptOptions) (SessionStart, error) {
	m, err := c.readText(ctx)
	if err != nil {
		return SessionStart{}, err
	}
	switch {
	case m.Type != typeHello:
		return SessionStart{}, c.protocolError(fmt.Errorf("%w: got %q, want hello", ErrProtocol, m.Type))
	case m.Version != Version:
		return SessionStart{}, c.fail(CloseVersion, fmt.Errorf("%w: transceiver hello version %d, want %d", ErrVersion, m.Version, Version))
	}
	i := slices.IndexFunc(formats, func(f string) bool { return slices.Contains(m.AudioFormats, f) })
	if i < 0 {
		return SessionStart{}, c.fail(CloseFormat, fmt.Errorf("%w: backend accepts %q, transceiver offered %q", ErrFormat, formats, m.AudioFormats))
	}
	c.format = formats[i]
	c.noClientEvents, c.noInputEvents = opts.NoOutputAudioBufferEvents, opts.NoInputAudioBufferEvents
	c.turnDetection = opts.TurnDetection
	answer := helloAnswer{Type: typeHello, Version: Version, AudioFormat: c.format, TurnDetection: opts.TurnDetection}
	if c.noClientEvents {
		answer.OutputAudioBufferEvents = new(bool)
	}
	if c.noInputEvents {
		answer.InputAudioBufferEvents = new(bool)
	}
	if err := c.sendJSON(ctx, answer); err != nil {
		return SessionStart{}, err
	}
	m, err = c.readText(ctx)
	if err != nil {
		return SessionStart{}, err
	}
	switch {
	case m.Type != typeSessionStart:
		return SessionStart{}, c.protocolError(fmt.Errorf("%w: got %q, want session.start", ErrProtocol, m.Type))
	case m.SessionID == "":
		return SessionStart{}, c.protocolError(fmt.Errorf("%w: session.start without session_id", ErrProtocol))
	case m.Session != nil && !bytes.Equal(m.Session, []byte("null")) && !IsJSONObject(m.Session):
		return SessionStart{}, c.protocolError(fmt.Errorf(`%w: session.start "session" is not a JSON object`, ErrProtocol))
	}
	start := SessionStart{SessionID: m.SessionID, Metadata: m.Metadata}
	if m.Session != nil && !bytes.Equal(m.Session, []byte("null")) {
		start.Session = m.Session
	}
	return start, nil
}

// offersSubprotocol reports whether the Sec-WebSocket-Protocol request
// headers list proto (RFC 6455 §11.3.4: comma-separated tokens).
func offersSubprotocol(h http.Header, proto string) bool {
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.TrimSpace(tok) == proto {
				return true
			}
		}
	}
	return false
}
