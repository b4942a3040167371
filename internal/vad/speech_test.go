package vad

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// This file makes the test audio: speech from espeak-ng, converted by sox
// to the rate under test, and noise from a seeded generator, so that every
// run sees the same samples and the ground truth comes from the generation,
// never from the detector.

// speakCache keeps what speak made, by voice, text and rate: tests ask
// for the same speech many times.
var speakCache sync.Map // speakKey → []int16

type speakKey struct {
	voice, text string
	rate        int
}

// speak renders text with an espeak-ng voice and returns it as mono
// 16-bit samples at rate Hz (sox resamples it, without dither, so the
// output is reproducible). The caller must not modify the result.
func speak(t testing.TB, voice, text string, rate int) []int16 {
	t.Helper()
	key := speakKey{voice, text, rate}
	if s, ok := speakCache.Load(key); ok {
		return s.([]int16)
	}
	dir := t.TempDir()
	wav := filepath.Join(dir, "speech.wav")
	if out, err := exec.Command("espeak-ng", "-v", voice, "-s", "160", "-w", wav, text).CombinedOutput(); err != nil {
		t.Fatalf("espeak-ng: %v: %s", err, out)
	}
	raw := filepath.Join(dir, "speech.raw")
	cmd := exec.Command("sox", "-R", "-D", "-V1", wav, "-r", strconv.Itoa(rate), "-b", "16", "-e", "signed-integer", "-c", "1", "-t", "raw", raw)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sox: %v: %s", err, out)
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	s := make([]int16, len(b)/2)
	if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, s); err != nil {
		t.Fatal(err)
	}
	speakCache.Store(key, s)
	return s
}

// activeSpan is the first and last sample of s at or above -40 dB
// relative to its peak: where the synthesized speech really starts and
// ends, past espeak-ng's leading and trailing silence.
func activeSpan(s []int16) (first, last int) {
	peak := 0
	for _, v := range s {
		peak = max(peak, abs(int(v)))
	}
	lim := peak / 100
	first, last = -1, -1
	for i, v := range s {
		if abs(int(v)) >= lim && lim > 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	return first, last
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// rms of s[from:to] (float samples).
func rms(s []float64) float64 {
	var sum float64
	for _, v := range s {
		sum += v * v
	}
	return math.Sqrt(sum / float64(max(len(s), 1)))
}

// whiteNoise returns n samples of Gaussian white noise of RMS level.
func whiteNoise(seed uint64, n int, level float64) []float64 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]float64, n)
	for i := range out {
		out[i] = r.NormFloat64() * level
	}
	return out
}

// babbleTexts are read at once by babble's talkers.
var babbleTexts = []string{
	"The committee met on Tuesday to discuss the budget for the coming year, and after a long debate they agreed to postpone the decision until the next meeting in the spring.",
	"When the train finally arrived, the platform was crowded with travellers carrying suitcases, umbrellas and bags of shopping from the market near the old station.",
	"Please remember to water the plants in the kitchen and close every window before you leave, because the forecast says there will be heavy rain tonight.",
	"Our new product combines a faster processor with a larger battery, so customers can work for a whole day without looking for a charger or a power socket.",
	"In the small village by the river, the baker opens his shop at five in the morning and sells fresh bread to the fishermen before they go out on their boats.",
	"Scientists have observed that some birds can recognise their own reflection, which suggests they may be more aware of themselves than we once believed.",
	"If you turn left at the next crossing and follow the road past the church, you will see the museum on your right just after the bridge.",
	"The children spent the whole afternoon building a castle of sand on the beach, and cried when the evening tide washed it away.",
}

// babbleVoices are the talkers of babble, one per text.
var babbleVoices = []string{"en-us", "en-gb+f2", "en-us+m3", "en-gb-scotland+f4", "en-029+m5", "en-gb-x-rp+f3", "en-us+m7", "en-gb+f5"}

// babbleCache keeps babble's mixes at RMS 1, babbleSeconds long, by rate
// and mix.
var babbleCache sync.Map // [2]int{rate, mix} → []float64

// babbleSeconds is the longest babble a test asks for.
const babbleSeconds = 60

// babble returns n samples (at most babbleSeconds of them) at rate Hz of
// eight espeak-ng talkers reading different texts at once, each looped
// from its own offset and sized to the same level, the whole scaled to
// RMS level: the "cocktail party" noise, of speech's own spectrum, that a
// VAD must not take for a talker. mix (0, 1, ...) picks another pairing
// of voices and texts and other offsets.
func babble(t testing.TB, rate, n int, level float64, mix int) []float64 {
	t.Helper()
	if n > babbleSeconds*rate {
		t.Fatalf("babble: %d samples is over %d s", n, babbleSeconds)
	}
	var base []float64
	if b, ok := babbleCache.Load([2]int{rate, mix}); ok {
		base = b.([]float64)
	} else {
		base = make([]float64, babbleSeconds*rate)
		for i, text := range babbleTexts {
			s := speak(t, babbleVoices[(i+mix)%len(babbleVoices)], text, rate)
			f, l := activeSpan(s)
			s = s[f : l+1]
			x := make([]float64, len(s))
			for j, v := range s {
				x[j] = float64(v)
			}
			g := 1 / rms(x)
			off := (i*len(x)/len(babbleTexts) + mix*7919) % len(x)
			for j := range base {
				base[j] += x[off] * g
				if off++; off == len(x) {
					off = 0
				}
			}
		}
		g := 1 / rms(base)
		for j := range base {
			base[j] *= g
		}
		babbleCache.Store([2]int{rate, mix}, base)
	}
	out := make([]float64, n)
	g := level / rms(base[:n])
	for j := range out {
		out[j] = base[j] * g
	}
	return out
}

// toPCM clips x to int16 and returns it as little-endian PCM16 bytes.
func toPCM(x []float64) []byte {
	b := make([]byte, 2*len(x))
	for i, v := range x {
		v = math.Round(v)
		v = max(min(v, math.MaxInt16), math.MinInt16)
		binary.LittleEndian.PutUint16(b[2*i:], uint16(int16(v)))
	}
	return b
}
