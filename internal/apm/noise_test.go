package apm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	speechgen "github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
)

// nsTexts are what the talker says in TestNoiseSuppression.
var nsTexts = []string{
	"Hello, can you hear me?",
	"I would like to book a table for two people tonight.",
	"Tell me a story about a dragon.",
	"That is enough for now, thank you.",
}

// babbleTexts are read at once by the babble's talkers.
var babbleTexts = []string{
	"The committee met on Tuesday to discuss the budget for the coming year and agreed to postpone the decision.",
	"When the train finally arrived the platform was crowded with travellers carrying suitcases and umbrellas.",
	"Please remember to water the plants in the kitchen and close every window before you leave tonight.",
	"Our new product combines a faster processor with a larger battery so customers can work for a whole day.",
	"In the small village by the river the baker opens his shop at five in the morning and sells fresh bread.",
	"Scientists have observed that some birds can recognise their own reflection in a mirror.",
}

// babbleNoise returns n samples of six espeak-ng talkers reading at once,
// each looped from its own offset at equal level, scaled to RMS level.
func babbleNoise(t testing.TB, rate, n int, level float64) []float64 {
	out := make([]float64, n)
	for i, text := range babbleTexts {
		s, err := speechgen.Say(text, rate)
		if err != nil {
			t.Fatal(err)
		}
		x := toFloat(s)
		g := 1 / rmsOf(x)
		off := i * len(x) / len(babbleTexts)
		for j := range out {
			out[j] += x[(off+j)%len(x)] * g
		}
	}
	g := level / rmsOf(out)
	for j := range out {
		out[j] *= g
	}
	return out
}

func whiteNoise(seed uint64, n int, level float64) []float64 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]float64, n)
	for i := range out {
		out[i] = r.NormFloat64() * level
	}
	return out
}

func rmsOf(x []float64) float64 { return math.Sqrt(power(x, 0, len(x))) }

// snr is ITU-T G.160's way of reading a signal-to-noise ratio off a
// processed signal: the mean power where the talker speaks (known from
// the clean speech) less the noise's share, over the mean power where
// he does not, dB. Frames of 10 ms; speech frames are those where the
// clean speech is within 30 dB of its loudest 10 ms.
func snr(x []float64, clean []float64, rate int) float64 {
	f := rate / 100
	peak := 0.0
	for k := 0; k+f <= len(clean); k += f {
		peak = max(peak, power(clean, k, k+f))
	}
	var sp, np float64
	var sn, nn int
	for k := 0; k+f <= len(x); k += f {
		switch c := power(clean, k, k+f); {
		case c > peak/1000:
			sp += power(x, k, k+f)
			sn++
		case c == 0:
			np += power(x, k, k+f)
			nn++
		}
	}
	sp, np = sp/float64(sn), np/float64(nn)
	return 10 * math.Log10(max(sp-np, 1e-9)/np)
}

// TestNoiseSuppression: speech at -26 dBFS in white noise and in babble
// at 10 dB SNR, through the noise suppressor in each mode. Reported: the
// SNR improvement (G.160's SNRI) and the noise level reduction in the
// pauses. The suppressor must improve the SNR in white noise, far_field
// more than near_field, and never make either noise's SNR worse.
func TestNoiseSuppression(t *testing.T) {
	speechgen.Require(t)
	for _, rate := range []int{16000, 24000} {
		sc, err := speechgen.NewScript(rate, 1500, 1200, nsTexts...)
		if err != nil {
			t.Fatal(err)
		}
		clean := toFloat(sc.Samples)
		g := speechLevel / activeRMS(clean)
		for i := range clean {
			clean[i] *= g
		}
		noises := map[string][]float64{
			"white":  whiteNoise(7, len(clean), speechLevel/math.Sqrt(10)),
			"babble": babbleNoise(t, rate, len(clean), speechLevel/math.Sqrt(10)),
		}
		for _, name := range []string{"white", "babble"} {
			n := noises[name]
			mix := make([]float64, len(clean))
			for i := range mix {
				mix[i] = clean[i] + n[i]
			}
			in := snr(mix, clean, rate)
			gain := map[string]float64{}
			for _, mode := range []string{NearField, FarField} {
				out := suppress(t, Config{Rate: rate, NoiseReduction: mode}, mix)
				// The first second is the suppressor learning the noise.
				skip := rate
				snri := snr(out[skip:], clean[skip:], rate) - snr(mix[skip:], clean[skip:], rate)
				nlr := 10 * math.Log10(power(mix, 0, rate)/power(out, 0, rate))
				gain[mode] = snri
				t.Logf("%d Hz, %s noise, input SNR %.1f dB: %s: SNR improvement %.1f dB, noise level reduction in the lead-in %.1f dB", rate, name, in, mode, snri, nlr)
				if snri < 0 {
					t.Errorf("%d Hz %s %s: SNR %.1f dB worse", rate, name, mode, -snri)
				}
			}
			if name == "white" && (gain[NearField] < 3 || gain[FarField] <= gain[NearField]) {
				t.Errorf("%d Hz white noise: SNR improvement %.1f dB near_field, %.1f far_field: want ≥ 3 dB and far_field more", rate, gain[NearField], gain[FarField])
			}
		}
	}
}

// speechLevel is the RMS of active speech in the tests, -26 dBFS.
const speechLevel = 0.05 * 32768

// activeRMS is the RMS of x over its 10 ms frames within 30 dB of the
// loudest.
func activeRMS(x []float64) float64 {
	f := 160
	peak := 0.0
	for k := 0; k+f <= len(x); k += f {
		peak = max(peak, power(x, k, k+f))
	}
	var s float64
	var n int
	for k := 0; k+f <= len(x); k += f {
		if p := power(x, k, k+f); p > peak/1000 {
			s += p
			n++
		}
	}
	return math.Sqrt(s / float64(n))
}

// suppress runs x through a Cleaner without a far end, 20 ms at a time.
func suppress(t testing.TB, cfg Config, x []float64) []float64 {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := pcmBytes(x)
	fl := cfg.Rate / 50
	t0 := time.Unix(1000, 0)
	for k := 0; 2*(k+1)*fl <= len(b); k++ {
		if err := c.Process(b[2*k*fl:2*(k+1)*fl], int64(k*fl), t0.Add(time.Duration(k+1)*20*time.Millisecond)); err != nil {
			t.Fatal(fmt.Errorf("frame %d: %w", k, err))
		}
	}
	return samples(b)
}
