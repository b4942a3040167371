package vad

import "time"

// IdleGrace is how long a client may send nothing, while the user is
// talking and the detector has already heard DTXLead of silence, before
// Input.Idle feeds the silence window on wall time: longer than network
// jitter, so that a late packet rarely finds its time already taken by
// silence, and shorter than what is left of a silence window when a DTX
// encoder stops sending (libopus: after 200 ms of silence).
const IdleGrace = 100 * time.Millisecond

// DTXLead is the silence, ms on the input clock, the detector must have
// heard at the end of an utterance before a pause in the client's packets
// is taken for DTX: an encoder stops sending only after it has coded
// silence for a while (libopus: 200 ms), so a pause that follows speech is
// a stalled network or sender, not the user falling silent.
const DTXLead = 100

// StallGrace is how long a client may send nothing in the middle of
// speech (less than DTXLead of silence heard) before Input.Idle runs the
// silence window on wall time anyway: a client that stopped sending
// mid-word (its network gone, a track that sends nothing while muted)
// still ends its turn, 1 s after its last packet instead of 100 ms, and a
// stall shorter than that does not end a sentence the user is still
// saying.
const StallGrace = time.Second

// Input is a Detector's input clock: it places a session's decoded input
// frames on the session's input clock (docs/bridge.md §4.8: ms from the
// first RTP packet, or from the decoder's first frame) and feeds them to
// the Detector, with silence for the time the client did not send. Like
// the Detector it is a pure state machine: frames, RTP timestamps and
// wall time come in as arguments, Events go out appended to the caller's
// slice, with positions on the input clock. One goroutine uses it; the
// zero value has no detector and ignores its input.
//
// Frame timestamps are in samples at the detector's rate and wrap at
// 2^32 as RTP timestamps do (RFC 3550 §5.1); they are unwrapped here, a
// step of up to 2^31 samples either way.
type Input struct {
	det     *Detector // nil: off, or switched off by a failure
	silence []byte    // one frame of silence at det's rate

	// The frame clock, kept across detectors: started once the first
	// frame is seen; ts is the last frame's timestamp, ext the same
	// unwrapped. offset maps det's clock onto the input clock (input ms =
	// detector ms + offset); fresh: det has not been fed yet, so its first
	// frame sets offset.
	started bool
	ts      uint32
	ext     int64
	offset  int64
	fresh   bool
	// base is the input clock at the decoder's first frame, ms: a decoder
	// started mid-session (Opus passthrough) counts its timestamps from
	// there.
	base int64
	// early: the first 10 ms half of the frame at earlyTS was fed from
	// the decoder's partial frame (Partial); Frame feeds only its second
	// half.
	early   bool
	earlyTS uint32
	// The RTP clock (48 kHz, RFC 7587 §4.1), unwrapped from the first
	// packet.
	rtpStarted bool
	rtpTS      uint32
	rtpExt     int64
	// Wall time: when the last frame was fed, and how many frames of
	// silence Idle fed since.
	lastWall time.Time
	idleFed  int64
}

// SetDetector replaces the detector with det (nil: off) and closes the
// old one. An utterance in progress is closed with a SpeechStopped at the
// current position, appended to dst, so starts and stops always pair.
// The input clock runs on; det's first frame places it on the clock.
func (in *Input) SetDetector(dst []Event, det *Detector) []Event {
	in.early = false
	if in.det != nil {
		if in.det.InSpeech() {
			at := in.det.PositionMs() + in.offset
			dst = append(dst, Event{Kind: SpeechStopped, AudioMs: at, SpeechMs: at})
		}
		in.det.Close()
		in.det = nil
	}
	if det != nil {
		in.det, in.fresh = det, true
		in.silence = make([]byte, det.FrameBytes())
	}
	return dst
}

// PositionMs returns the input clock's position at the end of what the
// detector has been fed (silence fed for a gap or on wall time
// included), ms; 0 when off.
func (in *Input) PositionMs() int64 {
	if in.det == nil {
		return 0
	}
	return in.det.PositionMs() + in.offset
}

// Detector returns the detector being fed, nil when off.
func (in *Input) Detector() *Detector { return in.det }

// Close closes the detector; Input is off after it.
func (in *Input) Close() {
	if in.det != nil {
		in.det.Close()
		in.det = nil
	}
}

// RTP advances the RTP clock to one client packet's timestamp ts (48 kHz).
// first says the packet is the first the decoder feeding Frame takes: its
// frames count from this packet's position. Sessions whose decoder starts
// with the first packet need not call it.
func (in *Input) RTP(ts uint32, first bool) {
	if !in.rtpStarted {
		in.rtpStarted, in.rtpTS, in.rtpExt = true, ts, 0
	} else {
		in.rtpExt += int64(int32(ts - in.rtpTS))
		in.rtpTS = ts
	}
	if in.det != nil && !in.started && first {
		in.base = in.rtpExt / 48
	}
}

// Frame feeds one decoded input frame (PCM16 mono at the detector's rate,
// a whole number of detector frames: one 20 ms frame, or two of 10 ms)
// positioned at timestamp ts, received at now. A 10 ms half that Partial
// already fed is skipped. A frame the detector's frames do not divide is
// ignored. On a detector failure Input switches off and returns the error
// with the events before it, and a SpeechStopped at the current position
// if an utterance was in progress (as SetDetector(nil)).
func (in *Input) Frame(dst []Event, ts uint32, pcm []byte, now time.Time) ([]Event, error) {
	if in.det == nil {
		return dst, nil
	}
	n := in.det.FrameBytes()
	if len(pcm)%n != 0 {
		return dst, nil
	}
	if in.early && ts == in.earlyTS && len(pcm) > n {
		pcm, ts = pcm[n:], ts+uint32(n/2)
	}
	in.early = false
	var err error
	for off := 0; off < len(pcm) && in.det != nil; off += n {
		if dst, err = in.feed(dst, ts+uint32(off/2), pcm[off:off+n], now); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// Partial feeds a 10 ms detector the first half of the frame a decoder is
// assembling (pcm, at ts), when a 10 ms packet left it there, so that the
// half is heard now rather than with the packet that completes the frame;
// Frame then skips it. Otherwise it does nothing.
func (in *Input) Partial(dst []Event, ts uint32, pcm []byte, now time.Time) ([]Event, error) {
	if in.det == nil || in.det.FrameMs() != Frame10ms || in.early {
		return dst, nil
	}
	n := in.det.FrameBytes()
	if len(pcm) < n {
		return dst, nil
	}
	in.early, in.earlyTS = true, ts
	return in.feed(dst, ts, pcm[:n], now)
}

// Wait returns how long the caller may wait for the next frame before
// Idle is due, or 0 to wait without limit (no utterance in progress).
func (in *Input) Wait(now time.Time) time.Duration {
	if in.det == nil || !in.det.InSpeech() || in.lastWall.IsZero() {
		return 0
	}
	next := in.lastWall.Add(in.grace())
	if in.idleFed > 0 {
		next = in.lastWall.Add(time.Duration(in.idleFed+1) * in.frameDur())
	}
	return max(time.Millisecond, next.Sub(now))
}

// Idle runs the silence window on wall time when no frame came while the
// user was talking, for IdleGrace after the detector heard DTXLead of
// silence (DTX), or for StallGrace in the middle of speech (a client that
// stopped sending, a stalled network): one frame of silence for each
// frame's time since the last frame, so the stop comes when the window
// runs out, not with the next packet. The detector's clock then runs
// ahead of the input clock; frames that arrive for time it already took
// are not fed.
func (in *Input) Idle(dst []Event, now time.Time) ([]Event, error) {
	if in.det == nil || !in.det.InSpeech() || in.lastWall.IsZero() || now.Sub(in.lastWall) < in.grace() {
		return dst, nil
	}
	due := int64(now.Sub(in.lastWall) / in.frameDur())
	var err error
	for in.idleFed < due && in.det != nil && in.det.InSpeech() {
		in.idleFed++
		if dst, err = in.process(dst, in.silence); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// grace is how long after the last frame Idle starts feeding silence:
// IdleGrace once the utterance has DTXLead of silence, else StallGrace;
// once Idle has fed silence it goes on a frame at a time.
func (in *Input) grace() time.Duration {
	if in.idleFed > 0 || in.det.SilenceMs() >= DTXLead {
		return IdleGrace
	}
	return StallGrace
}

func (in *Input) frameDur() time.Duration {
	return time.Duration(in.det.FrameMs()) * time.Millisecond
}

// feed gives the detector one frame of its length at ts, after silence
// for any time skipped since the last one.
func (in *Input) feed(dst []Event, ts uint32, pcm []byte, now time.Time) ([]Event, error) {
	if !in.started {
		in.started, in.ts, in.ext = true, ts, int64(ts)
	} else {
		in.ext += int64(int32(ts - in.ts))
		in.ts = ts
	}
	at := in.base + in.ext*1000/int64(in.det.Rate())
	if in.fresh {
		in.fresh, in.offset = false, at
	}
	in.lastWall, in.idleFed = now, 0
	gap := (at - in.offset - in.det.PositionMs()) / int64(in.det.FrameMs())
	if gap < 0 {
		return dst, nil // Idle gave this frame's time to the detector as silence
	}
	var err error
	if gap > 0 {
		if dst, err = in.fill(dst, gap); err != nil {
			return dst, err
		}
	}
	return in.process(dst, pcm)
}

// fill feeds silence for gap frames the client did not send (DTX, or a
// hole longer than the decoder conceals), so the silence window runs and
// positions stay on the input clock. A long gap is mostly skipped: the
// frames that can end an utterance first, then the clock jumps, then
// enough silence that a speech start's prefix padding lies after the
// jump.
func (in *Input) fill(dst []Event, gap int64) ([]Event, error) {
	cfg := in.det.Config()
	fm := int64(in.det.FrameMs())
	first := min(gap, int64(cfg.SilenceDurationMs+40)/fm)
	var err error
	for range first {
		if dst, err = in.process(dst, in.silence); err != nil {
			return dst, err
		}
	}
	rest := gap - first
	pre := min(rest, int64(cfg.PrefixPaddingMs+200)/fm)
	in.offset += (rest - pre) * fm
	for range pre {
		if dst, err = in.process(dst, in.silence); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// process gives the detector one frame and appends what it saw, moved
// onto the input clock. A detector that fails is closed as SetDetector
// closes one: an utterance in progress gets its SpeechStopped.
func (in *Input) process(dst []Event, pcm []byte) ([]Event, error) {
	ev, err := in.det.Process(pcm)
	if err != nil {
		return in.SetDetector(dst, nil), err
	}
	if ev.Kind != None {
		ev.AudioMs += in.offset
		ev.SpeechMs += in.offset
		dst = append(dst, ev)
	}
	return dst, nil
}
