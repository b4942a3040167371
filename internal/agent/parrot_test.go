package agent

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// sampleAt is the test signal: a value that differs from sample to
// sample, so that a byte slice shows exactly which stretch of the input
// it is.
func sampleAt(abs int64) int16 { return int16(abs*7919 + 13) }

// pcmAt returns n samples of the test signal from absolute sample abs.
func pcmAt(abs int64, n int) []byte {
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(sampleAt(abs+int64(i))))
	}
	return b
}

// feeder sends 20 ms frames of the test signal from sample 0, with
// timestamps from ts0 (wrapping).
type feeder struct {
	t    *testing.T
	p    *Parrot
	rate int
	ts0  uint32
	abs  int64 // next sample
}

func (f *feeder) frames(n int) {
	f.t.Helper()
	per := f.rate / 50
	for range n {
		if err := f.p.Audio(f.ts0+uint32(f.abs), pcmAt(f.abs, per)); err != nil {
			f.t.Fatal(err)
		}
		f.abs += int64(per)
	}
}

// skip moves the clock on by n frames without sending them (DTX).
func (f *feeder) skip(n int) { f.abs += int64(n * f.rate / 50) }

func newTestParrot(t *testing.T, cfg ParrotConfig) *Parrot {
	t.Helper()
	p, err := NewParrot(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParrotTurns(t *testing.T) {
	for _, rate := range []int{16000, 24000} {
		for _, ts0 := range []uint32{0, 1<<32 - 16 - 48*300} { // the second wraps 300 ms in, a whole number of ms at both rates // the second wraps mid-run
			p := newTestParrot(t, ParrotConfig{Rate: rate, SilenceDurationMs: 500})
			f := &feeder{t: t, p: p, rate: rate, ts0: ts0}
			perMs := int64(rate / 1000)
			// The bridge's timestamps start at 0; a stream that starts
			// elsewhere puts its audio_ms on the same (unwrapped) clock.
			base := int64(ts0) * 1000 / int64(rate)

			f.frames(100) // 2 s of room
			if r := p.SpeechStarted(base + 1700); r.Clear || r.Audio != nil {
				t.Fatalf("start: %+v", r)
			}
			if !p.Listening() || p.Speaking() {
				t.Fatal("not listening after a start")
			}
			f.frames(150) // to 5 s
			r := p.SpeechStopped(base + 5000)
			want := pcmAt(1700*perMs, int(2800*perMs)) // 1.7 s to 4.5 s
			if r.Clear || !bytes.Equal(r.Audio, want) {
				t.Fatalf("rate %d ts0 %d: reply %d bytes, want the %d bytes of 1.7 s to 4.5 s (equal: %v)", rate, ts0, len(r.Audio), len(want), bytes.Equal(r.Audio, want))
			}
			if !p.Speaking() || p.Listening() {
				t.Fatal("not speaking after the reply")
			}
			// Drained: the next start clears nothing.
			if _, ok := p.Handle(bridge.TypeOutputStopped, 2800); !ok || p.Speaking() {
				t.Fatal("output.stopped not taken")
			}
			f.frames(50)
			if r := p.SpeechStarted(base + 5600); r.Clear {
				t.Fatal("clear with no reply out")
			}
			f.frames(50)
			if r := p.SpeechStopped(base + 7000); !bytes.Equal(r.Audio, pcmAt(5600*perMs, int(900*perMs))) {
				t.Fatalf("second reply %d bytes", len(r.Audio))
			}
		}
	}
}

func TestParrotBargeIn(t *testing.T) {
	for _, edge := range []bool{false, true} {
		p := newTestParrot(t, ParrotConfig{Rate: 24000, SilenceDurationMs: 500, EdgeInterrupts: edge})
		f := &feeder{t: t, p: p, rate: 24000}
		f.frames(50)
		p.SpeechStarted(300)
		f.frames(100)
		if r := p.SpeechStopped(2800); len(r.Audio) == 0 {
			t.Fatal("no reply")
		}
		f.frames(25) // the reply plays; the user talks over it
		r, ok := p.Handle(bridge.TypeInputSpeechStarted, 3100)
		if !ok || r.Clear == edge || r.Audio != nil {
			t.Fatalf("edge interrupts %v: barge-in reply %+v, want Clear %v", edge, r, !edge)
		}
		if p.Speaking() {
			t.Fatal("still speaking after the barge-in")
		}
		p.OutputCleared(500) // the transceiver's answer changes nothing more
		f.frames(50)
		r, _ = p.Handle(bridge.TypeInputSpeechStopped, 4000)
		if !bytes.Equal(r.Audio, pcmAt(3100*24, 400*24)) {
			t.Fatalf("reply to the interrupting utterance: %d bytes", len(r.Audio))
		}
		// A second start while the first reply is out but already
		// cleared by output.cleared: no clear.
		p.OutputCleared(100)
		if r := p.SpeechStarted(4100); r.Clear {
			t.Fatal("clear after output.cleared")
		}
	}
}

func TestParrotGapsAndOrder(t *testing.T) {
	p := newTestParrot(t, ParrotConfig{Rate: 16000, SilenceDurationMs: 200})
	f := &feeder{t: t, p: p, rate: 16000}
	f.frames(10)
	p.SpeechStarted(100)
	f.frames(5) // 200-300 ms
	f.skip(5)   // DTX 300-400 ms
	f.frames(5) // 400-500 ms
	// A repeated and a reordered frame change nothing.
	if err := p.Audio(uint32(16*320), pcmAt(0, 320)); err != nil {
		t.Fatal(err)
	}
	if err := p.Audio(uint32(16*460), pcmAt(0, 320)); err != nil {
		t.Fatal(err)
	}
	r := p.SpeechStopped(700)
	want := append(append(pcmAt(1600, 16*200), make([]byte, 2*16*100)...), pcmAt(16*400, 16*100)...)
	if !bytes.Equal(r.Audio, want) {
		t.Fatalf("reply %d bytes, want 100-500 ms with 300-400 ms silent (%d bytes)", len(r.Audio), len(want))
	}
	if err := p.Audio(0, []byte{1, 2, 3}); err != ErrPCMLength {
		t.Fatalf("odd payload: %v", err)
	}
}

func TestParrotBounds(t *testing.T) {
	p := newTestParrot(t, ParrotConfig{Rate: 16000, SilenceDurationMs: 500, MaxUtteranceMs: 1000})
	f := &feeder{t: t, p: p, rate: 16000}
	// Idle for a minute: the history stays bounded.
	f.frames(3000)
	if max := 2 * parrotHistoryMs * 32; len(p.buf) > max {
		t.Fatalf("%d bytes held after a minute of silence, want at most %d", len(p.buf), max)
	}
	// An utterance longer than the cap is cut to it.
	p.SpeechStarted(60000)
	f.frames(150) // 3 s
	r := p.SpeechStopped(63000)
	if !bytes.Equal(r.Audio, pcmAt(60000*16, 1000*16)) || p.DroppedMs() != 2000 {
		t.Fatalf("capped reply %d bytes, dropped %d ms; want 1 s from 60 s and 2000 ms dropped", len(r.Audio), p.DroppedMs())
	}
	// The clock is still right afterwards.
	f.frames(25)
	p.SpeechStarted(63100)
	f.frames(25)
	if r := p.SpeechStopped(64000); !bytes.Equal(r.Audio, pcmAt(63100*16, 400*16)) {
		t.Fatalf("reply after a capped one: %d bytes", len(r.Audio))
	}
	// A start earlier than what is held begins at the oldest audio; a
	// start before any audio at all works too.
	f.frames(250)
	p.SpeechStarted(0)
	if p.utterStart != p.bufStart {
		t.Fatal("start before the history not clamped")
	}
	// That start reaches further back than the cap: the reply is cut.
	if r := p.SpeechStopped(1 << 40); len(r.Audio) != 1000*32 {
		t.Fatalf("reply to an utterance held beyond the cap: %d bytes, want %d", len(r.Audio), 1000*32)
	}
	q := newTestParrot(t, ParrotConfig{Rate: 24000})
	q.SpeechStarted(0)
	fq := &feeder{t: t, p: q, rate: 24000, ts0: 48000}
	fq.frames(10)
	if r := q.SpeechStopped(1e6); len(r.Audio) != 10*960 {
		t.Fatalf("start before audio: reply %d bytes, want %d", len(r.Audio), 10*960)
	}
	// A stop without a start, an unknown type.
	if r := q.SpeechStopped(5); r.Audio != nil {
		t.Fatal("reply to a stop without a start")
	}
	if _, ok := q.Handle("output.started", 0); ok {
		t.Fatal("Handle took output.started")
	}
}

func TestNewParrotErrors(t *testing.T) {
	for _, tt := range []struct {
		cfg  ParrotConfig
		want string
	}{
		{ParrotConfig{Rate: 48000}, "rate 48000 Hz: must be 16000 or 24000"},
		{ParrotConfig{Rate: 16000, SilenceDurationMs: -1}, "silence duration -1 ms"},
		{ParrotConfig{Rate: 16000, MaxUtteranceMs: -5}, "max utterance -5 ms"},
		{ParrotConfig{Rate: 16000, SilenceDurationMs: 500, PauseDurationMs: 500}, "pause duration 500 ms: must be 0 or under the silence duration (500 ms)"},
	} {
		if _, err := NewParrot(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewParrot(%+v) = %v, want %q", tt.cfg, err, tt.want)
		}
	}
}

// FuzzParrot drives a parrot with arbitrary frames and messages: it
// never panics, replies are whole samples within the cap, and its memory
// stays bounded.
func FuzzParrot(f *testing.F) {
	f.Add([]byte{0, 10, 1, 0, 5, 2, 0, 20, 3})
	f.Add([]byte{1, 255, 255, 2, 0, 0, 4, 9, 9, 0, 1, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		p, err := NewParrot(ParrotConfig{Rate: 16000, SilenceDurationMs: 300, MaxUtteranceMs: 2000, PauseDurationMs: 100})
		if err != nil {
			t.Fatal(err)
		}
		var ts uint32
		for len(ops) >= 3 {
			op, a, b := ops[0], ops[1], ops[2]
			ops = ops[3:]
			arg := int64(int16(uint16(a)<<8 | uint16(b)))
			var r Reply
			switch op % 9 {
			case 0: // a frame, maybe after a skip or from the past
				ts += uint32(int32(arg) * 16)
				n := int(a) * 4
				if err := p.Audio(ts, make([]byte, n)); err != nil {
					t.Fatal(err)
				}
				ts += uint32(n / 2)
			case 1:
				r = p.SpeechStarted(arg * 37)
			case 2:
				r = p.SpeechStopped(arg * 37)
			case 3:
				r, _ = p.Handle(bridge.TypeOutputCleared, arg)
			case 4:
				r, _ = p.Handle(bridge.TypeOutputStopped, arg)
			case 5:
				if err := p.Audio(ts, make([]byte, 3)); err != ErrPCMLength {
					t.Fatal("odd payload taken")
				}
			case 6:
				r, _ = p.Handle(bridge.TypeInputSpeechPaused, arg*37)
			case 7:
				r, _ = p.Handle(bridge.TypeInputSpeechResumed, arg*37)
			case 8:
				r, _ = p.Handle(bridge.TypeOutputResumed, arg)
			}
			if len(r.Audio)%2 != 0 || len(r.Audio) > 2000*32 {
				t.Fatalf("reply of %d bytes", len(r.Audio))
			}
			if len(p.buf) > 2*parrotHistoryMs*32+2000*32+int(a)*4 {
				t.Fatalf("%d bytes held", len(p.buf))
			}
		}
	})
}

// TestParrotPrepared: with an early pause the reply is the utterance up to
// the pause's speech end, returned at the pause; a resume withdraws it
// (Cancel), the next pause returns the longer utterance, and the stop
// returns nothing more: the edge plays what was prepared.
func TestParrotPrepared(t *testing.T) {
	const rate = 24000
	p := newTestParrot(t, ParrotConfig{Rate: rate, SilenceDurationMs: 500, EdgeInterrupts: true, PauseDurationMs: 200})
	f := &feeder{t: t, p: p, rate: rate}
	perMs := int64(rate / 1000)
	f.frames(50) // 1 s of room
	p.SpeechStarted(700)
	f.frames(60) // to 2.2 s: speech to 2 s, then 200 ms of pause
	r := p.SpeechPaused(2200)
	if want := pcmAt(700*perMs, 1300*int(perMs)); !bytes.Equal(r.Audio, want) {
		t.Fatalf("reply at the pause: %d bytes, want the utterance 700–2000 ms (%d bytes)", len(r.Audio), len(want))
	}
	f.frames(40) // the user goes on
	if r := p.SpeechResumed(2300); !r.Cancel || r.Audio != nil {
		t.Fatalf("SpeechResumed = %+v, want Cancel", r)
	}
	f.frames(30)
	r = p.SpeechPaused(3600)
	if want := pcmAt(700*perMs, 2700*int(perMs)); !bytes.Equal(r.Audio, want) {
		t.Fatalf("reply at the second pause: %d bytes, want the utterance 700–3400 ms (%d bytes)", len(r.Audio), len(want))
	}
	f.frames(15)
	if r := p.SpeechStopped(3900); r.Audio != nil || !p.Speaking() || p.Listening() {
		t.Fatalf("stop after a prepared reply: %d bytes, speaking %v, listening %v; want none, true, false", len(r.Audio), p.Speaking(), p.Listening())
	}
}

// TestParrotBackchannel: speech over the reply that let it resume
// (output.resumed) gets no reply at its stop; speech that proved a turn
// (output.cleared) does.
func TestParrotBackchannel(t *testing.T) {
	const rate = 16000
	p := newTestParrot(t, ParrotConfig{Rate: rate, SilenceDurationMs: 500, EdgeInterrupts: true})
	f := &feeder{t: t, p: p, rate: rate}
	f.frames(50)
	p.SpeechStarted(700)
	f.frames(60)
	if r, _ := p.Handle(bridge.TypeInputSpeechStopped, 2200); r.Audio == nil {
		t.Fatal("no reply to the first turn")
	}
	// A cough over the reply: paused, resumed.
	p.SpeechStarted(2500)
	f.frames(40)
	p.Handle(bridge.TypeOutputResumed, 600)
	if !p.Speaking() {
		t.Error("not speaking after output.resumed")
	}
	if r, _ := p.Handle(bridge.TypeInputSpeechStopped, 3000); r.Audio != nil {
		t.Fatalf("a reply of %d bytes to a backchannel", len(r.Audio))
	}
	// A real interruption: paused, then cleared: a turn.
	p.SpeechStarted(3300)
	f.frames(50)
	p.Handle(bridge.TypeOutputResumed, 900) // it went quiet once, then on
	p.Handle(bridge.TypeOutputCleared, 900)
	if r, _ := p.Handle(bridge.TypeInputSpeechStopped, 4300); r.Audio == nil {
		t.Fatal("no reply to the interruption that was a turn")
	}
}
