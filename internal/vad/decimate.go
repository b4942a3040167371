package vad

import "math"

// WebRTC's VAD analyses only the band below 4 kHz: whatever the input
// rate (8, 16, 32 or 48 kHz), it first brings the signal down to 8 kHz.
// 24 kHz is not among its rates, so a 24 kHz session is brought down to
// 8 kHz here, by 3, through a linear-phase low-pass FIR: the same band
// the engine would keep, with no second Opus decoder per session.

const (
	decimTaps   = 48     // FIR length at 24 kHz (delay 23.5 samples, under 1 ms)
	decimCutoff = 3500.0 // Hz: -6 dB point; stop band from about 4.2 kHz (Kaiser β=5: ≥ 50 dB)
	decimBeta   = 5.0    // Kaiser window shape
)

// decimTable holds the filter taps, designed once: an ideal low-pass
// (sinc) at decimCutoff for 24 kHz, shaped by a Kaiser window, with unity
// gain at DC.
var decimTable = func() (h [decimTaps]float32) {
	const fs = 24000.0
	fc := decimCutoff / fs
	var sum float64
	var tmp [decimTaps]float64
	mid := float64(decimTaps-1) / 2
	for i := range tmp {
		x := float64(i) - mid
		sinc := 2 * fc
		if x != 0 {
			sinc = math.Sin(2*math.Pi*fc*x) / (math.Pi * x)
		}
		r := x / mid
		tmp[i] = sinc * bessel0(decimBeta*math.Sqrt(max(0, 1-r*r))) / bessel0(decimBeta)
		sum += tmp[i]
	}
	for i := range tmp {
		h[i] = float32(tmp[i] / sum)
	}
	return h
}()

// bessel0 is the zeroth-order modified Bessel function of the first
// kind, I0(x), by its power series (converges fast for the x used here).
func bessel0(x float64) float64 {
	sum, term := 1.0, 1.0
	for k := 1; k < 50; k++ {
		term *= (x / (2 * float64(k))) * (x / (2 * float64(k)))
		sum += term
		if term < 1e-12*sum {
			break
		}
	}
	return sum
}

// decimator turns 24 kHz frames into 8 kHz frames, one call per frame,
// keeping the filter's history between calls so that frame edges leave
// no clicks. The zero value is ready to use (its history is silence).
type decimator struct {
	buf [decimTaps - 1 + maxFrameSamples]float32 // history, then the frame
}

// process filters in (24 kHz samples, a multiple of 3, at most
// maxFrameSamples) into out[:len(in)/3] (8 kHz) and returns that slice.
func (d *decimator) process(in []int16, out []int16) []int16 {
	const hist = decimTaps - 1
	for i, v := range in {
		d.buf[hist+i] = float32(v)
	}
	n := len(in) / 3
	out = out[:n]
	for k := range n {
		// Output k is aligned with input 3k+2 (the newest sample
		// that falls on the 8 kHz grid's slot). The filter is
		// symmetric, so each tap multiplies a pair of samples.
		w := (*[decimTaps]float32)(d.buf[3*k+2 : 3*k+2+decimTaps])
		var acc float32
		for j := range decimTaps / 2 {
			acc += decimTable[j] * (w[j] + w[decimTaps-1-j])
		}
		acc = float32(math.Round(float64(acc)))
		out[k] = int16(max(min(acc, math.MaxInt16), math.MinInt16))
	}
	copy(d.buf[:hist], d.buf[len(in):len(in)+hist])
	return out
}
