// Package agent holds reference backends (agents) for the Switchboard
// bridge (package bridge, docs/bridge.md).
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// echo is the handler returned by NewEcho.
type echo struct {
	logger *slog.Logger
	format string
	td     json.RawMessage // the hello's turn_detection; nil: none
}

// EchoConfig configures NewEchoConfig.
type EchoConfig struct {
	// Logger receives session start and end; nil means slog.Default().
	Logger *slog.Logger
	// Format is the one audio format the agent accepts and echoes in:
	// bridge.FormatOpus (the default: Opus packets back unchanged),
	// bridge.FormatPCM24k or bridge.FormatPCM16k (PCM frames back
	// unchanged, so the transceiver's decode, encode and paced playout run
	// end to end).
	Format string
	// TurnDetection, when set, is the turn_detection object the agent's
	// hello asks for (docs/bridge.md §4.8, its cleaning members
	// included): the echo still sends every frame back, while the
	// transceiver runs turn detection and input cleaning on the way in
	// (bench/transceiver measures their cost this way). Nil: none.
	TurnDetection json.RawMessage
}

// NewEchoConfig is NewEcho with a choice of format. It returns an error
// naming the formats when cfg.Format is not one of them.
func NewEchoConfig(cfg EchoConfig) (http.Handler, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch cfg.Format {
	case "":
		cfg.Format = bridge.FormatOpus
	case bridge.FormatOpus, bridge.FormatPCM24k, bridge.FormatPCM16k:
	default:
		return nil, fmt.Errorf("agent: echo format %q: want %s, %s or %s", cfg.Format, bridge.FormatOpus, bridge.FormatPCM24k, bridge.FormatPCM16k)
	}
	if cfg.TurnDetection != nil && !bridge.IsJSONObject(cfg.TurnDetection) {
		return nil, fmt.Errorf("agent: echo turn_detection %.64q is not a JSON object", cfg.TurnDetection)
	}
	return &echo{logger: cfg.Logger, format: cfg.Format, td: cfg.TurnDetection}, nil
}

// NewEcho returns an http.Handler serving the bridge (v1: one session per
// WebSocket; v2: many, docs/bridge.md §12) at any path; mount it at "/v1/bridge". It accepts
// bridge.FormatOpus, sends every audio frame back unchanged (same
// sequence number, timestamp and payload) and every event back
// unchanged, and logs session start and end through logger (nil means
// slog.Default()).
//
// Each session ends when the transceiver sends session.end (the agent
// then completes the close handshake), when the connection drops, or on
// a protocol error; ServeHTTP returns when its connection's sessions have
// ended, and leaves no goroutine behind. Closing the
// http.Server does not end hijacked bridge connections: end sessions
// from the transceiver side.
func NewEcho(logger *slog.Logger) http.Handler {
	h, _ := NewEchoConfig(EchoConfig{Logger: logger})
	return h
}

func (e *echo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	handshakeErr := func(err error) { e.logger.Warn("bridge handshake failed", "remote", r.RemoteAddr, "err", err) }
	err := bridge.Serve(w, r, bridge.AcceptOptions{Formats: []string{e.format}, TurnDetection: e.td, HandshakeError: handshakeErr}, e.serveSession)
	if err != nil {
		handshakeErr(err)
	}
}

// serveSession runs one bridge session (one per v1 WebSocket, many per
// v2 connection, each in its own goroutine).
func (e *echo) serveSession(sc *bridge.ServerConn) {
	log := e.logger.With("session_id", sc.Session().SessionID)
	log.Info("session start", "format", sc.Format(), "metadata", sc.Session().Metadata)

	frames, events, reason, err := e.run(sc)
	attrs := []any{"audio_frames", frames, "events", events, "ignored", sc.Ignored()}
	logSessionEnd(log, attrs, reason, err)
}

// run echoes until the transceiver ends the session (it returns its
// reason) or the connection fails.
func (e *echo) run(sc *bridge.ServerConn) (frames, events int, reason string, err error) {
	// The connection is hijacked: it lives until one side closes it, so
	// the context is not tied to the request.
	ctx := context.Background()
	for {
		m, err := sc.Recv(ctx)
		if err != nil {
			return frames, events, "", err
		}
		switch {
		case m.Audio != nil:
			// SendAudio copies the payload before Recv reuses it. The
			// concealed flag is the transceiver's to set, not ours.
			f := *m.Audio
			f.Concealed = false
			if err := sc.SendAudio(ctx, f); err != nil {
				return frames, events, "", err
			}
			frames++
		case m.Event != nil:
			if err := sc.SendEvent(ctx, m.Event); err != nil {
				return frames, events, "", err
			}
			events++
		case m.End != nil:
			// The transceiver closes next; End completes the close
			// handshake without sending session.end back.
			_ = sc.End(ctx, m.End.Reason)
			return frames, events, m.End.Reason, nil
		}
	}
}

// logSessionEnd logs a bridge session's end with attrs: reason when run
// returned no error, connection_closed when the bridge closed under it, and
// a warning with the error otherwise.
func logSessionEnd(log *slog.Logger, attrs []any, reason string, err error) {
	switch {
	case err == nil:
		log.Info("session end", append(attrs, "reason", reason)...)
	case errors.Is(err, bridge.ErrClosed):
		log.Info("session end", append(attrs, "reason", "connection_closed", "err", err)...)
	default:
		log.Warn("session end", append(attrs, "reason", "error", "err", err)...)
	}
}
