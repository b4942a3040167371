package vad

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
)

// inputStep is one call on an Input: a frame (pcm bytes of silence at
// ts), a partial frame, or an RTP packet's timestamp.
type inputStep struct {
	kind  string // "frame", "partial", "rtp", "rtp first"
	ts    uint32
	bytes int
}

func TestInputClock(t *testing.T) {
	const near = 1<<32 - 640 // two 20 ms frames at 16 kHz before the wrap
	tests := []struct {
		name    string
		frameMs int
		steps   []inputStep
		// What the detector was fed (ms) and where its clock sits on
		// the input clock (ms).
		wantPos, wantOffset int64
	}{
		{"frames in order", 20, []inputStep{{"frame", 0, 640}, {"frame", 320, 640}, {"frame", 640, 640}}, 60, 0},
		{"timestamps unwrap across 2^32", 20, []inputStep{
			{"frame", near, 640}, {"frame", near + 320, 640}, {"frame", 0, 640}, {"frame", 320, 640}, {"frame", 640, 640},
		}, 100, near * 1000 / 16000},
		{"a DTX gap is filled with silence", 20, []inputStep{{"frame", 0, 640}, {"frame", 6 * 320, 640}}, 140, 0},
		{"a late frame for time already fed is dropped", 20, []inputStep{{"frame", 0, 640}, {"frame", 640, 640}, {"frame", 320, 640}}, 60, 0},
		// 10 s missing: the silence window's frames (27), then the jump,
		// then the prefix padding's (25); the clock moves by the rest.
		{"a long gap jumps the clock", 20, []inputStep{{"frame", 0, 640}, {"frame", 501 * 320, 640}}, 20 + 52*20 + 20, (500 - 52) * 20},
		{"a 20 ms frame is two 10 ms frames", 10, []inputStep{{"frame", 0, 640}, {"frame", 320, 640}}, 40, 0},
		{"a partial half is fed once", 10, []inputStep{{"partial", 0, 320}, {"frame", 0, 640}}, 20, 0},
		{"a partial half is fed at once", 10, []inputStep{{"frame", 0, 640}, {"partial", 320, 480}}, 30, 0},
		{"a partial of a lost frame does not skip", 10, []inputStep{{"partial", 0, 320}, {"frame", 320, 640}}, 40, 0},
		{"a partial shorter than a frame waits", 10, []inputStep{{"partial", 0, 200}, {"frame", 0, 640}}, 20, 0},
		{"a 20 ms detector takes no partial", 20, []inputStep{{"partial", 0, 640}, {"frame", 0, 640}}, 20, 0},
		{"a frame the detector's do not divide is ignored", 20, []inputStep{{"frame", 0, 640}, {"frame", 320, 320}}, 20, 0},
		// Opus passthrough: the decoder starts 500 ms into the RTP
		// clock, which wraps on the way.
		{"offset from the RTP clock", 20, []inputStep{
			{"rtp", 1<<32 - 12000, 0}, {"rtp", 12000, 0}, {"rtp first", 12000 + 960, 0}, {"frame", 0, 640}, {"frame", 320, 640},
		}, 40, 520},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			det, err := NewDetector(DefaultTurnDetection(), Rate16k, tt.frameMs)
			if err != nil {
				t.Fatal(err)
			}
			var in Input
			defer in.Close()
			if evs := in.SetDetector(nil, det); len(evs) != 0 {
				t.Fatalf("SetDetector on a new Input: %v", evs)
			}
			now := time.Unix(1000, 0)
			var evs []Event
			for _, s := range tt.steps {
				now = now.Add(20 * time.Millisecond)
				switch s.kind {
				case "frame":
					evs, err = in.Frame(evs, s.ts, make([]byte, s.bytes), now)
				case "partial":
					evs, err = in.Partial(evs, s.ts, make([]byte, s.bytes), now)
				case "rtp", "rtp first":
					in.RTP(s.ts, s.kind == "rtp first")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if len(evs) != 0 {
				t.Errorf("silence gave events %v", evs)
			}
			if got := det.PositionMs(); got != tt.wantPos {
				t.Errorf("detector fed %d ms, want %d", got, tt.wantPos)
			}
			if in.offset != tt.wantOffset {
				t.Errorf("offset %d ms, want %d", in.offset, tt.wantOffset)
			}
		})
	}
}

// TestInputOff: without a detector every call does nothing and Wait says
// to wait without limit.
func TestInputOff(t *testing.T) {
	var in Input
	now := time.Unix(1000, 0)
	in.RTP(0, true)
	for _, f := range []func() ([]Event, error){
		func() ([]Event, error) { return in.Frame(nil, 0, make([]byte, 640), now) },
		func() ([]Event, error) { return in.Partial(nil, 0, make([]byte, 640), now) },
		func() ([]Event, error) { return in.Idle(nil, now.Add(time.Second)) },
	} {
		if evs, err := f(); len(evs) != 0 || err != nil {
			t.Errorf("off: %v, %v", evs, err)
		}
	}
	if w := in.Wait(now); w != 0 {
		t.Errorf("Wait = %v, want 0", w)
	}
}

// TestInputSpeech: an utterance is reported on the input clock (the
// detector's positions plus the offset of its first frame); with no
// packets after it the stop comes on wall time (Idle), and Wait says when;
// switching detectors mid-utterance closes it.
func TestInputSpeech(t *testing.T) {
	speech.Require(t)
	s, err := speech.Say("hello there, how are you today", Rate16k)
	if err != nil {
		t.Fatal(err)
	}
	pcm := make([]byte, 2*len(s))
	for i, v := range s {
		binary.LittleEndian.PutUint16(pcm[2*i:], uint16(v))
	}
	const start = 16000 * 3 // the detector starts 3 s into the input clock
	// feedSpeech feeds the first upTo bytes of the speech (0: all of it)
	// as 20 ms frames from the input clock's start, 20 ms of wall time
	// apart.
	feedSpeech := func(t *testing.T, in *Input, now time.Time, upTo int) ([]Event, uint32, time.Time) {
		t.Helper()
		var evs []Event
		ts := uint32(start)
		if upTo == 0 {
			upTo = len(pcm)
		}
		for off := 0; off+640 <= upTo; off += 640 {
			now = now.Add(20 * time.Millisecond)
			if evs, err = in.Frame(evs, ts, pcm[off:off+640], now); err != nil {
				t.Fatal(err)
			}
			ts += 320
		}
		return evs, ts, now
	}
	newInput := func(t *testing.T) *Input {
		det, err := NewDetector(DefaultTurnDetection(), Rate16k, Frame20ms)
		if err != nil {
			t.Fatal(err)
		}
		in := &Input{}
		in.SetDetector(nil, det)
		t.Cleanup(in.Close)
		return in
	}

	t.Run("idle ends the utterance on wall time", func(t *testing.T) {
		in := newInput(t)
		evs, ts, now := feedSpeech(t, in, time.Unix(1000, 0), 0)
		// What a DTX encoder sends before it stops: 200 ms of silence.
		silence := make([]byte, 640)
		for range 10 {
			now = now.Add(20 * time.Millisecond)
			if evs, err = in.Frame(evs, ts, silence, now); err != nil {
				t.Fatal(err)
			}
			ts += 320
		}
		if len(evs) == 0 || evs[0].Kind != SpeechStarted || !in.det.InSpeech() {
			t.Fatalf("events %v, in speech %v; want an utterance in progress", evs, in.det.InSpeech())
		}
		if evs[0].AudioMs < 3000 || evs[0].AudioMs > 3000+int64(len(s))/16 {
			t.Errorf("speech started at %d ms, want within the speech from 3000 ms", evs[0].AudioMs)
		}
		if w := in.Wait(now); w != IdleGrace {
			t.Errorf("Wait right after a frame = %v, want %v", w, IdleGrace)
		}
		if evs, _ := in.Idle(nil, now.Add(IdleGrace/2)); len(evs) != 0 || in.idleFed != 0 {
			t.Errorf("Idle within the grace fed %d frames: %v", in.idleFed, evs)
		}
		var stop []Event
		for step := now; len(stop) == 0 && step.Before(now.Add(2*time.Second)); step = step.Add(in.Wait(step)) {
			if stop, err = in.Idle(nil, step); err != nil {
				t.Fatal(err)
			}
		}
		if len(stop) != 1 || stop[0].Kind != SpeechStopped {
			t.Fatalf("Idle gave %v, want a stop", stop)
		}
		pos := in.det.PositionMs() + in.offset
		if stop[0].AudioMs != pos {
			t.Errorf("stop at %d ms, want the detector's position %d ms", stop[0].AudioMs, pos)
		}
		if w := in.Wait(now); w != 0 {
			t.Errorf("Wait after the stop = %v, want 0", w)
		}
	})
	t.Run("a stall mid-speech waits StallGrace", func(t *testing.T) {
		in := newInput(t)
		// Up to the loudest 20 ms of the speech: no silence heard yet.
		loud, best := 0, 0.0
		for off := 0; off+640 <= len(pcm); off += 640 {
			var e float64
			for _, v := range s[off/2 : off/2+320] {
				e += float64(v) * float64(v)
			}
			if e > best {
				loud, best = off+640, e
			}
		}
		evs, _, now := feedSpeech(t, in, time.Unix(1000, 0), loud)
		if len(evs) == 0 || evs[0].Kind != SpeechStarted || !in.det.InSpeech() {
			t.Fatalf("events %v, in speech %v; want an utterance in progress", evs, in.det.InSpeech())
		}
		if got := in.det.SilenceMs(); got >= DTXLead {
			t.Fatalf("the detector heard %d ms of silence at the loudest frame, want < %d", got, DTXLead)
		}
		if w := in.Wait(now); w != StallGrace {
			t.Errorf("Wait in the middle of speech = %v, want %v", w, StallGrace)
		}
		// A stall of most of a second (a loaded sender, a network
		// hiccup) does not end the sentence.
		if evs, _ := in.Idle(nil, now.Add(StallGrace-IdleGrace)); len(evs) != 0 || in.idleFed != 0 {
			t.Errorf("Idle %v into a stall fed %d frames: %v", StallGrace-IdleGrace, in.idleFed, evs)
		}
		// A client that stopped sending still ends its turn, the stop
		// at the silence window after its last frame.
		last := in.det.PositionMs() + in.offset
		stop, err := in.Idle(nil, now.Add(StallGrace))
		if err != nil {
			t.Fatal(err)
		}
		if len(stop) != 1 || stop[0].Kind != SpeechStopped {
			t.Fatalf("Idle after StallGrace gave %v, want a stop", stop)
		}
		if want := last + int64(DefaultSilenceDurationMs); stop[0].AudioMs < want || stop[0].AudioMs > want+100 {
			t.Errorf("stop at %d ms, want the silence window after the last frame, %d ms (+100)", stop[0].AudioMs, want)
		}
	})
	t.Run("switching closes the utterance", func(t *testing.T) {
		in := newInput(t)
		evs, ts, now := feedSpeech(t, in, time.Unix(1000, 0), 0)
		if len(evs) == 0 || !in.det.InSpeech() {
			t.Fatalf("events %v; want an utterance in progress", evs)
		}
		pos := in.det.PositionMs() + in.offset
		next, err := NewDetector(DefaultTurnDetection(), Rate16k, Frame10ms)
		if err != nil {
			t.Fatal(err)
		}
		stop := in.SetDetector(nil, next)
		if len(stop) != 1 || stop[0].Kind != SpeechStopped || stop[0].AudioMs != pos {
			t.Fatalf("SetDetector gave %v, want a stop at %d ms", stop, pos)
		}
		// The next detector starts where the input clock is.
		if _, err := in.Frame(nil, ts, make([]byte, 640), now); err != nil {
			t.Fatal(err)
		}
		if want := int64(ts) * 1000 / 16000; in.offset != want {
			t.Errorf("new detector's offset %d ms, want %d", in.offset, want)
		}
	})
	t.Run("a failure closes the utterance", func(t *testing.T) {
		// A detector that fails mid-utterance switches the Input off;
		// its owner still gets the stop, at the current position, so
		// that starts and stops pair (what it holds for the utterance,
		// a paused reply or one held for a tentative turn, is let go).
		in := newInput(t)
		evs, ts, now := feedSpeech(t, in, time.Unix(1000, 0), 0)
		if len(evs) == 0 || !in.det.InSpeech() {
			t.Fatalf("events %v; want an utterance in progress", evs)
		}
		pos := in.det.PositionMs() + in.offset
		in.det.Close() // the engine fails: Process returns an error
		stop, err := in.Frame(nil, ts, make([]byte, 640), now.Add(20*time.Millisecond))
		if err == nil || in.Detector() != nil {
			t.Fatalf("Frame after the engine failed: %v, detector %v; want an error and the Input off", err, in.Detector())
		}
		if len(stop) != 1 || stop[0].Kind != SpeechStopped || stop[0].AudioMs != pos {
			t.Fatalf("the failure gave %v, want a stop at %d ms", stop, pos)
		}
	})
}

// TestInputAllocs: feeding frames allocates nothing in the steady state.
func TestInputAllocs(t *testing.T) {
	det, err := NewDetector(DefaultTurnDetection(), Rate16k, Frame10ms)
	if err != nil {
		t.Fatal(err)
	}
	var in Input
	defer in.Close()
	in.SetDetector(nil, det)
	frame := make([]byte, 640)
	evs := make([]Event, 0, 4)
	ts := uint32(0)
	now := time.Unix(1000, 0)
	step := func() {
		now = now.Add(20 * time.Millisecond)
		evs, _ = in.Partial(evs[:0], ts, frame[:320], now)
		evs, _ = in.Frame(evs[:0], ts, frame, now)
		ts += 320
	}
	for range 10 {
		step()
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("%v allocations per frame, want 0", n)
	}
}
