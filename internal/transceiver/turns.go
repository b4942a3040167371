package transceiver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

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
//	client RTP ─▶ toBackend ─▶ decoded 20 ms frames ─▶ feedTurns
//	                          (Opus passthrough: a 16 kHz decoder of its own)
//
// When the client sends 10 ms packets the detector takes 10 ms frames,
// and each packet's audio is fed to it as soon as it is decoded
// (feedPartial): the first half of a 20 ms frame does not wait for the
// packet that completes it, so the speech end and the silence window's
// end fall on a 10 ms grid and the stop is sent with the packet that
// ends the window, about 5 ms sooner on average (docs/vad.md).

// OpenAI Realtime server events the transceiver sends the client on
// oai-events about turn detection, unless the backend's hello opted out.
const (
	clientSpeechStartedType = "input_audio_buffer.speech_started"
	clientSpeechStoppedType = "input_audio_buffer.speech_stopped"
)

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
// the track goroutine (onTrack), which feeds it.
type turns struct {
	// next is the setting to apply before the next frame: from the
	// backend's hello, or an input.turn_detection the bridge reader got.
	next atomic.Pointer[turnSwitch]

	det *vad.Detector
	dec *audio.Decoder // Opus passthrough only: decodes for det
	// The input clock: started once the first frame is seen; ts is the
	// last frame's timestamp, ext the same unwrapped, both in samples at
	// the frame rate. offset maps the detector's clock onto the input
	// clock (input ms = detector ms + offset).
	started bool
	ts      uint32
	ext     int64
	offset  int64
	fresh   bool   // det has not been fed yet: offset is set by its first frame
	base    int64  // Opus: the input clock at dec's first frame, ms
	silence []byte // one frame of silence at det's rate
	// early is set when the first half of the frame at earlyTS (10 ms)
	// went to the detector from the decoder's partial frame: feedTurns
	// then feeds only the frame's second half.
	early   bool
	earlyTS uint32
	// Opus passthrough: the client's RTP timestamps, unwrapped (48 kHz),
	// from the first packet: the input clock dec is placed on.
	rtpStarted bool
	rtpTS      uint32
	rtpExt     int64
	item       string // the current user item's id (input_audio_buffer.*)
	items      uint64
	// Wall time: when the last frame was fed (its packet arrived), and
	// how many frames of silence were fed since for the time that passed
	// without packets, in speech (idleTurns).
	lastWall time.Time
	idleFed  int64
}

// turnsIdleGrace is how long the client may send nothing, while the user
// is talking, before the silence window runs on wall time (idleTurns):
// longer than network jitter, so that a late packet rarely finds its
// time already taken by silence, and shorter than what is left of a
// silence window when a DTX encoder stops sending (libopus: after 200 ms
// of silence).
const turnsIdleGrace = 100 * time.Millisecond

// turnsWait returns how long the track goroutine may wait for the next
// packet before idleTurns is due, or 0 to wait without limit (no
// utterance in progress).
func (sess *session) turnsWait(now time.Time) time.Duration {
	t := &sess.turns
	if t.det == nil || !t.det.InSpeech() || t.lastWall.IsZero() {
		return 0
	}
	next := t.lastWall.Add(turnsIdleGrace)
	if t.idleFed > 0 {
		next = t.lastWall.Add(time.Duration(t.idleFed+1) * time.Duration(t.det.FrameMs()) * time.Millisecond)
	}
	return max(time.Millisecond, next.Sub(now))
}

// idleTurns runs the silence window on wall time when the client has
// sent nothing for turnsIdleGrace while the user was talking (DTX, a
// client that stops sending, a stalled network): the detector is fed one
// frame of silence for each frame's time since the last packet arrived, so the
// stop is sent when the window runs out, not when the next packet comes.
// The detector's clock then runs ahead of the input clock; frames that
// arrive for time it already took are not fed to it (feedTurns).
func (sess *session) idleTurns(now time.Time) {
	t := &sess.turns
	if t.det == nil || !t.det.InSpeech() || t.lastWall.IsZero() || now.Sub(t.lastWall) < turnsIdleGrace {
		return
	}
	due := int64(now.Sub(t.lastWall) / (time.Duration(t.det.FrameMs()) * time.Millisecond))
	for t.idleFed < due && t.det != nil && t.det.InSpeech() {
		t.idleFed++
		sess.processTurn(t.silence)
	}
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
func (sess *session) setTurnDetection(raw json.RawMessage, from string) {
	td, err := parseTurnDetection(raw)
	if err != nil {
		sess.refuse(refusedTurnDetection, bridge.ErrCodeTurnDetection, fmt.Sprintf("%s: %v; turn detection unchanged", from, err))
		return
	}
	sess.turns.next.Store(&turnSwitch{cfg: td})
}

// applyTurns applies a turn detection setting that came since the last
// packet. It runs on the track goroutine, once per client packet, before
// the packet (payload, the client's Opus) is decoded.
func (sess *session) applyTurns(payload []byte) {
	t := &sess.turns
	if t.next.Load() == nil {
		return
	}
	if sw := t.next.Swap(nil); sw != nil {
		sess.switchTurns(sw.cfg, turnsFrameMs(payload))
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
// passthrough session: it keeps the input clock (the RTP timestamp from
// the first packet, docs/bridge.md §4.8) and, with turn detection on,
// decodes the packet at 16 kHz for the detector only.
func (sess *session) opusTurns(seq uint16, ts uint32, payload []byte) {
	t := &sess.turns
	if !t.rtpStarted {
		t.rtpStarted, t.rtpTS, t.rtpExt = true, ts, 0
	} else {
		t.rtpExt += int64(int32(ts - t.rtpTS))
		t.rtpTS = ts
	}
	if t.det == nil {
		return
	}
	if !t.started && t.dec.Stats().Packets == 0 {
		t.base = t.rtpExt / 48
	}
	for _, f := range t.dec.Push(seq, ts, payload) {
		if t.det == nil {
			return
		}
		sess.feedTurns(f.Timestamp, f.PCM)
	}
	sess.feedPartial(t.dec)
}

// feedTurns runs turn detection on one decoded 20 ms input frame,
// positioned at timestamp (samples at the frame's rate from the
// decoder's first frame): one detector frame, or two of 10 ms (only the
// second when feedPartial fed the first). It runs on the track
// goroutine, after the frame went to the backend.
func (sess *session) feedTurns(timestamp uint32, pcm []byte) {
	t := &sess.turns
	if t.det == nil {
		return
	}
	n := t.det.FrameBytes()
	if len(pcm)%n != 0 {
		return
	}
	if t.early && timestamp == t.earlyTS && len(pcm) > n {
		pcm, timestamp = pcm[n:], timestamp+uint32(n/2)
	}
	t.early = false
	for off := 0; off < len(pcm) && t.det != nil; off += n {
		sess.feedTurn(timestamp+uint32(off/2), pcm[off:off+n])
	}
}

// feedPartial feeds a 10 ms detector the first half of the frame dec is
// assembling, when a 10 ms packet left it there, so that the half is
// heard now rather than with the next packet; feedTurns then skips it.
// The backend still gets whole 20 ms frames: a turn message may come up
// to 10 ms of audio before the frame that holds its position.
func (sess *session) feedPartial(dec *audio.Decoder) {
	t := &sess.turns
	if t.det == nil || t.det.FrameMs() != vad.Frame10ms || t.early {
		return
	}
	p := dec.Partial()
	n := t.det.FrameBytes()
	if len(p.PCM) < n {
		return
	}
	t.early, t.earlyTS = true, p.Timestamp
	sess.feedTurn(p.Timestamp, p.PCM[:n])
}

// feedTurn gives the detector one frame of its length, positioned at
// timestamp, after the silence for any time skipped since the last one.
func (sess *session) feedTurn(timestamp uint32, pcm []byte) {
	t := &sess.turns
	if !t.started {
		t.started, t.ts, t.ext = true, timestamp, int64(timestamp)
	} else {
		t.ext += int64(int32(timestamp - t.ts))
		t.ts = timestamp
	}
	at := t.base + t.ext*1000/int64(t.det.Rate())
	if t.fresh {
		t.fresh, t.offset = false, at // the detector starts at this frame
	}
	t.lastWall, t.idleFed = time.Now(), 0
	gap := (at - t.offset - t.det.PositionMs()) / int64(t.det.FrameMs())
	if gap < 0 {
		return // idleTurns gave this frame's time to the detector as silence
	}
	if gap > 0 {
		sess.fillTurns(gap)
	}
	sess.processTurn(pcm)
}

// fillTurns feeds the detector silence for gap frames the client did not
// send (DTX, or a hole longer than the decoder conceals), so the silence
// window runs and positions stay on the input clock. A long gap is
// mostly skipped: the frames that end an utterance first, then the
// clock jumps, then enough silence that a speech start's prefix padding
// lies after the jump.
func (sess *session) fillTurns(gap int64) {
	t := &sess.turns
	cfg := t.det.Config()
	fm := t.det.FrameMs()
	first := min(gap, int64((cfg.SilenceDurationMs+40)/fm))
	for range first {
		sess.processTurn(t.silence)
	}
	rest := gap - first
	pre := min(rest, int64((cfg.PrefixPaddingMs+200)/fm))
	t.offset += (rest - pre) * int64(fm)
	for range pre {
		sess.processTurn(t.silence)
	}
}

// processTurn gives the detector one frame and reports what it saw.
func (sess *session) processTurn(pcm []byte) {
	t := &sess.turns
	if t.det == nil {
		return // switched off by a failure
	}
	ev, err := t.det.Process(pcm)
	if err != nil {
		sess.log.Warn("turn detection failed; switched off", "err", err)
		t.det.Close()
		t.det = nil
		return
	}
	switch ev.Kind {
	case vad.SpeechStarted:
		sess.speechStarted(ev.AudioMs + t.offset)
	case vad.SpeechStopped:
		sess.speechStopped(ev.AudioMs + t.offset)
	}
}

// speechStarted reports a speech start at audioMs and, with interruption
// on, clears the output queue first: the agent goes quiet at the next
// tick, before any message is written. turnMu keeps the clear's
// output.cleared (sent by drainEvents) behind input.speech_started.
func (sess *session) speechStarted(audioMs int64) {
	t := &sess.turns
	t.items++
	t.item = "item_sb_" + sess.id + "_" + strconv.FormatUint(t.items, 10)
	sess.turnMu.Lock()
	defer sess.turnMu.Unlock()
	if t.det.Config().InterruptResponse && !sess.media.q.Idle() {
		sess.clearOutput(clearSourceTurn)
	}
	sess.srv.metrics.turns.WithLabelValues(vad.SpeechStarted.String()).Inc()
	sess.sendControl(bridge.Control{Type: bridge.TypeInputSpeechStarted, AudioMs: audioMs})
	sess.sendClientTurn(clientSpeechStartedType, "audio_start_ms", audioMs)
}

// speechStopped reports a speech stop at audioMs.
func (sess *session) speechStopped(audioMs int64) {
	sess.srv.metrics.turns.WithLabelValues(vad.SpeechStopped.String()).Inc()
	sess.sendControl(bridge.Control{Type: bridge.TypeInputSpeechStopped, AudioMs: audioMs})
	sess.sendClientTurn(clientSpeechStoppedType, "audio_end_ms", audioMs)
}

// sendClientTurn sends the client OpenAI's input_audio_buffer.speech_*
// event, shaped as OpenAI's Realtime API sends it:
//
//	{"type":"input_audio_buffer.speech_started","event_id":"…","audio_start_ms":1000,"item_id":"…"}
//	{"type":"input_audio_buffer.speech_stopped","event_id":"…","audio_end_ms":2300,"item_id":"…"}
func (sess *session) sendClientTurn(typ, member string, ms int64) {
	if !sess.be.InputAudioBufferEvents() {
		return
	}
	dc := sess.events.Load()
	if dc == nil {
		return
	}
	msg, _ := json.Marshal(map[string]any{
		"type":     typ,
		"event_id": "event_sb_" + sess.id + "_" + strconv.FormatUint(sess.media.eventID.Add(1), 10),
		member:     ms,
		"item_id":  sess.turns.item,
	})
	if sendText(dc, msg) != nil {
		sess.srv.metrics.eventsDropped.Inc()
	}
}

// switchTurns replaces the detector (cfg nil: none), with one taking
// frames of frameMs. An utterance in progress is closed with a speech
// stop at the current position, so starts and stops always pair.
func (sess *session) switchTurns(cfg *vad.TurnDetection, frameMs int) {
	t := &sess.turns
	t.early = false
	if t.det != nil {
		if t.det.InSpeech() {
			sess.speechStopped(t.det.PositionMs() + t.offset)
		}
		t.det.Close()
		t.det = nil
	}
	if cfg == nil {
		return
	}
	rate := bridge.SampleRate(sess.be.Format())
	if rate == 0 {
		rate = opusVADRate
		if t.dec == nil {
			dec, err := audio.NewDecoder(rate)
			if err != nil {
				sess.log.Warn("turn detection: opus decoder", "err", err)
				return
			}
			t.dec = dec
		}
	}
	det, err := vad.NewDetector(*cfg, rate, frameMs)
	if err != nil {
		code := bridge.ErrCodeTurnDetection
		if errors.Is(err, vad.ErrUnavailable) {
			sess.log.Warn("turn detection unavailable", "err", err)
		}
		sess.refuse(refusedTurnDetection, code, fmt.Sprintf("turn detection: %v", err))
		return
	}
	t.det, t.fresh = det, true
	t.silence = make([]byte, det.FrameBytes())
	sess.log.Debug("turn detection on", "turn_detection", cfg.String())
}

// stopTurns frees the detector when the track goroutine ends.
func (sess *session) stopTurns() {
	if t := &sess.turns; t.det != nil {
		t.det.Close()
		t.det = nil
	}
}
