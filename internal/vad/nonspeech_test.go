package vad

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/apm"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
)

// This file is the harder turn-detection test set (issue 26): sounds
// that are not speech, in a quiet room, between the talker's utterances
// and over their starts, where a detector must start no turn and still
// find every utterance. Every sound is made here: sox synthesizes it
// from noise and tones with envelopes and filters, espeak-ng speaks the
// television, and the test lays it out with a seeded generator, so the
// truth (where speech is) comes from the generation.

// nsWAVDir, when set, is where TestNonSpeech writes each scene as a WAV
// file with its truth (JSON), for other detectors to be run on the same
// audio (docs/vad.md: Silero VAD through ONNX Runtime).
var nsWAVDir = flag.String("vad.nonspeech.wav", "", "write TestNonSpeech's scenes and truth to this directory")

// soxSound renders a sound with sox: args are the effects and synth
// arguments after "-n -r RATE -b 16 -c 1 -t raw FILE synth". It returns
// the samples as float64 at rate Hz.
func soxSound(t testing.TB, rate int, args ...string) []float64 {
	t.Helper()
	f := filepath.Join(t.TempDir(), "s.raw")
	cmd := exec.Command("sox", append([]string{"-R", "-V1", "-n", "-r", strconv.Itoa(rate), "-b", "16", "-e", "signed-integer", "-c", "1", "-t", "raw", f}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sox %v: %v: %s", args, err, out)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	s := make([]int16, len(b)/2)
	_ = binary.Read(bytes.NewReader(b), binary.LittleEndian, s)
	x := make([]float64, len(s))
	for i, v := range s {
		x[i] = float64(v)
	}
	return x
}

// peakTo scales x so that its peak is level (linear, of 32768).
func peakTo(x []float64, level float64) []float64 {
	p := 0.0
	for _, v := range x {
		p = max(p, math.Abs(v))
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * level / p
	}
	return out
}

// rmsTo scales x so that its RMS is level.
func rmsTo(x []float64, level float64) []float64 {
	g := level / rms(x)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * g
	}
	return out
}

// dBFS of an amplitude relative to 32768.
func fs(db float64) float64 { return 32768 * math.Pow(10, db/20) }

// nonSpeechKind is one kind of sound of the test set: burst makes one
// instance of it at rate (variant picks among a few), placed in the
// pauses every everyMs.
type nonSpeechKind struct {
	name  string
	burst func(t testing.TB, rate, variant int) []float64
}

// nonSpeechKinds are the sounds, with how each is made:
var nonSpeechKinds = []nonSpeechKind{
	{"none", func(testing.TB, int, int) []float64 { return nil }},
	// A cough: two bursts of pink noise through a band-pass around the
	// vocal tract's first formants (400–1500 Hz), each with a 5 ms
	// attack and an exponential-like decay, peak -12 dBFS: louder than
	// the talker, as a cough near the microphone is.
	{"cough", func(t testing.TB, rate, v int) []float64 {
		a := soxSound(t, rate, "synth", "0.18", "pinknoise", "sinc", "400-1500", "fade", "q", "0.005", "0.18", "0.15")
		b := soxSound(t, rate, "synth", "0.12", "pinknoise", "sinc", fmt.Sprintf("%d-1800", 350+50*v), "fade", "q", "0.005", "0.12", "0.1")
		x := append(a, make([]float64, rate*(60+10*v)/1000)...)
		return peakTo(append(x, b...), fs(-12))
	}},
	// Clicks: a pen, a mouse: a 3 ms burst of white noise, peak -14
	// dBFS, three of them 80–200 ms apart.
	{"click", func(t testing.TB, rate, v int) []float64 {
		c := peakTo(soxSound(t, rate, "synth", "0.003", "whitenoise", "fade", "q", "0", "0.003", "0.002"), fs(-14))
		var x []float64
		for i := range 3 {
			x = append(x, c...)
			x = append(x, make([]float64, rate*(80+40*((v+i)%4))/1000)...)
		}
		return x
	}},
	// Typing: 2 s of keystrokes, each a 12 ms burst of band-passed noise
	// (1–6 kHz) with a 2 ms attack, 90–220 ms apart (a seeded random
	// rhythm), peaks between -30 and -22 dBFS.
	{"typing", func(t testing.TB, rate, v int) []float64 {
		key := soxSound(t, rate, "synth", "0.012", "whitenoise", "sinc", fmt.Sprintf("1000-%d", min(6000, rate/2-500)), "fade", "q", "0.002", "0.012", "0.009")
		r := rand.New(rand.NewPCG(uint64(v), 7))
		var x []float64
		for len(x) < 2*rate {
			x = append(x, peakTo(key, fs(-30+8*r.Float64()))...)
			x = append(x, make([]float64, rate*(90+r.IntN(130))/1000)...)
		}
		return x
	}},
	// A door slam: brown noise low-passed at 250 Hz with a 2 ms attack
	// and a 400 ms decay, then sox's reverb (a room), peak -6 dBFS.
	{"door", func(t testing.TB, rate, v int) []float64 {
		return peakTo(soxSound(t, rate, "synth", "0.5", "brownnoise", "lowpass", strconv.Itoa(200+50*v), "fade", "q", "0.002", "0.5", "0.45", "reverb", "50", "pad", "0", "0.3"), fs(-6))
	}},
	// Music: 3 s of plucked-string chords (sox's pluck synth, C–E–G,
	// F–A–C, G–B–D, half a second each, twice), RMS -32 dBFS: a radio in
	// the room.
	{"music", func(t testing.TB, rate, v int) []float64 {
		chords := [][3]string{{"C4", "E4", "G4"}, {"F3", "A3", "C4"}, {"G3", "B3", "D4"}}
		var x []float64
		for i := range 6 {
			c := chords[(i+v)%3]
			x = append(x, soxSound(t, rate, "synth", "0.5", "pluck", c[0], "pluck", c[1], "pluck", c[2], "remix", "-")...)
		}
		return rmsTo(x, fs(-32))
	}},
	// Distant television speech: espeak-ng reading a sentence, through a
	// loudspeaker's band (sox sinc 300–3400 Hz) and a large room's reverb,
	// RMS -42 dBFS: 16 dB under the talker.
	{"tv", func(t testing.TB, rate, v int) []float64 {
		texts := []string{"And now the weather for the weekend, with rain spreading from the west.", "The markets closed higher today after a week of losses.", "Scientists say the discovery could change how we think about the ocean."}
		s := speak(t, "en-us+m2", texts[v%len(texts)], rate)
		f, l := activeSpan(s)
		x := make([]float64, l+1-f)
		for i, v := range s[f : l+1] {
			x[i] = float64(v)
		}
		dir := t.TempDir()
		in, out := filepath.Join(dir, "in.raw"), filepath.Join(dir, "out.raw")
		if err := os.WriteFile(in, toPCM(x), 0o600); err != nil {
			t.Fatal(err)
		}
		raw := []string{"-t", "raw", "-r", strconv.Itoa(rate), "-b", "16", "-e", "signed-integer", "-c", "1"}
		args := append(append([]string{"-R", "-V1"}, raw...), in)
		args = append(append(args, raw...), out, "sinc", "300-3400", "reverb", "80", "80", "100", "gain", "-n")
		if o, err := exec.Command("sox", args...).CombinedOutput(); err != nil {
			t.Fatalf("sox: %v: %s", err, o)
		}
		b, _ := os.ReadFile(out)
		y := make([]float64, len(b)/2)
		for i := range y {
			y[i] = float64(int16(binary.LittleEndian.Uint16(b[2*i:])))
		}
		return rmsTo(y, fs(-42))
	}},
}

// roomLevel is the quiet room under every scene: white noise at -60 dBFS.
const roomLevel = 0.001 * 32768

// nonSpeechPauseMs is the pause before each utterance of a non-speech
// scene: room for a sound of up to nonSpeechMaxMs that starts 400 ms
// after the previous utterance and ends, with the silence window (500 ms)
// and 200 ms to spare, before the next.
const (
	nonSpeechPauseMs = 2300
	nonSpeechMaxMs   = 1200
)

// nonSpeechScene lays sceneUtterances out after nonSpeechPauseMs each, over
// a quiet room, with the kind's sounds: one in every pause (between
// speech: from 400 ms after the previous utterance, cut at
// nonSpeechMaxMs) and, at every other utterance, one starting 100 ms
// before its onset (over speech).
func nonSpeechScene(t testing.TB, rate int, k nonSpeechKind) scene {
	sc := scene{rate: rate}
	var x []float64
	for _, u := range sceneUtterances {
		x = append(x, make([]float64, nonSpeechPauseMs*rate/1000)...)
		s := speak(t, u.voice, u.text, rate)
		f, l := activeSpan(s)
		y := make([]float64, l+1-f)
		for j, v := range s[f : l+1] {
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
	frame := rate / 50
	x = append(x, make([]float64, (frame-len(x)%frame)%frame)...)
	for i, v := range whiteNoise(77, len(x), roomLevel) {
		x[i] += v
	}
	add := func(at int, b []float64, limit int) {
		for j, v := range b {
			if j >= limit || at+j >= len(x) {
				break
			}
			x[at+j] += v
		}
	}
	prevEnd := 0
	for i, on := range sc.onsets {
		add((prevEnd+400)*rate/1000, k.burst(t, rate, i), nonSpeechMaxMs*rate/1000)
		if i%2 == 1 {
			add((on-100)*rate/1000, k.burst(t, rate, i+1), len(x))
		}
		prevEnd = sc.offsets[i]
	}
	sc.pcm = toPCM(x)
	return sc
}

// starts are a run's speech starts: where each was decided and its onset.
type detectorStarts struct {
	decided []int64 // end of the frame that reported the start, ms
	onset   []int64 // the onset it reported (SpeechMs), ms
}

// score counts a scene's false starts (a start whose reported onset is
// not within 300 ms before to 400 ms after a true onset, or a second one
// for the same utterance: a sound 100 ms before the talker starts may
// start the turn a little early) and missed utterances (no start whose onset is
// in that window), and gathers the delay from each true onset to the
// report.
func score(sc scene, st detectorStarts) (falses, missed int, delays []int64) {
	used := make([]bool, len(sc.onsets))
	for k, o := range st.onset {
		hit := false
		for i, on := range sc.onsets {
			if !used[i] && o >= int64(on)-300 && o <= int64(on)+400 {
				used[i], hit = true, true
				delays = append(delays, st.decided[k]-int64(on))
				break
			}
		}
		if !hit {
			falses++
		}
	}
	for _, u := range used {
		if !u {
			missed++
		}
	}
	return falses, missed, delays
}

// webrtcStarts runs today's detector (default configuration, 20 ms
// frames) over pcm, after noise suppression of the given type ("" for
// none).
func webrtcStarts(t testing.TB, rate int, pcm []byte, nr string) detectorStarts {
	t.Helper()
	if nr != "" {
		c, err := apm.New(apm.Config{Rate: rate, NoiseReduction: nr})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		pcm = bytes.Clone(pcm)
		fl := 2 * rate / 50
		for off := 0; off+fl <= len(pcm); off += fl {
			if err := c.Process(pcm[off:off+fl], int64(off/2), testClock(off/2, rate)); err != nil {
				t.Fatal(err)
			}
		}
	}
	evs, decided := run(t, rate, Frame20ms, pcm)
	var st detectorStarts
	for i, ev := range evs {
		if ev.Kind == SpeechStarted {
			st.decided = append(st.decided, decided[i])
			st.onset = append(st.onset, ev.SpeechMs)
		}
	}
	return st
}

// TestNonSpeech runs today's detector over the non-speech test set at 16
// and 24 kHz, without and with noise suppression, and reports false
// starts and missed utterances per sound; it fails on a missed utterance
// (the set must not hide speech) and on more false starts with noise
// suppression than without. With -vad.nonspeech.wav=DIR it writes the
// scenes for other detectors (docs/vad.md).
func TestNonSpeech(t *testing.T) {
	speech.Require(t)
	for _, rate := range []int{Rate16k, Rate24k} {
		totals := map[string][2]int{}
		for _, k := range nonSpeechKinds {
			sc := nonSpeechScene(t, rate, k)
			if *nsWAVDir != "" {
				writeScene(t, *nsWAVDir, fmt.Sprintf("%s-%d", k.name, rate), sc)
			}
			for _, nr := range []string{"", apm.NearField, apm.FarField} {
				falses, missed, delays := score(sc, webrtcStarts(t, rate, sc.pcm, nr))
				name := nr
				if name == "" {
					name = "off"
				}
				t.Logf("%d Hz %-6s noise_reduction %-10s: false starts %d, missed %d of %d, start reported after onset %v ms", rate, k.name, name, falses, missed, len(sc.onsets), delays)
				tot := totals[name]
				tot[0] += falses
				tot[1] += missed
				totals[name] = tot
				if missed > 0 && nr == "" {
					t.Errorf("%d Hz %s: %d utterances missed", rate, k.name, missed)
				}
			}
		}
		t.Logf("%d Hz, all sounds (%d utterances each run): false starts / missed: off %v, near_field %v, far_field %v", rate, len(nonSpeechKinds)*len(sceneUtterances), totals["off"], totals[apm.NearField], totals[apm.FarField])
		for _, nr := range []string{apm.NearField, apm.FarField} {
			if totals[nr][0] > totals["off"][0] || totals[nr][1] > totals["off"][1] {
				t.Errorf("%d Hz: noise_reduction %s gave %v false starts / missed, more than without (%v)", rate, nr, totals[nr], totals["off"])
			}
		}
	}
}

// testClock is a wall time for the frame at sample pos: noise
// suppression needs none, but Cleaner.Process takes one.
func testClock(pos, rate int) time.Time {
	return time.Unix(1000, 0).Add(time.Duration(pos) * time.Second / time.Duration(rate))
}

// writeScene writes sc as DIR/NAME.wav (PCM16 mono) and DIR/NAME.json
// ({"rate":…, "onsets_ms":[…], "offsets_ms":[…]}).
func writeScene(t testing.TB, dir, name string, sc scene) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var h bytes.Buffer
	h.WriteString("RIFF")
	_ = binary.Write(&h, binary.LittleEndian, uint32(36+len(sc.pcm)))
	h.WriteString("WAVEfmt ")
	_ = binary.Write(&h, binary.LittleEndian, []any{uint32(16), uint16(1), uint16(1), uint32(sc.rate), uint32(2 * sc.rate), uint16(2), uint16(16)})
	h.WriteString("data")
	_ = binary.Write(&h, binary.LittleEndian, uint32(len(sc.pcm)))
	h.Write(sc.pcm)
	if err := os.WriteFile(filepath.Join(dir, name+".wav"), h.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	j, _ := json.Marshal(map[string]any{"rate": sc.rate, "onsets_ms": sc.onsets, "offsets_ms": sc.offsets})
	if err := os.WriteFile(filepath.Join(dir, name+".json"), j, 0o644); err != nil {
		t.Fatal(err)
	}
}
