package agent

import (
	"errors"
	"fmt"
	"slices"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// DefaultMaxUtteranceMs is ParrotConfig.MaxUtteranceMs when zero.
const DefaultMaxUtteranceMs = 30000

// parrotHistoryMs is how much input the parrot keeps while nobody is
// talking: a speech start arrives after the onset (the detector's
// latency) and points before it (the prefix padding, at most 2000 ms).
const parrotHistoryMs = 3000

// ErrPCMLength is returned by Parrot.Audio for a payload that is not
// whole 16-bit samples.
var ErrPCMLength = errors.New("agent: PCM payload is not whole 16-bit samples")

// ParrotConfig configures a Parrot.
type ParrotConfig struct {
	// Rate is the bridge format's sample rate, Hz (16000 or 24000).
	Rate int
	// SilenceDurationMs is the turn_detection silence window the agent
	// asked the transceiver for: the end of each utterance that is only
	// that silence is not played back.
	SilenceDurationMs int
	// EdgeInterrupts is turn_detection.interrupt_response: the
	// transceiver clears the output queue on a speech start by itself,
	// so the parrot does not send output.clear (a clear of an empty queue
	// would only be answered with an error).
	EdgeInterrupts bool
	// MaxUtteranceMs bounds what one reply replays, ms (0:
	// DefaultMaxUtteranceMs); audio past it is dropped.
	MaxUtteranceMs int
	// PauseDurationMs is turn_detection.pause_duration_ms, the early
	// pause the parrot asked the transceiver for: it prepares its reply at
	// input.speech_paused (the utterance up to that pause's speech end),
	// which the edge holds until the stop, and does not reply again at
	// the stop. 0: it replies at the stop.
	PauseDurationMs int
}

// Reply is what the parrot wants sent after an input.
type Reply struct {
	// Clear: send bridge.TypeOutputClear before anything else.
	Clear bool
	// Cancel: a reply not sent yet (one a pipeline is still preparing)
	// is no longer wanted.
	Cancel bool
	// Audio, when not empty, is PCM16 little-endian mono at the session's
	// rate to send at once, in as many bridge messages as it takes: one
	// burst that the transceiver's playout paces. It aliases the
	// parrot's buffer and is valid until the next call.
	Audio []byte
}

// Parrot is the turn-taking logic of the reference parrot agent: it
// listens; when the user stops talking it plays back what they said, in
// one burst (prepared at the early pause, with PauseDurationMs); when the
// user talks over it, it stops; an utterance that let its paused reply
// resume (output.resumed: a cough, a backchannel) gets no reply. It does
// no I/O: the bridge loop feeds it input frames and control messages and
// sends what it returns. Not safe for concurrent use.
//
// Positions are on the session's input clock, in ms: an input frame's
// timestamp (samples at Rate, from 0 at the stream's first sample, with
// 32-bit wrap) is at timestamp×1000/Rate ms, which is the clock audio_ms
// counts on. Time the timestamps skip (DTX) is taken as silence.
type Parrot struct {
	cfg         ParrotConfig
	bytesPerMs  int64
	maxUtter    int64 // bytes
	historyByte int64

	// The input clock.
	started bool
	lastTS  uint32
	extTS   int64 // lastTS unwrapped
	next    int64 // byte position just after the last frame taken

	// buf holds input audio from bufStart (bytes on the input clock:
	// unwrapped timestamp × 2) to bufEnd(), which is next unless an
	// utterance hit MaxUtteranceMs.
	buf      []byte
	bufStart int64

	listening  bool  // between a speech start and its stop
	utterStart int64 // byte position of the utterance's start
	speaking   bool  // a reply was sent and has not been cleared or drained
	dropped    int64 // bytes of utterance audio dropped by MaxUtteranceMs
	// prepared: a reply to the utterance was returned at its early pause
	// and not withdrawn (input.speech_resumed): the stop plays it.
	prepared bool
	// backchannel: the utterance let a reply it paused resume: not a turn.
	backchannel bool
}

// NewParrot returns a Parrot, or an error naming the field of cfg to fix.
func NewParrot(cfg ParrotConfig) (*Parrot, error) {
	if cfg.Rate != 16000 && cfg.Rate != 24000 {
		return nil, fmt.Errorf("agent: parrot rate %d Hz: must be 16000 or 24000", cfg.Rate)
	}
	if cfg.SilenceDurationMs < 0 {
		return nil, fmt.Errorf("agent: parrot silence duration %d ms: must not be negative", cfg.SilenceDurationMs)
	}
	if cfg.MaxUtteranceMs < 0 {
		return nil, fmt.Errorf("agent: parrot max utterance %d ms: must not be negative", cfg.MaxUtteranceMs)
	}
	if cfg.PauseDurationMs < 0 || (cfg.PauseDurationMs > 0 && cfg.PauseDurationMs >= cfg.SilenceDurationMs) {
		return nil, fmt.Errorf("agent: parrot pause duration %d ms: must be 0 or under the silence duration (%d ms)", cfg.PauseDurationMs, cfg.SilenceDurationMs)
	}
	if cfg.MaxUtteranceMs == 0 {
		cfg.MaxUtteranceMs = DefaultMaxUtteranceMs
	}
	p := &Parrot{cfg: cfg, bytesPerMs: int64(2 * cfg.Rate / 1000)}
	p.maxUtter = int64(cfg.MaxUtteranceMs) * p.bytesPerMs
	p.historyByte = parrotHistoryMs * p.bytesPerMs
	return p, nil
}

// Speaking reports whether a reply is out: sent, and neither cleared nor
// drained yet.
func (p *Parrot) Speaking() bool { return p.speaking }

// Listening reports whether the user is talking (a speech start without
// its stop).
func (p *Parrot) Listening() bool { return p.listening }

// DroppedMs returns how much utterance audio MaxUtteranceMs cut, ms.
func (p *Parrot) DroppedMs() int64 { return p.dropped / p.bytesPerMs }

// Audio takes one input frame: timestamp in samples at Rate (the bridge
// frame's timestamp) and its PCM16 payload. A frame older than one
// already taken is ignored; time skipped since the last frame is filled
// with silence. It returns ErrPCMLength, taking nothing, for an odd
// payload length.
func (p *Parrot) Audio(timestamp uint32, pcm []byte) error {
	if len(pcm)%2 != 0 {
		return ErrPCMLength
	}
	if !p.started {
		p.started = true
		p.lastTS, p.extTS = timestamp, int64(timestamp)
		p.bufStart = 2 * p.extTS
		p.next = p.bufStart
		if p.listening {
			p.utterStart = p.bufStart // a start came before any audio
		}
	} else {
		p.extTS += int64(int32(timestamp - p.lastTS))
		p.lastTS = timestamp
	}
	at := 2 * p.extTS // byte position of this frame on the input clock
	if at < p.next {
		return nil // a repeat or reordered frame: its time is taken
	}
	gap := at - p.next
	bufEnd := p.bufEnd()
	p.next = at + int64(len(pcm))
	if p.listening {
		// Silence for the skipped time, then the frame, up to the cap.
		limit := min(p.next, p.utterStart+p.maxUtter)
		if bufEnd < at-gap || limit <= bufEnd {
			p.dropped += p.next - max(bufEnd, at-gap)
			return nil
		}
		silence := min(gap, limit-bufEnd)
		p.appendSilence(silence)
		take := limit - bufEnd - silence
		p.buf = append(p.buf, pcm[:take]...)
		p.dropped += p.next - limit
		return nil
	}
	if gap > p.historyByte {
		// A long skip: what was kept is too old to matter.
		p.buf, p.bufStart = p.buf[:0], at
	} else {
		p.appendSilence(gap)
	}
	p.buf = append(p.buf, pcm...)
	p.trimHistory()
	return nil
}

// bufEnd is the input clock position just after the audio held.
func (p *Parrot) bufEnd() int64 { return p.bufStart + int64(len(p.buf)) }

// appendSilence appends n zero bytes to buf.
func (p *Parrot) appendSilence(n int64) {
	p.buf = slices.Grow(p.buf, int(n))
	l := len(p.buf)
	p.buf = p.buf[:l+int(n)]
	clear(p.buf[l:])
}

// trimHistory keeps the last parrotHistoryMs of input while nobody is
// talking, moving the buffer's contents only when twice that is held.
func (p *Parrot) trimHistory() {
	if int64(len(p.buf)) <= 2*p.historyByte {
		return
	}
	drop := int64(len(p.buf)) - p.historyByte
	drop -= drop % 2
	n := copy(p.buf, p.buf[drop:])
	p.buf = p.buf[:n]
	p.bufStart += drop
}

// SpeechStarted takes input.speech_started: the user started talking at
// audioMs. A reply not sent yet is cancelled; if a reply is out it is cut
// (Clear, unless the edge clears by itself); the utterance is recorded
// from audioMs, or from the oldest audio kept if that is later.
func (p *Parrot) SpeechStarted(audioMs int64) Reply {
	r := Reply{Cancel: true} // a reply still being prepared answers what is no longer the last turn
	if p.speaking {
		r.Clear = !p.cfg.EdgeInterrupts
		p.speaking = false
	}
	if p.bufEnd() != p.next {
		// The last utterance hit the cap: nothing held is current.
		p.buf, p.bufStart = p.buf[:0], p.next
	}
	start := min(max(clampMs(audioMs)*p.bytesPerMs, p.bufStart), p.bufEnd())
	n := copy(p.buf, p.buf[start-p.bufStart:])
	p.buf = p.buf[:n]
	p.bufStart = start
	p.utterStart = start
	p.listening = true
	p.dropped = 0
	p.prepared, p.backchannel = false, false
	if over := int64(len(p.buf)) - p.maxUtter; over > 0 {
		// The start is further back than the cap reaches.
		p.buf = p.buf[:p.maxUtter]
		p.dropped = over
	}
	return r
}

// SpeechStopped takes input.speech_stopped: the user's utterance ended
// at audioMs (its silence window included). The reply is the utterance
// from its start up to audioMs less the silence window, sent at once;
// none when it was prepared at the early pause (SpeechPaused: the edge
// plays that one now) or when the utterance was a backchannel
// (OutputResumed). A stop without a start is ignored.
func (p *Parrot) SpeechStopped(audioMs int64) Reply {
	if !p.listening {
		return Reply{}
	}
	p.listening = false
	var r Reply
	switch {
	case p.backchannel:
		// A cough or a backchannel over the reply, which goes on.
	case p.prepared:
		p.speaking = true // the reply prepared at the pause plays now
	default:
		if r.Audio = p.utterance(clampMs(audioMs) - int64(p.cfg.SilenceDurationMs)); r.Audio != nil {
			p.speaking = true
		}
	}
	if p.bufEnd() != p.next {
		// Capped: start the history afresh at the clock (the reply
		// stays valid until the next call).
		p.buf, p.bufStart = p.buf[:0], p.next
	}
	return r
}

// utterance returns the utterance from its start to endMs on the input
// clock, or nil if that is empty.
func (p *Parrot) utterance(endMs int64) []byte {
	end := min(endMs*p.bytesPerMs, p.bufEnd())
	start := max(p.utterStart, p.bufStart)
	if end <= start {
		return nil
	}
	return p.buf[start-p.bufStart : end-p.bufStart]
}

// SpeechPaused takes input.speech_paused: with PauseDurationMs, the
// reply to the utterance up to its speech end (audioMs less the early
// pause) is prepared now: the edge holds it until the stop. The
// utterance goes on being recorded (the user may go on). Without
// PauseDurationMs, during a backchannel or with no utterance, nothing.
func (p *Parrot) SpeechPaused(audioMs int64) Reply {
	if !p.listening || p.backchannel || p.cfg.PauseDurationMs == 0 {
		return Reply{}
	}
	r := Reply{Audio: p.utterance(clampMs(audioMs) - int64(p.cfg.PauseDurationMs))}
	p.prepared = r.Audio != nil
	return r
}

// SpeechResumed takes input.speech_resumed: the reply prepared at the
// pause is withdrawn (the edge dropped what of it was sent); one not yet
// sent is cancelled.
func (p *Parrot) SpeechResumed(audioMs int64) Reply {
	p.prepared = false
	return Reply{Cancel: true}
}

// OutputResumed takes output.resumed: speech over the reply paused it and
// went quiet before it was a turn; the reply goes on, and that utterance
// gets no reply.
func (p *Parrot) OutputResumed(playedMs int64) {
	p.speaking = true
	if p.listening {
		p.backchannel = true
	}
}

// clampMs bounds a position from the wire so that it converts to bytes
// without overflow (2^40 ms is 35 years).
func clampMs(ms int64) int64 { return min(max(ms, -1<<40), 1<<40) }

// OutputCleared takes output.cleared: the reply, if any, is gone (and
// speech that paused it is a turn).
func (p *Parrot) OutputCleared(playedMs int64) {
	p.speaking = false
	p.backchannel = false
}

// OutputStopped takes output.stopped: the reply has been played out.
func (p *Parrot) OutputStopped(playedMs int64) { p.speaking = false }

// Handle dispatches a control message by its wire type (the Msg…
// constants) and its audio_ms or played_ms; ok is false for a type the
// parrot does not take, which it ignores.
func (p *Parrot) Handle(msgType string, ms int64) (r Reply, ok bool) {
	switch msgType {
	case bridge.TypeInputSpeechStarted:
		return p.SpeechStarted(ms), true
	case bridge.TypeInputSpeechStopped:
		return p.SpeechStopped(ms), true
	case bridge.TypeInputSpeechPaused:
		return p.SpeechPaused(ms), true
	case bridge.TypeInputSpeechResumed:
		return p.SpeechResumed(ms), true
	case bridge.TypeOutputResumed:
		p.OutputResumed(ms)
		return Reply{}, true
	case bridge.TypeOutputCleared:
		p.OutputCleared(ms)
		return Reply{}, true
	case bridge.TypeOutputStopped:
		p.OutputStopped(ms)
		return Reply{}, true
	}
	return Reply{}, false
}
