package apm

import (
	"encoding/binary"
	"errors"
	"syscall"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		err  error
	}{
		{"16k", Config{Rate: 16000, EchoCancellation: true}, nil},
		{"24k near", Config{Rate: 24000, NoiseReduction: NearField}, nil},
		{"rate", Config{Rate: 22050}, ErrConfig},
		{"type", Config{Rate: 16000, NoiseReduction: "studio"}, ErrConfig},
		{"delay", Config{Rate: 16000, InitialDelayMs: MaxDelayMs + 1}, ErrConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if !errors.Is(err, tc.err) {
				t.Fatalf("Validate() = %v, want %v", err, tc.err)
			}
			if err == nil && tc.cfg.InitialDelayMs != DefaultInitialDelayMs {
				t.Errorf("InitialDelayMs %d, want the default %d", tc.cfg.InitialDelayMs, DefaultInitialDelayMs)
			}
		})
	}
}

func TestFramesAndAllocs(t *testing.T) {
	c, err := New(Config{Rate: 24000, EchoCancellation: true, NoiseReduction: FarField})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1, 0)
	if err := c.Process(make([]byte, 478), 0, t0); !errors.Is(err, ErrFrameSize) {
		t.Errorf("Process of 239 samples: %v, want ErrFrameSize", err)
	}
	if err := c.Played(t0, make([]byte, 100)); !errors.Is(err, ErrFrameSize) {
		t.Errorf("Played of 50 samples: %v, want ErrFrameSize", err)
	}
	far, near := make([]byte, 960), make([]byte, 960)
	for i := range far {
		far[i] = byte(i * 7)
		near[i] = byte(i * 13)
	}
	k := int64(0)
	step := func() {
		at := t0.Add(time.Duration(k) * 20 * time.Millisecond)
		if err := c.Played(at, far); err != nil {
			t.Fatal(err)
		}
		if err := c.Process(near, k*480, at.Add(200*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		k++
	}
	for range 300 {
		step()
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Errorf("%v allocations per 20 ms frame, want 0", n)
	}
	live0 := Live()
	c.Close()
	c.Close()
	if n := Live(); n != live0-1 {
		t.Errorf("Live() %d after closing one of %d (twice), want %d", n, live0, live0-1)
	}
	if err := c.Process(near, 0, t0); !errors.Is(err, ErrClosed) {
		t.Errorf("Process after Close: %v, want ErrClosed", err)
	}
}

// BenchmarkCleaner is the CPU of cleaning one 20 ms frame (with its far
// end), per feature and rate, as cpu-ns/20ms.
// BenchmarkCleaner: the cost of each stage per 20 ms of input (two
// 10 ms frames) at 24 and 16 kHz, the far end playing throughout. With
// echo cancellation, "noecho" is a client whose input holds none of the
// far end (the estimator runs, the module and the gate wait for an
// echo), "listening" the same client's microphone quiet (-76 dBFS, the
// user listening behind its own noise suppression: the input's band
// levels need no transform), "echo" one whose input holds it 200 ms
// later at -6 dB (found within the first 2 s; the module and the gate
// run on every frame).
func BenchmarkCleaner(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  Config
		echo bool
		room float64 // the input's noise, amplitude
	}{
		{"aec/noecho", Config{Rate: 24000, EchoCancellation: true}, false, 30},
		{"aec/listening", Config{Rate: 24000, EchoCancellation: true}, false, 5},
		{"aec/echo", Config{Rate: 24000, EchoCancellation: true}, true, 30},
		{"ns", Config{Rate: 24000, NoiseReduction: NearField}, false, 30},
		{"aec+ns/echo", Config{Rate: 24000, EchoCancellation: true, NoiseReduction: NearField}, true, 30},
		{"aec16k/noecho", Config{Rate: 16000, EchoCancellation: true}, false, 30},
		{"aec16k/echo", Config{Rate: 16000, EchoCancellation: true}, true, 30},
		{"ns16k", Config{Rate: 16000, NoiseReduction: NearField}, false, 30},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := New(tc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			rate := tc.cfg.Rate
			n := rate / 50
			// 10 s of far end, looped; the input is the room's noise,
			// and the far end's echo when the case has one.
			far := whiteNoise(1, 10*rate, 3000)
			near := whiteNoise(2, len(far), tc.room)
			if tc.echo {
				d := rate / 5
				for i := range near {
					near[i] += 0.5 * far[(i-d+len(far))%len(far)]
				}
			}
			fb, nb := pcmBytes(far), pcmBytes(near)
			buf := make([]byte, 2*n)
			t0 := time.Unix(1, 0)
			frames := len(far) / n
			// Warm up: the estimator finds the echo.
			k := int64(0)
			step := func() {
				i := int(k) % frames
				at := t0.Add(time.Duration(k) * 20 * time.Millisecond)
				_ = c.Played(at, fb[2*i*n:2*(i+1)*n])
				copy(buf, nb[2*i*n:])
				_ = c.Process(buf, k*int64(n), at.Add(time.Millisecond))
				k++
			}
			for range 150 {
				step()
			}
			if st := c.Stats(); tc.echo && !st.Measured || !tc.echo && st.Measured {
				b.Fatalf("after 3 s: echo measured %v (delay %d ms), want %v", st.Measured, st.DelayMs, tc.echo)
			}
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				step()
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/20ms")
		})
	}
}

// cpuTime is the process's CPU time (user + system), ns: steadier than
// wall time on a loaded machine.
func cpuTime(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// TestPlayedLongGap: far-end audio after a long quiet spell (the agent
// silent for hours while the user talks) is recorded at once, with
// silence before it and nothing of the audio before the gap: the gap
// costs the ring's length, not a sample of work per sample of the gap
// (which, on the track goroutine with the played packets' lock held,
// would stall the shared playout clock's worker).
func TestPlayedLongGap(t *testing.T) {
	const rate = 48000
	c, err := New(Config{Rate: rate, EchoCancellation: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	frame := func(v int16) []byte {
		b := make([]byte, 2*rate/100)
		for i := 0; i < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], uint16(v))
		}
		return b
	}
	t0 := time.Unix(1000, 0)
	if err := c.Played(t0, frame(1000)); err != nil {
		t.Fatal(err)
	}
	gap := 10000 * time.Hour // a sample per ns would take 30 min
	done := make(chan error, 1)
	go func() { done <- c.Played(t0.Add(gap), frame(2000)) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Played after a %v gap did not return in 30 s: it fills the gap sample by sample", gap)
	}
	pos := int64(gap.Seconds() * rate)
	got := make([]int16, rate/100)
	c.readFar(got, pos)
	if got[0] != 2000 || got[len(got)-1] != 2000 {
		t.Errorf("the audio after the gap reads %d…%d, want 2000", got[0], got[len(got)-1])
	}
	for _, at := range []int64{pos - int64(len(c.far)), pos - int64(len(c.far))/2, pos - int64(len(got))} {
		c.readFar(got, at)
		for i, v := range got {
			if v != 0 {
				t.Fatalf("position %d+%d before the audio after the gap reads %d, want silence", at, i, v)
			}
		}
	}
}
