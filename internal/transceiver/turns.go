package transceiver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pion/rtp"

	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// This file is a session's turn detection (docs/bridge.md §4.8): a
// vad.Detector fed with the decoded input on the track goroutine, which
// reports input.speech_started / input.speech_stopped to the backend,
// OpenAI's input_audio_buffer.speech_* events to the client, and clears
// the output queue on a speech start (barge-in) when interruption is on.
//
//	client RTP ─▶ mediaPath.toBackend ─▶ bridge
//	                                  └─▶ decoded frames ─▶ vad.Input ─▶ reportTurns
//	                          (Opus passthrough: turns.opus, a 16 kHz decoder of its own)
//
// When the client sends 10 ms packets the detector takes 10 ms frames,
// and each packet's audio is fed to it as soon as it is decoded
// (vad.Input.Partial): the first half of a 20 ms frame does not wait for
// the packet that completes it, so the speech end and the silence
// window's end fall on a 10 ms grid and the stop is sent with the packet
// that ends the window, about 5 ms sooner on average (docs/vad.md).

// clearSourceTurn labels switchboard_transceiver_output_clears_total for
// a barge-in: turn detection heard the user start talking.
const clearSourceTurn = "turn"

// opusVADRate is the rate at which an Opus passthrough session's input is
// decoded for turn detection only: WebRTC's VAD looks at the band below
// 4 kHz, and 16 kHz is the cheapest rate the detector takes.
const opusVADRate = vad.Rate16k

// turnSwitch is a turn detection setting waiting for the track goroutine:
// cfg nil switches turn detection off.
type turnSwitch struct {
	cfg *vad.TurnDetection
}

// turns is a session's turn detection. Everything but next is owned by
// the track goroutine (fromClient), which feeds it.
type turns struct {
	// next is the setting to apply before the next frame: from the
	// backend's hello, or an input.turn_detection the bridge reader got.
	next atomic.Pointer[turnSwitch]

	in  vad.Input         // the detector and its input clock
	cfg vad.TurnDetection // the detector's setting, while in has one
	dec *audio.Decoder    // Opus passthrough only: decodes for the detector
	evs []vad.Event       // scratch for in's events
}

// turnsWait returns how long the track goroutine may wait for the next
// packet before idleTurns is due, or 0 to wait without limit.
func (m *mediaPath) turnsWait(now time.Time) time.Duration { return m.turns.in.Wait(now) }

// idleTurns runs the silence window on wall time when the client sent
// nothing for vad.IdleGrace while the user was talking (vad.Input.Idle).
func (m *mediaPath) idleTurns(now time.Time) {
	t := &m.turns
	m.reportTurns(t.in.Idle(t.evs[:0], now))
}

// parseTurnDetection decodes a turn_detection member as sent: nil (or
// null) means off. The error says what to fix.
func parseTurnDetection(raw json.RawMessage) (*vad.TurnDetection, error) {
	if raw == nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, nil
	}
	var td vad.TurnDetection
	if err := json.Unmarshal(raw, &td); err != nil {
		return nil, fmt.Errorf("%w: %v", vad.ErrConfig, err)
	}
	if err := td.Validate(); err != nil {
		return nil, err
	}
	return &td, nil
}

// setTurnDetection takes a turn_detection from the backend (its hello or
// an input.turn_detection): a bad one is answered with an error and
// changes nothing; a good one is applied before the next input frame.
func (m *mediaPath) setTurnDetection(raw json.RawMessage, from string) {
	td, err := parseTurnDetection(raw)
	if err != nil {
		m.refuse(refusedTurnDetection, bridge.ErrCodeTurnDetection, fmt.Sprintf("%s: %v; turn detection unchanged", from, err))
		return
	}
	var interrupt bool
	if td != nil {
		interrupt = td.InterruptResponse
	} else {
		raw = nil
	}
	if !m.setCleaning(raw, interrupt, from) {
		return
	}
	m.turns.next.Store(&turnSwitch{cfg: td})
}

// applyTurns applies a turn detection setting that came since the last
// packet. It runs on the track goroutine, once per client packet, before
// the packet (payload, the client's Opus) is decoded.
func (m *mediaPath) applyTurns(payload []byte) {
	t := &m.turns
	if t.next.Load() == nil {
		return
	}
	if sw := t.next.Swap(nil); sw != nil {
		m.switchTurns(sw.cfg, turnsFrameMs(payload))
	}
}

// turnsFrameMs returns the length of the detector's frames for a client
// that sends packets like payload: 10 ms for packets of 10 ms or less
// (the transceiver's -ptime 10 asks for them), so turns are placed and
// reported on a 10 ms grid; 20 ms otherwise: 20 ms packets bring audio
// 20 ms at a time, so 10 ms frames would not report a stop sooner, and
// they report a start about 5 ms later on average (the onset needs 40 ms
// of speech in either, and a 20 ms frame counts whole when speech fills
// part of it), for 1.2–1.4 times the CPU (docs/vad.md).
func turnsFrameMs(payload []byte) int {
	if d, err := audio.PacketDuration(payload); err == nil && d <= 480 {
		return vad.Frame10ms
	}
	return vad.Frame20ms
}

// opus runs turn detection on one client Opus packet of an Opus
// passthrough session, appending to dst: it keeps the input clock (the RTP
// timestamp from the first packet, docs/bridge.md §4.8) and, with turn
// detection on, decodes the packet at 16 kHz for the detector only.
func (t *turns) opus(dst []vad.Event, pkt *rtp.Packet, now time.Time) ([]vad.Event, error) {
	t.in.RTP(pkt.Timestamp, t.dec != nil && t.dec.Stats().Packets == 0)
	if t.in.Detector() == nil {
		return dst, nil
	}
	var err error
	for _, f := range t.dec.Push(pkt.SequenceNumber, pkt.Timestamp, pkt.Payload) {
		if dst, err = t.in.Frame(dst, f.Timestamp, f.PCM, now); err != nil {
			return dst, err
		}
	}
	p := t.dec.Partial()
	return t.in.Partial(dst, p.Timestamp, p.PCM, now)
}

// reportTurns reports what the detector saw, in order; err is a detector
// failure, which switched it off.
func (m *mediaPath) reportTurns(evs []vad.Event, err error) {
	for _, ev := range evs {
		switch ev.Kind {
		case vad.SpeechStarted:
			m.speechStarted(ev.AudioMs)
		case vad.SpeechStopped:
			m.speechStopped(ev.AudioMs)
		}
	}
	m.turns.evs = evs[:0]
	if err != nil {
		m.log.Warn("turn detection failed; switched off", "err", err)
	}
}

// speechStarted reports a speech start at audioMs and, with interruption
// on, clears the output queue first: the agent goes quiet at the next
// tick, before any message is written. turnMu keeps the clear's
// output.cleared (sent by drainEvents) behind input.speech_started.
func (m *mediaPath) speechStarted(audioMs int64) {
	t := &m.turns
	m.turnMu.Lock()
	defer m.turnMu.Unlock()
	if t.cfg.InterruptResponse && !m.q.Idle() {
		m.clearOutput(clearSourceTurn)
	}
	m.metrics.turns.WithLabelValues(vad.SpeechStarted.String()).Inc()
	m.sendControl(bridge.Control{Type: bridge.TypeInputSpeechStarted, AudioMs: audioMs})
	m.client.speechStarted(audioMs)
}

// speechStopped reports a speech stop at audioMs.
func (m *mediaPath) speechStopped(audioMs int64) {
	m.metrics.turns.WithLabelValues(vad.SpeechStopped.String()).Inc()
	m.sendControl(bridge.Control{Type: bridge.TypeInputSpeechStopped, AudioMs: audioMs})
	m.client.speechStopped(audioMs)
}

// switchTurns replaces the detector (cfg nil: none), with one taking
// frames of frameMs. An utterance in progress is closed with a speech
// stop at the current position, so starts and stops always pair.
func (m *mediaPath) switchTurns(cfg *vad.TurnDetection, frameMs int) {
	t := &m.turns
	m.reportTurns(t.in.SetDetector(t.evs[:0], nil), nil)
	if cfg == nil {
		return
	}
	rate := bridge.SampleRate(m.be.Format())
	if rate == 0 {
		rate = opusVADRate
		if t.dec == nil {
			dec, err := audio.NewDecoder(rate)
			if err != nil {
				m.log.Warn("turn detection: opus decoder", "err", err)
				return
			}
			t.dec = dec
		}
	}
	det, err := vad.NewDetector(*cfg, rate, frameMs)
	if err != nil {
		code := bridge.ErrCodeTurnDetection
		if errors.Is(err, vad.ErrUnavailable) {
			m.log.Warn("turn detection unavailable", "err", err)
		}
		m.refuse(refusedTurnDetection, code, fmt.Sprintf("turn detection: %v", err))
		return
	}
	t.cfg = det.Config()
	t.in.SetDetector(nil, det)
	m.log.Debug("turn detection on", "turn_detection", cfg.String())
}

// stopTurns frees the detector when the track goroutine ends.
func (m *mediaPath) stopTurns() {
	m.turns.in.Close()
	m.stopCleaning()
}
