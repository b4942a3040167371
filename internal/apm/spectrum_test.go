package apm

import (
	"math"
	"testing"
)

// TestBands: a sine's band levels peak in the band that holds its
// frequency (or the next, where the window's main lobe straddles an edge:
// the band holding it then within 3.5 dB of the peak), about 0 dB at full
// scale and 40 dB less at 1/100 of it (a lobe split across two bands
// reads up to 3 dB less), and
// digital silence reads -200 dB in every band; at every rate a Cleaner
// takes, the bands cover 200 Hz to 6 kHz (or 0.45 of the rate) in order.
func TestBands(t *testing.T) {
	for _, rate := range []int{8000, 16000, 24000, 48000} {
		b := newBander(rate)
		n := rate / 100
		binHz := float64(rate) / float64(len(b.seq))
		for i := 1; i < len(b.edges); i++ {
			if b.edges[i] <= b.edges[i-1] {
				t.Fatalf("%d Hz: band edges %v not increasing", rate, b.edges)
			}
		}
		if lo := float64(b.edges[0]) * binHz; math.Abs(lo-bandLowHz) > binHz {
			t.Errorf("%d Hz: lowest band starts at %.0f Hz", rate, lo)
		}
		for _, hz := range []float64{300, 1000, 2500} {
			for _, amp := range []float64{32000, 320} {
				prev, cur := make([]int16, n), make([]int16, n)
				for i := range 2 * n {
					v := int16(amp * math.Sin(2*math.Pi*hz*float64(i)/float64(rate)))
					if i < n {
						prev[i] = v
					} else {
						cur[i-n] = v
					}
				}
				var out bands
				b.levels(prev, cur, &out)
				want := -1
				for k := range numBands {
					if f := hz / binHz; f >= float64(b.edges[k]) && f < float64(b.edges[k+1]) {
						want = k
					}
				}
				peak := 0
				for k := range out {
					if out[k] > out[peak] {
						peak = k
					}
				}
				if peak < want-1 || peak > want+1 || out[want] < out[peak]-3.5 {
					t.Errorf("%d Hz rate, %.0f Hz sine: peak in band %d, want %d (%v)", rate, hz, peak, want, out)
				}
				full := 20 * math.Log10(amp/32768)
				if math.Abs(out[peak]-full) > 3.5 {
					t.Errorf("%d Hz rate, %.0f Hz sine at %.0f dBFS: band level %.1f dB", rate, hz, full, out[peak])
				}
			}
		}
		var out bands
		z := make([]int16, n)
		b.levels(z, z, &out)
		for k, v := range out {
			if v != -200 {
				t.Errorf("%d Hz: silence reads %.1f dB in band %d", rate, v, k)
			}
		}
		// Noise at -75 dBFS is quiet: no transform; at -65 it is not.
		for _, c := range []struct {
			level float64
			quiet bool
		}{{-75, true}, {-65, false}} {
			x := whiteNoise(3, 2*n, 32768*math.Pow(10, c.level/20))
			s := toInt16(x)
			b.levels(s[:n], s[n:], &out)
			if got := out[5] == -200; got != c.quiet {
				t.Errorf("%d Hz: noise at %.0f dBFS reads %.1f dB in band 5, want quiet %v", rate, c.level, out[5], c.quiet)
			}
		}
	}
}

func toInt16(x []float64) []int16 {
	out := make([]int16, len(x))
	for i, v := range x {
		out[i] = int16(max(-32768, min(32767, math.Round(v))))
	}
	return out
}
