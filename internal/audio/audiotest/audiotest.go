// Package audiotest compares decoded speech with its original, for tests
// of the PCM path (internal/audio, the transceiver's PCM bridge formats).
package audiotest

import "math"

// Similarity aligns got behind want (lags 0 to maxLag samples, both at the
// same rate) by their waveform cross-correlation and returns, at the best
// lag:
//
//   - waveform: the normalized cross-correlation of the samples, in
//     [-1, 1]. Opus is a perceptual codec: it keeps the spectrum's shape,
//     not the phase, so two generations (client encode, transceiver
//     encode) of clean speech score about 0.88-0.90 full band;
//   - envelope: the normalized cross-correlation of the 10 ms RMS
//     envelopes (window = rate/100 samples), in [0, 1]: whether the
//     syllables, pauses and loudness come back where they were, which a
//     codec must keep (about 0.98 for two Opus generations);
//   - lag in samples.
func Similarity(want, got []float64, rate, maxLag int) (waveform, envelope float64, lag int) {
	waveform = -1
	for l := 0; l <= maxLag && l < len(got); l++ {
		if c := correlate(want, got[l:]); c > waveform {
			waveform, lag = c, l
		}
	}
	win := rate / 100
	return waveform, correlate(rms(want, win), rms(got[lag:], win)), lag
}

// Decimate averages div consecutive samples into one: a crude low-pass
// and rate divider for comparing a 48 kHz original with 24 or 16 kHz PCM.
func Decimate(in []int16, div int) []float64 {
	out := make([]float64, 0, len(in)/div)
	for i := 0; i+div <= len(in); i += div {
		var s float64
		for j := range div {
			s += float64(in[i+j])
		}
		out = append(out, s/float64(div))
	}
	return out
}

func correlate(a, b []float64) float64 {
	n := min(len(a), len(b))
	var ab, aa, bb float64
	for i := range n {
		ab += a[i] * b[i]
		aa += a[i] * a[i]
		bb += b[i] * b[i]
	}
	return ab / math.Sqrt(aa*bb+1e-9)
}

func rms(x []float64, win int) []float64 {
	out := make([]float64, 0, len(x)/win)
	for i := 0; i+win <= len(x); i += win {
		var s float64
		for _, v := range x[i : i+win] {
			s += v * v
		}
		out = append(out, math.Sqrt(s/float64(win)))
	}
	return out
}
