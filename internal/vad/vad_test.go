package vad

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"math"
	"strings"
	"syscall"
	"testing"
)

func TestTurnDetectionJSON(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want *TurnDetection
	}{
		{"full", `{"type":"server_vad","threshold":0.7,"prefix_padding_ms":100,"silence_duration_ms":800,"interrupt_response":false}`,
			&TurnDetection{Type: TypeServerVAD, Threshold: 0.7, PrefixPaddingMs: 100, SilenceDurationMs: 800, InterruptResponse: false}},
		{"defaults for what is left out", `{"type":"server_vad"}`, &TurnDetection{Type: TypeServerVAD, Threshold: 0.5, PrefixPaddingMs: 300, SilenceDurationMs: 500, InterruptResponse: true}},
		{"empty object", `{}`, &TurnDetection{Type: TypeServerVAD, Threshold: 0.5, PrefixPaddingMs: 300, SilenceDurationMs: 500, InterruptResponse: true}},
		{"explicit zero padding kept", `{"prefix_padding_ms":0}`, &TurnDetection{Type: TypeServerVAD, Threshold: 0.5, PrefixPaddingMs: 0, SilenceDurationMs: 500, InterruptResponse: true}},
		{"create_response ignored", `{"type":"server_vad","create_response":true}`, &TurnDetection{Type: TypeServerVAD, Threshold: 0.5, PrefixPaddingMs: 300, SilenceDurationMs: 500, InterruptResponse: true}},
		{"idle timeout", `{"idle_timeout_ms":5000}`, &TurnDetection{Type: TypeServerVAD, Threshold: 0.5, PrefixPaddingMs: 300, SilenceDurationMs: 500, InterruptResponse: true, IdleTimeoutMs: 5000}},
		{"idle timeout null is off", `{"idle_timeout_ms":null}`, &TurnDetection{Type: TypeServerVAD, Threshold: 0.5, PrefixPaddingMs: 300, SilenceDurationMs: 500, InterruptResponse: true}},
		{"switchboard's members", `{"pause_duration_ms":200,"resume_false_interruption":true,"min_interruption_ms":600}`,
			&TurnDetection{Type: TypeServerVAD, Threshold: 0.5, PrefixPaddingMs: 300, SilenceDurationMs: 500, InterruptResponse: true, PauseDurationMs: 200, ResumeFalseInterruption: true, MinInterruptionMs: 600}},
		{"null is off", `null`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hello struct {
				TurnDetection *TurnDetection `json:"turn_detection"`
			}
			if err := json.Unmarshal([]byte(`{"turn_detection":`+tt.in+`}`), &hello); err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.want == nil && hello.TurnDetection != nil:
				t.Fatalf("got %v, want nil", hello.TurnDetection)
			case tt.want != nil && (hello.TurnDetection == nil || *hello.TurnDetection != *tt.want):
				t.Fatalf("got %v, want %v", hello.TurnDetection, tt.want)
			}
		})
	}
	// Marshal gives OpenAI's shape back.
	b, err := json.Marshal(DefaultTurnDetection())
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"type":"server_vad","threshold":0.5,"prefix_padding_ms":300,"silence_duration_ms":500,"interrupt_response":true}`; string(b) != want {
		t.Errorf("Marshal = %s, want %s", b, want)
	}
	b, err = json.Marshal(TurnDetection{Type: TypeServerVAD, Threshold: 0.5, SilenceDurationMs: 500, IdleTimeoutMs: 8000, PauseDurationMs: 200, ResumeFalseInterruption: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"type":"server_vad","threshold":0.5,"prefix_padding_ms":0,"silence_duration_ms":500,"interrupt_response":false,"idle_timeout_ms":8000,"pause_duration_ms":200,"resume_false_interruption":true}`; string(b) != want {
		t.Errorf("Marshal = %s, want %s", b, want)
	}
	if got := (TurnDetection{}).MinInterruption(); got != DefaultMinInterruptionMs {
		t.Errorf("MinInterruption() of 0 = %d, want the default %d", got, DefaultMinInterruptionMs)
	}
	var bad TurnDetection
	if err := json.Unmarshal([]byte(`{"threshold":"high"}`), &bad); err == nil {
		t.Error("a string threshold decoded")
	}
}

func TestValidate(t *testing.T) {
	mod := func(f func(*TurnDetection)) TurnDetection {
		td := DefaultTurnDetection()
		f(&td)
		return td
	}
	tests := []struct {
		name    string
		td      TurnDetection
		wantErr string // substring; "" for valid
	}{
		{"defaults", DefaultTurnDetection(), ""},
		{"bounds", mod(func(td *TurnDetection) {
			td.Threshold, td.PrefixPaddingMs, td.SilenceDurationMs = 1, MaxPrefixPaddingMs, MaxSilenceDurationMs
		}), ""},
		{"low bounds", mod(func(td *TurnDetection) {
			td.Threshold, td.PrefixPaddingMs, td.SilenceDurationMs = 0, 0, MinSilenceDurationMs
		}), ""},
		{"semantic_vad", mod(func(td *TurnDetection) { td.Type = "semantic_vad" }), `type "semantic_vad" is not supported`},
		{"empty type", mod(func(td *TurnDetection) { td.Type = "" }), `type "" is unknown`},
		{"threshold high", mod(func(td *TurnDetection) { td.Threshold = 1.5 }), "threshold 1.5 is out of range; it must be from 0 to 1"},
		{"threshold negative", mod(func(td *TurnDetection) { td.Threshold = -0.1 }), "threshold -0.1"},
		{"threshold NaN", mod(func(td *TurnDetection) { td.Threshold = math.NaN() }), "threshold NaN"},
		{"padding negative", mod(func(td *TurnDetection) { td.PrefixPaddingMs = -20 }), "prefix_padding_ms -20 is out of range; it must be from 0 to 2000"},
		{"padding long", mod(func(td *TurnDetection) { td.PrefixPaddingMs = 5000 }), "prefix_padding_ms 5000"},
		{"silence zero", mod(func(td *TurnDetection) { td.SilenceDurationMs = 0 }), "silence_duration_ms 0 is out of range; it must be from 20 to 10000"},
		{"silence long", mod(func(td *TurnDetection) { td.SilenceDurationMs = 60000 }), "silence_duration_ms 60000"},
		{"pause bounds", mod(func(td *TurnDetection) {
			td.PauseDurationMs, td.MinInterruptionMs, td.IdleTimeoutMs = 480, MaxMinInterruptionMs, MaxIdleTimeoutMs
		}), ""},
		{"pause low bounds", mod(func(td *TurnDetection) { td.PauseDurationMs, td.IdleTimeoutMs = MinSilenceDurationMs, MinIdleTimeoutMs }), ""},
		{"pause short", mod(func(td *TurnDetection) { td.PauseDurationMs = 10 }), "pause_duration_ms 10 is out of range; it must be 0 (off) or from 20 to silence_duration_ms − 20 (480)"},
		{"pause not before the stop", mod(func(td *TurnDetection) { td.PauseDurationMs = 490 }), "pause_duration_ms 490"},
		{"pause negative", mod(func(td *TurnDetection) { td.PauseDurationMs = -200 }), "pause_duration_ms -200"},
		{"min interruption negative", mod(func(td *TurnDetection) { td.MinInterruptionMs = -1 }), "min_interruption_ms -1 is out of range; it must be from 0 (the default, 500) to 5000"},
		{"min interruption long", mod(func(td *TurnDetection) { td.MinInterruptionMs = 6000 }), "min_interruption_ms 6000"},
		{"idle short", mod(func(td *TurnDetection) { td.IdleTimeoutMs = 100 }), "idle_timeout_ms 100 is out of range; it must be 0 or null (off) or from 500 to 600000"},
		{"idle negative", mod(func(td *TurnDetection) { td.IdleTimeoutMs = -5 }), "idle_timeout_ms -5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.td.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want an ErrConfig saying %q", err, tt.wantErr)
			}
			if _, err := NewDetector(tt.td, Rate16k, Frame20ms); !errors.Is(err, ErrConfig) {
				t.Fatalf("NewDetector accepted %v: %v", tt.td, err)
			}
		})
	}
}

func TestDetectorErrors(t *testing.T) {
	for _, rate := range []int{0, 8000, 22050, 48000} {
		if _, err := NewDetector(DefaultTurnDetection(), rate, Frame20ms); !errors.Is(err, ErrRate) {
			t.Errorf("NewDetector(rate %d) = %v, want ErrRate", rate, err)
		}
	}
	for _, fm := range []int{0, 5, 15, 30, -10} {
		if _, err := NewDetector(DefaultTurnDetection(), Rate16k, fm); !errors.Is(err, ErrFrameSize) {
			t.Errorf("NewDetector(frames of %d ms) = %v, want ErrFrameSize", fm, err)
		}
	}
	for _, tt := range []struct{ rate, fm, frameBytes int }{{Rate16k, 20, 640}, {Rate24k, 20, 960}, {Rate16k, 10, 320}, {Rate24k, 10, 480}} {
		d, err := NewDetector(DefaultTurnDetection(), tt.rate, tt.fm)
		if err != nil {
			t.Fatal(err)
		}
		if d.FrameBytes() != tt.frameBytes || d.Rate() != tt.rate || d.FrameMs() != tt.fm {
			t.Errorf("rate %d, %d ms: FrameBytes %d Rate %d FrameMs %d", tt.rate, tt.fm, d.FrameBytes(), d.Rate(), d.FrameMs())
		}
		// The other frame length is refused too.
		for _, n := range []int{0, 1, tt.frameBytes - 1, tt.frameBytes + 2, 2 * tt.frameBytes, tt.frameBytes / 2} {
			if _, err := d.Process(make([]byte, n)); !errors.Is(err, ErrFrameSize) {
				t.Errorf("rate %d: Process(%d bytes) = %v, want ErrFrameSize", tt.rate, n, err)
			}
		}
		if d.PositionMs() != 0 {
			t.Errorf("refused frames moved the clock to %d ms", d.PositionMs())
		}
		if _, err := d.Process(make([]byte, tt.frameBytes)); err != nil {
			t.Fatal(err)
		}
		if d.PositionMs() != int64(tt.fm) {
			t.Errorf("PositionMs = %d after one frame", d.PositionMs())
		}
		d.Close()
		d.Close()
		if _, err := d.Process(make([]byte, tt.frameBytes)); !errors.Is(err, ErrClosed) {
			t.Errorf("Process after Close = %v, want ErrClosed", err)
		}
	}
}

// feed runs pcm through d and returns the events with the positions at
// which they were reported, calling at (if not nil) right after each.
func feed(t testing.TB, d *Detector, pcm []byte, at func(Event)) (evs []Event) {
	t.Helper()
	for off := 0; off+d.FrameBytes() <= len(pcm); off += d.FrameBytes() {
		ev, err := d.Process(pcm[off : off+d.FrameBytes()])
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind != None {
			evs = append(evs, ev)
			if at != nil {
				at(ev)
			}
		}
	}
	return evs
}

// TestPrefixPadding checks that at each speech start the detector holds
// the audio from the padded start on, byte for byte as it was fed, and
// that the padded span covers the true onset, at both rates, both frame
// lengths and with a padding that is not a whole number of frames.
func TestPrefixPadding(t *testing.T) {
	speech.Require(t)
	for _, fm := range frameLengths {
		for _, rate := range []int{Rate16k, Rate24k} {
			sc := makeScene(t, rate, func(n int) []float64 { return whiteNoise(7, n, noiseLevel) })
			td := DefaultTurnDetection()
			td.PrefixPaddingMs = 245 // rounded up to 260 (20 ms frames) or 250 (10 ms)
			pad := int64((245 + fm - 1) / fm * fm)
			d, err := NewDetector(td, rate, fm)
			if err != nil {
				t.Fatal(err)
			}
			bytesPerMs := int64(2 * rate / 1000)
			var starts int
			feed(t, d, sc.pcm, func(ev Event) {
				if ev.Kind != SpeechStarted {
					return
				}
				if ev.AudioMs != ev.SpeechMs-pad {
					t.Errorf("rate %d, %d ms: audio_ms %d, want onset %d - %d", rate, fm, ev.AudioMs, ev.SpeechMs, pad)
				}
				if ev.SpeechMs%int64(fm) != 0 {
					t.Errorf("rate %d, %d ms: onset %d ms is not on the frame grid", rate, fm, ev.SpeechMs)
				}
				on := int64(sc.onsets[starts])
				if ev.AudioMs > on || d.PositionMs() <= on {
					t.Errorf("rate %d: padded audio [%d, %d) ms misses the true onset %d ms", rate, ev.AudioMs, d.PositionMs(), on)
				}
				got, ok := d.AppendSince([]byte("x"), ev.AudioMs)
				want := append([]byte("x"), sc.pcm[ev.AudioMs*bytesPerMs:d.PositionMs()*bytesPerMs]...)
				if !ok || !bytes.Equal(got, want) {
					t.Errorf("rate %d: AppendSince(%d) = %d bytes, ok %v; want the %d bytes fed since", rate, ev.AudioMs, len(got), ok, len(want))
				}
				// The ring holds exactly padding + 180 ms.
				oldest := d.PositionMs() - pad - 180
				if _, ok := d.AppendSince(nil, oldest); !ok {
					t.Errorf("rate %d, %d ms: AppendSince(%d) refused: the ring holds %d ms", rate, fm, oldest, pad+180)
				}
				f := int64(fm)
				for _, from := range []int64{oldest - f, ev.AudioMs + 1, d.PositionMs() + f, -f} {
					if b, ok := d.AppendSince([]byte("x"), from); ok || string(b) != "x" {
						t.Errorf("rate %d: AppendSince(%d) at %d ms = %d bytes, ok %v; want refused", rate, from, d.PositionMs(), len(b), ok)
					}
				}
				starts++
			})
			d.Close()
			if starts != len(sc.onsets) {
				t.Errorf("rate %d: %d starts for %d utterances", rate, starts, len(sc.onsets))
			}
		}
	}
}

// TestSpeechAtFirstFrame: speech from the first frame on gives a start
// whose padded position is clamped to 0, and a stop.
func TestSpeechAtFirstFrame(t *testing.T) {
	speech.Require(t)
	s := speak(t, "en-us", "Good morning, how are you doing today?", Rate16k)
	f, _ := activeSpan(s)
	x := make([]float64, len(s)-f+Rate16k)
	for i, v := range s[f:] {
		x[i] = float64(v)
	}
	for _, fm := range frameLengths {
		d, err := NewDetector(DefaultTurnDetection(), Rate16k, fm)
		if err != nil {
			t.Fatal(err)
		}
		evs := feed(t, d, toPCM(x), nil)
		d.Close()
		if len(evs) != 2 || evs[0].Kind != SpeechStarted || evs[1].Kind != SpeechStopped {
			t.Fatalf("events %v, want a start and a stop", evs)
		}
		if evs[0].AudioMs != 0 || evs[0].SpeechMs > 100 {
			t.Errorf("%d ms: start %+v, want audio_ms 0 and the onset within 100 ms of 0", fm, evs[0])
		}
	}
}

// TestThresholdMatters: on babble alone, threshold 0 (no margin over the
// floor: the engine all but alone) keeps the detector in speech most of
// the time, the default never: the margin is what keeps babble out, and
// Threshold sets it.
func TestThresholdMatters(t *testing.T) {
	speech.Require(t)
	pcm := toPCM(babble(t, Rate16k, 30*Rate16k, noiseLevel, 0))
	for _, fm := range frameLengths {
		inSpeech := func(threshold float64) float64 {
			td := DefaultTurnDetection()
			td.Threshold = threshold
			d, err := NewDetector(td, Rate16k, fm)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			frames, speech := 0, 0
			for off := 0; off+d.FrameBytes() <= len(pcm); off += d.FrameBytes() {
				if _, err := d.Process(pcm[off : off+d.FrameBytes()]); err != nil {
					t.Fatal(err)
				}
				frames++
				if d.InSpeech() {
					speech++
				}
			}
			return float64(speech) / float64(frames)
		}
		low, def := inSpeech(0), inSpeech(DefaultThreshold)
		t.Logf("%d ms frames: share of 30 s of babble in speech: %.2f at threshold 0, %.2f at %v", fm, low, def, DefaultThreshold)
		if def != 0 || low < 0.5 {
			t.Errorf("%d ms frames: share of 30 s of babble in speech: %.2f at threshold 0, %.2f at %v; want most, then none", fm, low, def, DefaultThreshold)
		}
	}
}

// burstSignal is test input made without espeak-ng: 1 s of silence, then
// alternating 600 ms bursts of a harmonic tone with a syllabic envelope
// and 900 ms pauses, over faint noise.
func burstSignal(rate, seconds int) []byte {
	n := seconds * rate
	x := whiteNoise(3, n, 30)
	for i := range x {
		tt := float64(i) / float64(rate)
		cycle := math.Mod(tt-1, 1.5)
		if tt < 1 || cycle > 0.6 {
			continue
		}
		env := math.Sin(math.Pi*cycle/0.6) * (0.6 + 0.4*math.Sin(2*math.Pi*4*tt))
		var v float64
		for h := 1; h <= 10; h++ {
			v += math.Sin(2*math.Pi*140*float64(h)*tt) / float64(h)
		}
		x[i] += 6000 * env * v
	}
	return toPCM(x)
}

func TestNoAllocationsPerFrame(t *testing.T) {
	for _, fm := range frameLengths {
		for _, rate := range []int{Rate16k, Rate24k} {
			pcm := burstSignal(rate, 10)
			d, err := NewDetector(DefaultTurnDetection(), rate, fm)
			if err != nil {
				t.Fatal(err)
			}
			var events int
			allocs := testing.AllocsPerRun(1, func() {
				for off := 0; off+d.FrameBytes() <= len(pcm); off += d.FrameBytes() {
					ev, _ := d.Process(pcm[off : off+d.FrameBytes()])
					if ev.Kind != None {
						events++
					}
				}
			})
			d.Close()
			if allocs != 0 {
				t.Errorf("rate %d: %v allocations over %d frames, want 0", rate, allocs, len(pcm)/d.FrameBytes())
			}
			if events < 4 {
				t.Errorf("rate %d: only %d events: the run did not go through starts and stops", rate, events)
			}
		}
	}
}

// TestDecimator checks the 24 → 8 kHz filter: unity gain in the speech
// band, at least 40 dB down above 4.3 kHz (what would fold back into the
// engine's band), and the same output whether the input comes in one
// frame or in many (the history carries across frames).
func TestDecimator(t *testing.T) {
	gain := func(hz float64) float64 {
		const n = 480 * 50
		in := make([]int16, n)
		for i := range in {
			in[i] = int16(10000 * math.Sin(2*math.Pi*hz*float64(i)/24000))
		}
		var d decimator
		var out []int16
		buf := make([]int16, 160)
		for off := 0; off < n; off += 480 {
			out = append(out, d.process(in[off:off+480], buf)...)
		}
		var p float64
		for _, v := range out[len(out)/2:] { // past the filter's start
			p += float64(v) * float64(v)
		}
		return 10 * math.Log10(p/float64(len(out)/2)/(10000*10000/2))
	}
	for _, hz := range []float64{200, 1000, 2500} {
		if g := gain(hz); math.Abs(g) > 0.5 {
			t.Errorf("%v Hz: gain %.2f dB, want 0 ± 0.5", hz, g)
		}
	}
	for _, hz := range []float64{4300, 5000, 7000, 11000} {
		if g := gain(hz); g > -40 {
			t.Errorf("%v Hz: gain %.1f dB, want ≤ -40", hz, g)
		}
	}

	// Frame by frame, in 20 or 10 ms frames, equals a direct convolution
	// over the whole signal.
	in := make([]int16, 480*4)
	for i := range in {
		in[i] = int16(i*7919%20000 - 10000)
	}
	for _, frame := range []int{480, 240} {
		var d decimator
		var got []int16
		buf := make([]int16, 160)
		for off := 0; off < len(in); off += frame {
			got = append(got, d.process(in[off:off+frame], buf)...)
		}
		for k := range len(in) / 3 {
			var acc float64
			for j := range decimTaps {
				if idx := 3*k + 2 - (decimTaps - 1) + j; idx >= 0 {
					acc += float64(decimTable[j]) * float64(in[idx])
				}
			}
			if want := int16(math.Round(acc)); math.Abs(float64(got[k])-float64(want)) > 1 {
				t.Fatalf("frames of %d: output %d = %d, direct convolution %d", frame, k, got[k], want)
			}
		}
	}
}

// FuzzDetector feeds arbitrary bytes as frames under an arbitrary valid
// configuration: Process never panics, events alternate start/stop,
// positions are ordered and on the clock, and the padded audio of every
// start is there.
func FuzzDetector(f *testing.F) {
	f.Add(uint8(0), uint16(500), uint16(300), uint16(500), []byte{})
	f.Add(uint8(1), uint16(0), uint16(0), uint16(20), burstSignal(Rate24k, 3))
	f.Add(uint8(0), uint16(1000), uint16(2000), uint16(10000), burstSignal(Rate16k, 3))
	f.Add(uint8(2), uint16(250), uint16(40), uint16(100), bytes.Repeat([]byte{0xff, 0x7f, 0x00, 0x80}, 4000))
	f.Fuzz(func(t *testing.T, sel uint8, thr, pad, sil uint16, data []byte) {
		rate := []int{Rate16k, Rate24k}[sel%2]
		fm := []int{Frame20ms, Frame10ms}[sel>>3%2]
		td := TurnDetection{
			Type:              TypeServerVAD,
			Threshold:         float64(thr%1001) / 1000,
			PrefixPaddingMs:   int(pad) % (MaxPrefixPaddingMs + 1),
			SilenceDurationMs: MinSilenceDurationMs + int(sil)%(MaxSilenceDurationMs-MinSilenceDurationMs+1),
		}
		d, err := NewDetector(td, rate, fm)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		fb := d.FrameBytes()
		f := int64(fm)
		// Repeat short inputs so that turns can happen.
		for len(data) > 0 && len(data) < 100*fb {
			data = append(data, data...)
		}
		var last Event
		n := 0
		for off := 0; off < len(data); {
			size := fb
			if sel&4 != 0 && off%7 == 3 {
				size = fb - 2 // a bad frame now and then
			}
			end := min(off+size, len(data))
			before := d.PositionMs()
			ev, err := d.Process(data[off:end])
			off = end
			if err != nil {
				if !errors.Is(err, ErrFrameSize) || d.PositionMs() != before {
					t.Fatalf("Process: %v (clock %d → %d)", err, before, d.PositionMs())
				}
				continue
			}
			pos := d.PositionMs()
			if pos != before+f {
				t.Fatalf("clock %d → %d", before, pos)
			}
			switch ev.Kind {
			case None:
				continue
			case SpeechStarted:
				if last.Kind == SpeechStarted || ev.AudioMs < 0 || ev.AudioMs > ev.SpeechMs || ev.SpeechMs >= pos || ev.AudioMs < last.AudioMs {
					t.Fatalf("start %+v at %d after %+v", ev, pos, last)
				}
				b, ok := d.AppendSince(nil, ev.AudioMs)
				if !ok || int64(len(b)) != (pos-ev.AudioMs)*int64(fb)/f || ev.SpeechMs%f != 0 {
					t.Fatalf("AppendSince(%d) at %d: %d bytes, %v", ev.AudioMs, pos, len(b), ok)
				}
				if !d.InSpeech() {
					t.Fatal("not InSpeech after a start")
				}
			case SpeechStopped:
				if last.Kind != SpeechStarted || ev.AudioMs != pos || ev.SpeechMs <= last.SpeechMs || ev.SpeechMs > pos || ev.SpeechMs%f != 0 {
					t.Fatalf("stop %+v at %d after %+v", ev, pos, last)
				}
				if d.InSpeech() {
					t.Fatal("InSpeech after a stop")
				}
			default:
				t.Fatalf("event kind %v", ev.Kind)
			}
			last = ev
			n++
		}
	})
}

// BenchmarkProcess is the CPU one session's turn detection costs per
// 20 ms of audio (one op: one 20 ms frame or two 10 ms frames; ns/op =
// wall ns; cpu-ns/20ms = the process's CPU time, steadier on a loaded
// machine), over speech-like bursts and pauses, at each input rate and
// frame length; BenchmarkEngine is WebRTC's VAD alone on the same frames
// (at 16 kHz as given, at 24 kHz after the decimator), so the difference
// is what the Detector adds.
func BenchmarkProcess(b *testing.B) {
	for _, fm := range frameLengths {
		for _, rate := range []int{Rate16k, Rate24k} {
			b.Run(fmt.Sprintf("%dms/%d", fm, rate), func(b *testing.B) {
				pcm := burstSignal(rate, 10)
				d, err := NewDetector(DefaultTurnDetection(), rate, fm)
				if err != nil {
					b.Fatal(err)
				}
				defer d.Close()
				fb := d.FrameBytes()
				frames := len(pcm) / fb
				per := Frame20ms / fm
				loopFrames(b, frames, per, func(i int) error {
					_, err := d.Process(pcm[i*fb : (i+1)*fb])
					return err
				})
			})
		}
	}
}

func BenchmarkEngine(b *testing.B) {
	for _, fm := range frameLengths {
		for _, rate := range []int{Rate16k, Rate24k} {
			b.Run(fmt.Sprintf("%dms/%d", fm, rate), func(b *testing.B) {
				pcm := burstSignal(rate, 10)
				n := rate * fm / 1000
				samples := make([]int16, len(pcm)/2)
				for i := range samples {
					samples[i] = int16(uint16(pcm[2*i]) | uint16(pcm[2*i+1])<<8)
				}
				engineRate := rate
				if rate == Rate24k {
					var dec decimator
					down := make([]int16, 0, len(samples)/3)
					buf := make([]int16, n/3)
					for off := 0; off+n <= len(samples); off += n {
						down = append(down, dec.process(samples[off:off+n], buf)...)
					}
					samples, n, engineRate = down, n/3, 8000
				}
				e, err := newEngine(engineMode(DefaultThreshold))
				if err != nil {
					b.Fatal(err)
				}
				defer e.close()
				frames := len(samples) / n
				per := Frame20ms / fm
				loopFrames(b, frames, per, func(i int) error {
					_, err := e.process(engineRate, samples[i*n:(i+1)*n])
					return err
				})
			})
		}
	}
}

// loopFrames calls process per times for each b.Loop iteration (per
// frames make 20 ms of audio), on frame indices 0 to frames-1 in turn,
// failing b on the first error, and reports allocations and the CPU time
// per 20 ms (user + system, ns) as cpu-ns/20ms.
func loopFrames(b *testing.B, frames, per int, process func(i int) error) {
	b.Helper()
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	i := 0
	for b.Loop() {
		for range per {
			if err := process(i); err != nil {
				b.Fatal(err)
			}
			if i++; i == frames {
				i = 0
			}
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/20ms")
}

// cpuTime returns the CPU time (user + system) the process has used, ns.
func cpuTime(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
