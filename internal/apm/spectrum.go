package apm

import (
	"math"

	"gonum.org/v1/gonum/dsp/fourier"
)

// Band levels: a 10 ms frame's spectrum in numBands bands on the mel
// scale from bandLowHz to bandHighHz, each the mean power of its FFT
// bins over the frame and the one before (a 20 ms Hann window, zero
// padded to a power of two), in dB. The voice's pitch harmonics and
// formants fall in different bands for two talkers, so an input that
// holds the user's voice over the agent's echo stands above the echo's
// level in some bands even where the two are as loud overall.
const (
	numBands   = 16
	bandLowHz  = 200
	bandHighHz = 6000
)

// bands is one frame's band levels (dB).
type bands [numBands]float64

// bander computes band levels; it allocates nothing per frame.
type bander struct {
	fft   *fourier.FFT
	win   []float64 // Hann, 2 frames long
	seq   []float64 // the window's samples, zero padded to a power of two
	coef  []complex128
	edges [numBands + 1]int // bin edges: band b is bins [edges[b], edges[b+1])
}

func newBander(rate int) *bander {
	n := 2 * rate / 100
	size := 1
	for size < n {
		size <<= 1
	}
	b := &bander{fft: fourier.NewFFT(size), win: make([]float64, n), seq: make([]float64, size), coef: make([]complex128, size/2+1)}
	for i := range b.win {
		b.win[i] = 0.5 - 0.5*math.Cos(2*math.Pi*(float64(i)+0.5)/float64(n))
	}
	mel := func(hz float64) float64 { return 2595 * math.Log10(1+hz/700) }
	hz := func(m float64) float64 { return 700 * (math.Pow(10, m/2595) - 1) }
	lo, hi := mel(bandLowHz), mel(min(bandHighHz, 0.45*float64(rate)))
	binHz := float64(rate) / float64(size)
	for i := range b.edges {
		b.edges[i] = int(math.Round(hz(lo+(hi-lo)*float64(i)/numBands) / binHz))
		if i > 0 && b.edges[i] <= b.edges[i-1] {
			b.edges[i] = b.edges[i-1] + 1
		}
	}
	return b
}

// levels computes the band levels of prev followed by cur (one 10 ms
// frame each) into out. Input under quietDB (a listening client's
// microphone after its own noise suppression, digital silence) gives
// -200 dB in every band without a transform: no band of it could stand
// over a noise floor or an echo, and a client with no echo spends most
// of the agent's audio there.
func (b *bander) levels(prev, cur []int16, out *bands) {
	n := len(cur)
	var pow float64
	for i, v := range prev {
		f := float64(v)
		b.seq[i] = f * b.win[i]
		pow += f * f
	}
	for i, v := range cur {
		f := float64(v)
		b.seq[n+i] = f * b.win[n+i]
		pow += f * f
	}
	if dB(pow/float64(2*n)) < quietDB {
		for i := range out {
			out[i] = -200
		}
		return
	}
	clear(b.seq[2*n:])
	b.fft.Coefficients(b.coef, b.seq)
	// Normalized so that a full-scale sine reads 0 dB in the band that
	// holds its window's main lobe (Parseval: the one-sided spectrum's
	// power sums to size/2 times the windowed samples', and a Hann
	// window of 2n samples has a power sum of 3/8 of that).
	norm := 32 / (3 * float64(len(b.seq)) * float64(2*n) * 32768 * 32768)
	for k := range out {
		var s float64
		for j := b.edges[k]; j < b.edges[k+1]; j++ {
			c := b.coef[j]
			s += real(c)*real(c) + imag(c)*imag(c)
		}
		out[k] = 10 * math.Log10(s*norm+1e-20)
	}
}
