package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// ParrotAgentConfig configures NewParrotAgent.
type ParrotAgentConfig struct {
	// Logger receives session start and end; nil means slog.Default().
	Logger *slog.Logger
	// Format is the PCM format the agent asks for: bridge.FormatPCM24k
	// (the default) or bridge.FormatPCM16k.
	Format string
	// TurnDetection is the turn_detection the agent asks the transceiver
	// for in its hello; nil means vad.DefaultTurnDetection() (OpenAI's
	// server VAD defaults, interruption on). Its InterruptResponse says
	// whether the edge cuts the reply on a speech start (barge-in) or the
	// agent does, with output.clear.
	TurnDetection *vad.TurnDetection
	// OwnVAD makes the agent detect turns itself on the PCM it receives,
	// with a vad.Detector configured by TurnDetection, and cut its reply
	// with output.clear: what a backend does when the edge does not cut.
	// The transceiver is still asked for turn detection, with
	// interrupt_response false, so that the client gets its
	// input_audio_buffer.* events; the agent ignores the edge's
	// input.speech_* messages. It exists to measure the edge against it
	// (bench/voice).
	OwnVAD bool
	// Trace, when set, is called for each input frame (TraceFrame, with
	// the frame's end on the input clock), each turn message and playout
	// report the agent gets (the kinds of traceKinds, with audio_ms or
	// played_ms) and each reply it sends (TraceReply, before its first
	// audio), for benchmarks: on the session's goroutine, but a reply
	// delayed by ReplyDelay on its timer's, so it must be safe for
	// concurrent use. It must not block.
	Trace func(ev TraceEvent)
	// MaxUtteranceMs bounds one reply, ms (0: DefaultMaxUtteranceMs).
	MaxUtteranceMs int
	// ReplyDelay makes the parrot answer like a real pipeline (speech
	// recognition, a model, speech synthesis): each reply's first audio
	// leaves this long after the turn event it answers, which is
	// input.speech_paused when TurnDetection asks for an early pause
	// (pause_duration_ms: the reply is prepared during the pause, and the
	// edge holds it until the stop), input.speech_stopped otherwise. A
	// reply withdrawn before then (input.speech_resumed, or the user
	// talking again) is not sent. 0: at once.
	ReplyDelay time.Duration
}

// TraceEvent is what ParrotAgentConfig.Trace reports.
type TraceEvent struct {
	Session string
	Kind    TraceKind
	// Ms is the frame's end (TraceFrame) or the turn's audio_ms, on the
	// session's input clock; for TraceReply, the reply's length.
	Ms int64
	// QuietLeadMs (TraceReply) is how long the reply plays before its
	// first 10 ms at or above −45 dBFS RMS: sound a listener's level
	// meter does not call sound yet.
	QuietLeadMs int64
}

// TraceKind says what a TraceEvent reports.
type TraceKind uint8

// Trace kinds.
const (
	TraceFrame TraceKind = iota
	TraceSpeechStarted
	TraceSpeechStopped
	// TraceReply: the agent is about to send a reply's first audio; Ms
	// is the reply's length.
	TraceReply
	// TraceSpeechPaused: input.speech_paused, Ms its audio_ms.
	TraceSpeechPaused
	// Playout reports from the transceiver, Ms their played_ms:
	// output.started (0), output.paused, output.resumed, output.cleared,
	// output.stopped.
	TraceOutputStarted
	TraceOutputPaused
	TraceOutputResumed
	TraceOutputCleared
	TraceOutputStopped
	// TraceTimeout: input.timeout_triggered, Ms its audio_ms.
	TraceTimeout
)

// traceKinds maps the control messages the trace reports to its kinds.
var traceKinds = map[string]TraceKind{
	bridge.TypeInputSpeechStarted:    TraceSpeechStarted,
	bridge.TypeInputSpeechStopped:    TraceSpeechStopped,
	bridge.TypeInputSpeechPaused:     TraceSpeechPaused,
	bridge.TypeOutputStarted:         TraceOutputStarted,
	bridge.TypeOutputPaused:          TraceOutputPaused,
	bridge.TypeOutputResumed:         TraceOutputResumed,
	bridge.TypeOutputCleared:         TraceOutputCleared,
	bridge.TypeOutputStopped:         TraceOutputStopped,
	bridge.TypeInputTimeoutTriggered: TraceTimeout,
}

// parrotAgent is the handler returned by NewParrotAgent.
type parrotAgent struct {
	cfg  ParrotAgentConfig
	td   vad.TurnDetection
	rate int
	// hello is the turn_detection sent in the hello (nil with OwnVAD).
	hello json.RawMessage
}

// NewParrotAgent returns an http.Handler serving the bridge (one session
// per WebSocket; mount it at "/v1/bridge") with the parrot: it asks for
// PCM and turn detection in its hello, and when the user stops talking
// (input.speech_stopped) it plays back what they said, sent in one burst
// that the transceiver's paced playout spreads over real time (from 2 ms
// before the first sound, faded in: the prefix padding's quiet start is
// not played, as a voice agent starts its reply with speech), tagged
// with output.response "resp_sb_N". When the user talks over a reply the
// edge cuts it (turn detection with interrupt_response), or the agent
// sends output.clear (interrupt_response false, or OwnVAD). An event from
// the client gets an "error" event back (code unsupported_event, as
// OpenAI's Realtime API answers events it does not handle), the first 16
// of a session; the parrot does nothing else with it.
//
// It returns an error naming the field of cfg to fix. Sessions end as
// NewEcho's do.
func NewParrotAgent(cfg ParrotAgentConfig) (http.Handler, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Format == "" {
		cfg.Format = bridge.FormatPCM24k
	}
	rate := bridge.SampleRate(cfg.Format)
	if rate == 0 {
		return nil, fmt.Errorf("agent: parrot format %q: want %s or %s", cfg.Format, bridge.FormatPCM24k, bridge.FormatPCM16k)
	}
	td := vad.DefaultTurnDetection()
	if cfg.TurnDetection != nil {
		td = *cfg.TurnDetection
	}
	if err := td.Validate(); err != nil {
		return nil, fmt.Errorf("agent: parrot turn detection: %w", err)
	}
	if cfg.MaxUtteranceMs < 0 {
		return nil, fmt.Errorf("agent: parrot max utterance %d ms: must not be negative", cfg.MaxUtteranceMs)
	}
	if cfg.ReplyDelay < 0 {
		return nil, fmt.Errorf("agent: parrot reply delay %v: must not be negative", cfg.ReplyDelay)
	}
	a := &parrotAgent{cfg: cfg, td: td, rate: rate}
	edge := td
	if cfg.OwnVAD {
		edge.InterruptResponse = false
	}
	a.hello, _ = json.Marshal(edge)
	return a, nil
}

func (a *parrotAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	handshakeErr := func(err error) { a.cfg.Logger.Warn("bridge handshake failed", "remote", r.RemoteAddr, "err", err) }
	opts := bridge.AcceptOptions{Formats: []string{a.cfg.Format}, TurnDetection: a.hello, HandshakeError: handshakeErr}
	if err := bridge.Serve(w, r, opts, a.serveSession); err != nil {
		handshakeErr(err)
	}
}

// serveSession runs one bridge session (one per v1 WebSocket, many per
// v2 connection, each in its own goroutine).
func (a *parrotAgent) serveSession(sc *bridge.ServerConn) {
	log := a.cfg.Logger.With("session_id", sc.Session().SessionID)
	log.Info("session start", "format", sc.Format(), "turn_detection", a.td.String(), "own_vad", a.cfg.OwnVAD)
	s, err := a.newSession(sc)
	if err != nil {
		log.Warn("parrot session", "err", err)
		_ = sc.End(context.Background(), bridge.ReasonError)
		return
	}
	reason, err := s.run()
	s.close() // a delayed reply's timer is done with s.replies
	attrs := []any{"replies", s.replies, "ignored", sc.Ignored()}
	logSessionEnd(log, attrs, reason, err)
}

// parrotSession is one bridge session of the parrot agent.
type parrotSession struct {
	a   *parrotAgent
	sc  *bridge.ServerConn
	id  string
	p   *Parrot
	det *vad.Detector // OwnVAD only
	// OwnVAD: the detector's clock against the frames' timestamps.
	detStarted bool
	detBase    int64 // input ms of the detector's first frame
	silence    []byte

	refusals int // error events sent for client events (refuseEvent)

	// mu guards what sends use: the reader's goroutine sends, and so does
	// a delayed reply's timer (ReplyDelay).
	mu      sync.Mutex
	seq     uint16
	ts      uint32
	replies int
	pending *time.Timer    // a delayed reply not sent yet
	timers  sync.WaitGroup // delayed replies being sent
}

func (a *parrotAgent) newSession(sc *bridge.ServerConn) (*parrotSession, error) {
	pause := a.td.PauseDurationMs
	if a.cfg.OwnVAD {
		pause = 0 // its own detector has no early pause
	}
	p, err := NewParrot(ParrotConfig{
		Rate:              a.rate,
		SilenceDurationMs: a.td.SilenceDurationMs,
		EdgeInterrupts:    !a.cfg.OwnVAD && a.td.InterruptResponse,
		MaxUtteranceMs:    a.cfg.MaxUtteranceMs,
		PauseDurationMs:   pause,
	})
	if err != nil {
		return nil, err
	}
	s := &parrotSession{a: a, sc: sc, p: p, id: sc.Session().SessionID}
	if a.cfg.OwnVAD {
		if s.det, err = vad.NewDetector(a.td, a.rate, vad.Frame20ms); err != nil {
			return nil, err
		}
		s.silence = make([]byte, s.det.FrameBytes())
	}
	return s, nil
}

func (s *parrotSession) close() {
	if s.det != nil {
		s.det.Close()
	}
	s.mu.Lock()
	if s.pending != nil && s.pending.Stop() {
		s.timers.Done()
	}
	s.pending = nil
	s.mu.Unlock()
	s.timers.Wait()
}

// run serves the session until the transceiver ends it (it returns its
// reason) or the connection fails.
func (s *parrotSession) run() (string, error) {
	ctx := context.Background() // the connection is hijacked
	for {
		m, err := s.sc.Recv(ctx)
		if err != nil {
			return "", err
		}
		switch {
		case m.Audio != nil:
			if err := s.p.Audio(m.Audio.Timestamp, m.Audio.Payload); err != nil {
				continue // odd length: the transceiver never sends one
			}
			if s.a.cfg.Trace != nil {
				end := (int64(m.Audio.Timestamp) + int64(len(m.Audio.Payload)/2)) * 1000 / int64(s.a.rate)
				s.a.cfg.Trace(TraceEvent{Session: s.id, Kind: TraceFrame, Ms: end})
			}
			if s.det != nil {
				if err := s.ownVAD(ctx, m.Audio); err != nil {
					return "", err
				}
			}
		case m.Control != nil:
			if s.det != nil && (m.Control.Type == bridge.TypeInputSpeechStarted || m.Control.Type == bridge.TypeInputSpeechStopped) {
				continue // OwnVAD: the edge's turns are not ours
			}
			ms := m.Control.AudioMs
			switch m.Control.Type {
			case bridge.TypeOutputCleared, bridge.TypeOutputStopped, bridge.TypeOutputPaused, bridge.TypeOutputResumed:
				ms = m.Control.PlayedMs
			}
			s.trace(m.Control.Type, ms)
			if r, ok := s.p.Handle(m.Control.Type, ms); ok {
				if err := s.send(ctx, r); err != nil {
					return "", err
				}
			}
		case m.Event != nil:
			if err := s.refuseEvent(ctx, m.Event); err != nil {
				return "", err
			}
		case m.End != nil:
			_ = s.sc.End(ctx, m.End.Reason)
			return m.End.Reason, nil
		}
	}
}

// maxRefusals bounds the error events a parrot session sends for client
// events (refuseEvent), so that a client cannot make it send without end.
const maxRefusals = 16

// refuseEvent answers a client's data-channel event, which the parrot
// does not act on, the way OpenAI's Realtime API answers a client event it
// does not handle: an "error" event naming it, so that a client (the demo
// page's Ping) learns that nothing will echo, instead of waiting. Text
// that is not a JSON object with a "type" gets no answer; neither does
// any event after the first maxRefusals.
func (s *parrotSession) refuseEvent(ctx context.Context, event []byte) error {
	var ev struct {
		Type    string `json:"type"`
		EventID string `json:"event_id"`
	}
	if json.Unmarshal(event, &ev) != nil || ev.Type == "" || s.refusals >= maxRefusals {
		return nil
	}
	s.refusals++
	b, err := json.Marshal(map[string]any{"type": "error", "error": map[string]any{
		"type":     "invalid_request_error",
		"code":     "unsupported_event",
		"message":  fmt.Sprintf("the parrot agent does not act on client events (got %q): it answers your speech; switchboard agent -mode echo echoes data-channel messages", ev.Type),
		"event_id": ev.EventID,
	}})
	if err != nil {
		return err
	}
	return s.sc.SendEvent(ctx, b)
}

// ownVAD feeds the agent's own detector with frame f (silence for time
// the timestamps skip) and acts on its events as on the edge's.
func (s *parrotSession) ownVAD(ctx context.Context, f *bridge.AudioFrame) error {
	at := int64(f.Timestamp) * 1000 / int64(s.a.rate)
	if !s.detStarted {
		s.detStarted, s.detBase = true, at
	}
	frames := [][]byte{}
	fm := int64(s.det.FrameMs())
	if gap := (at - s.detBase - s.det.PositionMs()) / fm; gap > 0 {
		for range min(gap, 500) {
			frames = append(frames, s.silence)
		}
		s.detBase += max(0, gap-500) * fm
	}
	frames = append(frames, f.Payload)
	for _, fr := range frames {
		ev, err := s.det.Process(fr)
		if err != nil {
			return nil // a frame of another size: not ours to judge
		}
		var r Reply
		switch ev.Kind {
		case vad.SpeechStarted:
			s.trace(bridge.TypeInputSpeechStarted, ev.AudioMs+s.detBase)
			r = s.p.SpeechStarted(ev.AudioMs + s.detBase)
		case vad.SpeechStopped:
			s.trace(bridge.TypeInputSpeechStopped, ev.AudioMs+s.detBase)
			r = s.p.SpeechStopped(ev.AudioMs + s.detBase)
		default:
			continue
		}
		if err := s.send(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// trace reports a turn the agent acts on, or a playout report, to Trace.
func (s *parrotSession) trace(typ string, ms int64) {
	if s.a.cfg.Trace == nil {
		return
	}
	if k, ok := traceKinds[typ]; ok {
		s.a.cfg.Trace(TraceEvent{Session: s.id, Kind: k, Ms: ms})
	}
}

// send carries out r: a pending delayed reply cancelled (r.Cancel, or any
// newer reply or clear), output.clear, then the reply's audio in one
// burst, tagged with a fresh response id: at once, or after ReplyDelay.
func (s *parrotSession) send(ctx context.Context, r Reply) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Cancel || r.Clear || len(r.Audio) > 0 {
		if s.pending != nil && s.pending.Stop() {
			s.timers.Done()
		}
		s.pending = nil
	}
	if r.Clear {
		if err := s.sc.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputClear}); err != nil {
			return err
		}
	}
	audio := trimLeadingQuiet(r.Audio, s.a.rate) // a copy: a delayed reply does not alias the parrot's buffer
	if len(audio) == 0 {
		return nil
	}
	if d := s.a.cfg.ReplyDelay; d > 0 {
		s.timers.Add(1)
		var t *time.Timer
		t = time.AfterFunc(d, func() {
			defer s.timers.Done()
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.pending != t {
				return // cancelled while it fired
			}
			s.pending = nil
			_ = s.sendReplyLocked(ctx, audio) // a failed send ends the session's reader too
		})
		s.pending = t
		return nil
	}
	return s.sendReplyLocked(ctx, audio)
}

// sendReplyLocked sends one reply's audio (PCM at the session's rate,
// trimmed), tagged with a fresh response id. s.mu held.
func (s *parrotSession) sendReplyLocked(ctx context.Context, audio []byte) error {
	s.replies++
	if s.a.cfg.Trace != nil {
		s.a.cfg.Trace(TraceEvent{s.id, TraceReply, int64(len(audio) / 2 * 1000 / s.a.rate), quietLeadMs(audio, s.a.rate)})
	}
	if err := s.sc.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputResponse, ID: "resp_sb_" + strconv.Itoa(s.replies)}); err != nil {
		return err
	}
	const chunk = 64 << 10 // bytes per message, well under bridge.MaxMessageSize
	for b := audio; len(b) > 0; {
		n := min(len(b), chunk)
		if err := s.sc.SendAudio(ctx, bridge.AudioFrame{Seq: s.seq, Timestamp: s.ts, Payload: b[:n]}); err != nil {
			return err
		}
		s.seq++
		s.ts += uint32(n / 2)
		b = b[n:]
	}
	return nil
}

// Agent modes, the values of `switchboard agent -mode` and demo.Config.Agent.
const (
	// ModeParrot is the turn-taking parrot (NewParrotAgent), the default.
	ModeParrot = "parrot"
	// ModeEcho sends every frame and event back (NewEchoConfig).
	ModeEcho = "echo"
)

// ParrotOptions are the parrot's settings that NewMode passes on
// (ParrotAgentConfig's fields of the same names); the echo takes none.
type ParrotOptions struct {
	// TurnDetection is the turn_detection the parrot asks for; nil:
	// OpenAI's server VAD defaults.
	TurnDetection *vad.TurnDetection
	// ReplyDelay delays each reply like a real pipeline's latency.
	ReplyDelay time.Duration
}

// NewMode returns the reference agent for mode (ModeParrot when empty) in
// format (empty: the mode's default, PCM at 24 kHz for the parrot, Opus
// for the echo), the parrot with opts. It returns an error naming the
// modes or formats when either is not one of them, and one saying so
// when opts are set for the echo.
func NewMode(mode, format string, logger *slog.Logger, opts ParrotOptions) (http.Handler, error) {
	switch mode {
	case "", ModeParrot:
		return NewParrotAgent(ParrotAgentConfig{Logger: logger, Format: format, TurnDetection: opts.TurnDetection, ReplyDelay: opts.ReplyDelay})
	case ModeEcho:
		if opts != (ParrotOptions{}) {
			return nil, fmt.Errorf("agent: mode %s takes no turns: a turn detection or reply delay is for mode %s", ModeEcho, ModeParrot)
		}
		return NewEchoConfig(EchoConfig{Logger: logger, Format: format})
	}
	return nil, fmt.Errorf("agent: mode %q: want %s or %s", mode, ModeParrot, ModeEcho)
}

// quietPeak is the sample magnitude from which trimLeadingQuiet counts a
// reply's sound as begun: −40 dBFS.
const quietPeak = 328

// replyLeadMs is how much of the quiet before a reply's first sound the
// parrot plays, faded in from silence: enough that the cut is no click
// (the lead is under quietPeak, and the ramp takes it from zero), short
// enough that the reply's first packet carries its sound. A reply cut at
// a 10 ms block boundary started with 10 ms of quiet at the median, which
// the listener waited through (docs/benchmarks.md, turn-taking).
const replyLeadMs = 2

// trimLeadingQuiet returns a copy of pcm (PCM16 little-endian at rate Hz)
// from replyLeadMs before its first sample whose magnitude reaches
// quietPeak, that lead faded in linearly from zero; all of it, the start
// faded in the same way, when the sound comes sooner; nil when it has
// none. pcm is not modified.
func trimLeadingQuiet(pcm []byte, rate int) []byte {
	lead := rate * replyLeadMs / 1000 // samples
	for i := 0; i+1 < len(pcm); i += 2 {
		v := int(int16(binary.LittleEndian.Uint16(pcm[i:])))
		if v < quietPeak && v > -quietPeak {
			continue
		}
		out := bytes.Clone(pcm[max(0, i-2*lead):])
		for k := range min(lead, len(out)/2) {
			s := int(int16(binary.LittleEndian.Uint16(out[2*k:])))
			binary.LittleEndian.PutUint16(out[2*k:], uint16(int16(s*k/lead)))
		}
		return out
	}
	return nil
}

// quietLeadMs returns the ms of pcm (PCM16 little-endian at rate Hz)
// before its first 10 ms block whose RMS reaches −45 dBFS, or its length.
func quietLeadMs(pcm []byte, rate int) int64 {
	block := 2 * rate / 100
	const min = 32768 * 32768 / 31623 // −45 dBFS mean power, in sample units²
	for off := 0; off+block <= len(pcm); off += block {
		var sum int64
		for i := off; i+1 < off+block; i += 2 {
			v := int64(int16(uint16(pcm[i]) | uint16(pcm[i+1])<<8))
			sum += v * v
		}
		if sum/int64(block/2) >= min {
			return int64(off / block * 10)
		}
	}
	return int64(len(pcm) / 2 * 1000 / rate)
}
