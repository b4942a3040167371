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
// reports input.speech_started / input.speech_stopped (and, with an early
// pause, input.speech_paused / input.speech_resumed) to the backend,
// OpenAI's input_audio_buffer.speech_* events to the client, clears or
// pauses the output queue on a speech start (barge-in) when interruption
// is on, and holds the reply to a tentative end of turn; idle.go is its
// idle timeout.
//
//	client RTP ─▶ mediaPath.toBackend ─▶ bridge
//	                                  └─▶ decoded frames ─▶ vad.Input ─▶ reportTurns
//	                          (Opus passthrough: opusTurns, a 16 kHz decoder of its own)
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

// Labels of the turn-taking metrics.
const (
	interruptionCleared = "cleared"           // interruptions_total: the reply was cut
	interruptionResumed = "resumed"           // interruptions_total: the paused reply resumed
	heldPlayed          = "played"            // held_replies_total: the turn was confirmed
	heldDiscarded       = "discarded"         // held_replies_total: the user went on
	turnTimeout         = "timeout_triggered" // turn_events_total: the idle timeout
)

// opusVADRate is the rate at which an Opus passthrough session's input is
// decoded for turn detection only: WebRTC's VAD looks at the band below
// 4 kHz, and 16 kHz is the cheapest rate the detector takes.
const opusVADRate = vad.Rate16k

// turnSwitch is a turn detection setting waiting for the track goroutine:
// cfg nil switches turn detection off.
type turnSwitch struct {
	cfg *vad.TurnDetection
}

// turns is a session's turn detection. Everything but next and the
// clock's atomics is owned by the track goroutine (fromClient), which
// feeds it.
type turns struct {
	// next is the setting to apply before the next frame: from the
	// backend's hello, or an input.turn_detection the bridge reader got.
	next atomic.Pointer[turnSwitch]

	in  vad.Input         // the detector and its input clock
	cfg vad.TurnDetection // the detector's setting, while in has one
	dec *audio.Decoder    // Opus passthrough only: decodes for the detector
	evs []vad.Event       // scratch for in's events
	now time.Time         // when the frames being fed came

	// The utterance in progress, as the edge acts on it (below).
	overReply bool // it paused the agent's reply and is not a turn yet
	resumed   bool // it let a reply it paused resume
	tentative bool // input.speech_paused was sent for it, not yet followed up

	// The input clock's position after the last frames fed, ms, and when
	// they came (Unix ns): for the idle timeout's positions, read on its
	// timer's goroutine.
	clockMs, clockAt atomic.Int64
}

// fed records the input clock's position once frames that came at now
// have been fed to the detector.
func (t *turns) fed(now time.Time) {
	t.clockMs.Store(t.in.PositionMs())
	t.clockAt.Store(now.UnixNano())
}

// clockNow returns the input clock's position at wall time now, ms: where
// it was after the last frames fed, plus the time since they came (the
// client sends in real time, or nothing in DTX).
func (t *turns) clockNow(now time.Time) int64 {
	at := t.clockAt.Load()
	if at == 0 {
		return 0 // nothing fed yet
	}
	return t.clockMs.Load() + (now.UnixNano()-at)/int64(time.Millisecond)
}

// turnsWait returns how long the track goroutine may wait for the next
// packet before idleTurns is due, or 0 to wait without limit.
func (m *mediaPath) turnsWait(now time.Time) time.Duration { return m.turns.in.Wait(now) }

// idleTurns runs the silence window on wall time when the client sent
// nothing for vad.IdleGrace while the user was talking (vad.Input.Idle).
func (m *mediaPath) idleTurns(now time.Time) {
	t := &m.turns
	t.now = now
	m.reportTurns(t.in.Idle(t.evs[:0], now))
	t.fed(now)
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

// opusTurns runs turn detection on one client Opus packet of an Opus
// passthrough session, appending to dst: it keeps the input clock (the RTP
// timestamp from the first packet, docs/bridge.md §4.8) and, with turn
// detection on, decodes the packet at 16 kHz for the detector only,
// cleaned (echo cancellation, noise suppression) when that is on.
func (m *mediaPath) opusTurns(dst []vad.Event, pkt *rtp.Packet, now time.Time) ([]vad.Event, error) {
	t := &m.turns
	t.in.RTP(pkt.Timestamp, t.dec != nil && t.dec.Stats().Packets == 0)
	if t.in.Detector() == nil {
		return dst, nil
	}
	var err error
	for _, f := range t.dec.Push(pkt.SequenceNumber, pkt.Timestamp, pkt.Payload) {
		_, det := m.cleanFrame(f.Timestamp, f.PCM, now)
		if dst, err = t.in.Frame(dst, f.Timestamp, det, now); err != nil {
			return dst, err
		}
	}
	p := t.dec.Partial()
	return t.in.Partial(dst, p.Timestamp, m.cleanPartial(p.Timestamp, p.PCM, now), now)
}

// reportTurns reports what the detector saw, in order, and then whether
// speech over a paused reply has become a turn; err is a detector
// failure, which switched it off.
func (m *mediaPath) reportTurns(evs []vad.Event, err error) {
	for _, ev := range evs {
		switch ev.Kind {
		case vad.SpeechStarted:
			m.speechStarted(ev)
		case vad.SpeechStopped:
			m.speechStopped(ev)
		case vad.SpeechPaused:
			m.speechPaused(ev)
		case vad.SpeechResumed:
			m.speechResumed(ev)
		}
	}
	m.turns.evs = evs[:0]
	m.watchInterruption()
	if err != nil {
		m.log.Warn("turn detection failed; switched off", "err", err)
		m.turnMu.Lock()
		m.idle.set(0, time.Time{}) // its idle timeout goes with it
		m.turnMu.Unlock()
	}
}

// The turn in progress, as the edge acts on it (docs/bridge.md §4.8):
//
//   - a speech start over the agent's reply clears the output queue
//     (interrupt_response), or with resume_false_interruption pauses it
//     (turns.overReply): enough voiced speech (min_interruption_ms) then
//     clears it, while a pause or the stop before that resumes it (a
//     cough, a backchannel), and speech that goes on pauses it again;
//   - an early pause (pause_duration_ms) sends input.speech_paused and
//     closes the output queue's gate (playout.Queue.Hold): the backend's
//     reply to the tentative turn is held; the stop releases it, to play
//     at once, and speech that resumes first discards it
//     (input.speech_resumed). The gate stays closed after a discard, so
//     that audio of the withdrawn reply still on its way is dropped too,
//     until the next pause (which drops it and holds anew) or the stop.
//
// Each step runs under turnMu, in which the playout events it causes are
// reported before the turn message that follows them (reportPlayoutLocked).

// speechStarted reports a speech start and, with interruption on, clears
// the output queue first, or pauses it (resume_false_interruption): the
// agent goes quiet at the next tick, before any message is written.
// turnMu keeps the clear's output.cleared (sent by drainEvents) behind
// input.speech_started.
func (m *mediaPath) speechStarted(ev vad.Event) {
	t := &m.turns
	m.turnMu.Lock()
	defer m.turnMu.Unlock()
	t.overReply, t.tentative, t.resumed = false, false, false
	m.replyDue.Store(0) // a reply not come yet is no longer the last turn's
	m.sendDue.Store(0)
	if t.cfg.InterruptResponse && !m.q.Idle() {
		paused := false
		if t.cfg.ResumeFalseInterruption {
			_, paused = m.q.PauseRun()
		}
		if paused {
			t.overReply = true
		} else {
			m.interrupt()
		}
		m.metrics.interruptionQuiet.Observe(time.Since(m.turnWall(ev.SpeechMs)).Seconds())
	}
	m.idle.userStarted()
	m.metrics.turns.WithLabelValues(vad.SpeechStarted.String()).Inc()
	m.sendControl(bridge.Control{Type: bridge.TypeInputSpeechStarted, AudioMs: ev.AudioMs})
	m.client.speechStarted(ev.AudioMs)
}

// interrupt clears the output queue for the user's turn. A reply already
// gone (speech paused it and the backend or the client cleared it, or
// it ended) leaves nothing to clear: no second output.cleared. turnMu
// held.
func (m *mediaPath) interrupt() {
	m.turns.overReply, m.turns.resumed = false, false
	if m.q.Idle() {
		return
	}
	m.clearOutput(clearSourceTurn)
	m.metrics.interruptions.WithLabelValues(interruptionCleared).Inc()
}

// watchInterruption clears the reply that speech paused once that
// speech has enough voiced time to be a turn (min_interruption_ms).
func (m *mediaPath) watchInterruption() {
	t := &m.turns
	if !t.overReply {
		return
	}
	if det := t.in.Detector(); det != nil && det.VoicedMs() >= int64(t.cfg.MinInterruption()) {
		m.turnMu.Lock()
		m.interrupt()
		m.turnMu.Unlock()
	}
}

// resumeReply resumes the reply that speech paused: that speech has gone
// quiet before it had the voiced time of a turn. turnMu held.
func (m *mediaPath) resumeReply() {
	if _, ok := m.q.ResumeRun(); ok {
		m.turns.resumed = true
	}
	m.reportPlayoutLocked() // output.resumed before what the turn sends next
}

// speechPaused takes the early pause: speech over a reply that is not a
// turn lets the reply resume; otherwise the turn is tentatively over: the
// backend is told (input.speech_paused) and what it sends is held.
func (m *mediaPath) speechPaused(ev vad.Event) {
	t := &m.turns
	m.turnMu.Lock()
	defer m.turnMu.Unlock()
	m.metrics.turns.WithLabelValues(vad.SpeechPaused.String()).Inc()
	if t.overReply {
		if det := t.in.Detector(); det == nil || det.VoicedMs() < int64(t.cfg.MinInterruption()) {
			m.resumeReply()
			return // a cough or a backchannel: no turn to prepare a reply for
		}
		m.interrupt()
	}
	m.encMu.Lock()
	tail := m.flushLocked() // the last partial frame before the gate is not the held reply's
	m.q.Discard()           // a withdrawn reply's audio that came since its discard
	m.q.Hold()
	m.encMu.Unlock()
	m.reportTail(tail)
	t.tentative = true
	m.replyDue.Store(m.turnWall(ev.SpeechMs).UnixNano())
	m.reportPlayoutLocked()
	m.sendControl(bridge.Control{Type: bridge.TypeInputSpeechPaused, AudioMs: ev.AudioMs})
}

// speechResumed takes speech after an early pause: over the reply, it
// pauses the reply again; after a tentative end of turn, the reply held
// for it is dropped and the backend told (input.speech_resumed).
func (m *mediaPath) speechResumed(ev vad.Event) {
	t := &m.turns
	m.turnMu.Lock()
	defer m.turnMu.Unlock()
	m.metrics.turns.WithLabelValues(vad.SpeechResumed.String()).Inc()
	if t.overReply {
		m.q.PauseRun()
	}
	if !t.tentative {
		return
	}
	t.tentative = false
	m.replyDue.Store(0)
	if m.discardHeld() > 0 {
		m.metrics.heldReplies.WithLabelValues(heldDiscarded).Inc()
	}
	m.reportPlayoutLocked() // the dropped marks, cleared
	m.sendControl(bridge.Control{Type: bridge.TypeInputSpeechResumed, AudioMs: ev.AudioMs})
}

// discardHeld drops what the output queue holds, with the encoder's
// partial frame (the held reply's), and returns the audio dropped, ms;
// the gate stays closed. turnMu held.
func (m *mediaPath) discardHeld() int64 {
	m.encMu.Lock()
	defer m.encMu.Unlock()
	if m.enc != nil {
		if err := m.enc.Reset(); err != nil {
			m.log.Warn("opus encoder reset failed", "err", err)
		}
	}
	return m.q.Discard()
}

// speechStopped reports a speech stop: a reply that speech paused
// resumes (the speech was not a turn), and a reply held for the turn
// plays at once.
func (m *mediaPath) speechStopped(ev vad.Event) {
	t := &m.turns
	m.turnMu.Lock()
	defer m.turnMu.Unlock()
	if t.overReply {
		t.overReply = false
		m.resumeReply()
	}
	end := m.turnWall(ev.SpeechMs)
	if t.resumed {
		// A cough or a backchannel: no reply is due.
		t.resumed = false
		m.metrics.interruptions.WithLabelValues(interruptionResumed).Inc()
	} else {
		if !t.tentative {
			m.replyDue.Store(end.UnixNano()) // else since the pause, or come already
		}
		if !m.q.Playing() {
			m.sendDue.Store(end.UnixNano()) // the next packet sent is the reply's
		}
	}
	if m.q.Holding() {
		if !t.tentative {
			m.discardHeld() // a withdrawn reply's audio that came since
		}
		if m.q.Release() > 0 {
			m.metrics.heldReplies.WithLabelValues(heldPlayed).Inc()
		}
		m.reportPlayoutLocked()
	}
	t.tentative = false
	m.idle.userStopped(end, ev.SpeechMs)
	m.metrics.turns.WithLabelValues(vad.SpeechStopped.String()).Inc()
	m.sendControl(bridge.Control{Type: bridge.TypeInputSpeechStopped, AudioMs: ev.AudioMs})
	m.client.speechStopped(ev.AudioMs)
}

// turnWall returns the wall time of position ms on the input clock: the
// detector has been fed up to its PositionMs by the frames at hand, which
// came at turns.now (the client's audio comes in real time). Never after
// turns.now: the stop that closes an utterance when the setting changes
// comes with the detector already gone (PositionMs 0), at the current
// position.
func (m *mediaPath) turnWall(ms int64) time.Time {
	t := &m.turns
	return t.now.Add(-time.Duration(max(t.in.PositionMs()-ms, 0)) * time.Millisecond)
}

// reportPlayoutLocked reports the playout events queued so far, before a
// turn message that must follow them. turnMu held.
func (m *mediaPath) reportPlayoutLocked() {
	m.evLocked = m.q.Events(m.evLocked[:0])
	for _, e := range m.evLocked {
		m.reportPlayout(e)
	}
}

// switchTurns replaces the detector (cfg nil: none), with one taking
// frames of frameMs. An utterance in progress is closed with a speech
// stop at the current position, so starts and stops always pair.
func (m *mediaPath) switchTurns(cfg *vad.TurnDetection, frameMs int) {
	t := &m.turns
	m.reportTurns(t.in.SetDetector(t.evs[:0], nil), nil)
	m.turnMu.Lock()
	m.idle.set(0, time.Time{}) // off until a detector runs
	m.turnMu.Unlock()
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
	m.turnMu.Lock()
	m.idle.set(time.Duration(t.cfg.IdleTimeoutMs)*time.Millisecond, time.Now())
	m.turnMu.Unlock()
	m.log.Debug("turn detection on", "turn_detection", cfg.String())
}

// stopTurns frees the detector and stops the idle timeout when the track
// goroutine ends.
func (m *mediaPath) stopTurns() {
	m.turns.in.Close()
	m.stopCleaning()
	m.turnMu.Lock()
	m.idle.set(0, time.Time{})
	m.turnMu.Unlock()
}
