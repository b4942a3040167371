package speakerphone

import (
	"math"
	"testing"
	"time"

	"gopkg.in/hraban/opus.v2"
)

// TestEchoDelayAndGain: a 20 ms click received at t comes back in the
// microphone at t + the delay, 6 dB down.
func TestEchoDelayAndGain(t *testing.T) {
	s, err := New(Config{DriftPeriod: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := opus.NewEncoder(Rate, 1, opus.AppAudio)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(100, 0)
	tone := make([]int16, 960)
	buf := make([]byte, 1275)
	var peakIn float64
	for k := range 50 { // 1 s of a 1 kHz tone
		for i := range tone {
			v := 8000 * math.Sin(2*math.Pi*1000*float64(k*960+i)/Rate)
			tone[i] = int16(v)
			peakIn = max(peakIn, math.Abs(v))
		}
		n, err := enc.Encode(tone, buf)
		if err != nil {
			t.Fatal(err)
		}
		s.Received(buf[:n], uint32(k*960), t0.Add(time.Duration(k)*20*time.Millisecond))
	}
	// Capture from 0 to 1.5 s: silence before the delay, the tone after.
	mic := make([]int16, 960)
	first := time.Duration(-1)
	var peak float64
	for k := range 75 {
		clear(mic)
		at := t0.Add(time.Duration(k) * 20 * time.Millisecond)
		s.Capture(mic, at)
		for i, v := range mic {
			if math.Abs(float64(v)) > 1000 && first < 0 {
				first = at.Add(time.Duration(i) * time.Second / Rate).Sub(t0)
			}
			if k > 30 && k < 55 {
				peak = max(peak, math.Abs(float64(v)))
			}
		}
	}
	want := s.Delay(first)
	if first < want-10*time.Millisecond || first > want+15*time.Millisecond {
		t.Errorf("echo first heard %v after the tone, want about %v (the delay then)", first, want)
	}
	if g := 20 * math.Log10(peak/peakIn); g < -7.5 || g > -4.5 {
		t.Errorf("echo at %.1f dB of the tone, want -6", g)
	}
	if d := s.Delay(0); d != 150*time.Millisecond {
		t.Errorf("delay at 0 %v, want 150 ms", d)
	}
	if d := s.Delay(5 * time.Second); d != 300*time.Millisecond {
		t.Errorf("delay at half the period %v, want 300 ms", d)
	}
}
