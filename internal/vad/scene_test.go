package vad

import "testing"

// A scene is a test signal with its ground truth: utterances separated by
// pauses, optionally over noise.
type scene struct {
	rate    int
	pcm     []byte
	onsets  []int // true speech onsets, ms from the start of pcm
	offsets []int // true speech ends, ms
	// endSlackMs is how much later than the truth, besides a frame, a
	// speech end may be reported: the delay and ringing of a codec the
	// scene went through (0 for clean audio).
	endSlackMs int
}

// sceneUtterances are what the talker says in a scene, one per turn.
var sceneUtterances = []struct{ voice, text string }{
	{"en-us", "Hello, can you hear me?"},
	{"en-gb+f2", "I would like to book a table for two people tonight."},
	{"en-us+m3", "Sorry, what did you say?"},
	{"en-gb-scotland", "The weather is lovely today."},
	{"en-us+f4", "Tell me a story about a dragon."},
	{"en-029", "That is enough for now, thank you."},
	{"en-gb-x-rp+m5", "Seven hundred and forty two."},
	{"en-us+f3", "Yes."},
}

// scenePauses are the silences before each utterance, ms: all longer than
// the default silence_duration_ms, so every utterance is a turn.
var scenePauses = []int{1500, 1200, 900, 2000, 1100, 1600, 1000, 1300}

// speechLevel is the RMS of the active speech in a scene, -26 dBFS:
// a normal microphone level.
const speechLevel = 0.05 * 32768

// makeScene lays sceneUtterances out after scenePauses (with 1 s of
// tail) at rate Hz, each utterance scaled to speechLevel over its active
// span, and adds noise (nil for none) of the same length: noise(n) must
// return n samples. Truth comes from each clean utterance's active span.
func makeScene(t testing.TB, rate int, noise func(n int) []float64) scene {
	t.Helper()
	sc := scene{rate: rate}
	var x []float64
	for i, u := range sceneUtterances {
		x = append(x, make([]float64, scenePauses[i]*rate/1000)...)
		s := speak(t, u.voice, u.text, rate)
		f, l := activeSpan(s)
		s = s[f : l+1]
		if gap := longestPause(s, rate); gap >= 300 {
			t.Fatalf("utterance %q has a %d ms pause inside: it would be two turns", u.text, gap)
		}
		y := make([]float64, len(s))
		for j, v := range s {
			y[j] = float64(v)
		}
		g := speechLevel / rms(y)
		sc.onsets = append(sc.onsets, len(x)*1000/rate)
		for _, v := range y {
			x = append(x, v*g)
		}
		sc.offsets = append(sc.offsets, len(x)*1000/rate)
	}
	x = append(x, make([]float64, rate)...)
	// Whole 20 ms frames.
	frame := rate / 50
	x = append(x, make([]float64, (frame-len(x)%frame)%frame)...)
	if noise != nil {
		for i, v := range noise(len(x)) {
			x[i] += v
		}
	}
	sc.pcm = toPCM(x)
	return sc
}

// longestPause returns the longest run, in ms, of 10 ms blocks of s whose
// peak is more than 40 dB under the peak of s.
func longestPause(s []int16, rate int) int {
	peak := 0
	for _, v := range s {
		peak = max(peak, abs(int(v)))
	}
	block := rate / 100
	longest, run := 0, 0
	for b := 0; b+block <= len(s); b += block {
		m := 0
		for _, v := range s[b : b+block] {
			m = max(m, abs(int(v)))
		}
		if m < peak/100 {
			run += 10
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	return longest
}
