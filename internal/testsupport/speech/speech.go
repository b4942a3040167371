// Package speech makes speech for tests and benchmarks: espeak-ng renders
// text, sox resamples it, and Script lays utterances and pauses out on one
// timeline, written as a WAV file for Chromium's fake microphone
// (--use-file-for-fake-audio-capture) or sent frame by frame by a Pion
// client. espeak-ng and sox are apt packages (scripts/deps.sh test).
package speech

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// Require skips t without espeak-ng and sox, except in CI (CI set), where
// they must be installed.
func Require(t testing.TB) {
	t.Helper()
	for _, name := range []string{"espeak-ng", "sox"} {
		if _, err := exec.LookPath(name); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; in CI it must be (scripts/deps.sh test)", name)
			}
			t.Skipf("%s not installed (apt-get install espeak-ng sox)", name)
		}
	}
}

var cache sync.Map // key → []int16

type key struct {
	text string
	rate int
}

// Cough returns a cough-like burst of durMs as mono 16-bit samples at
// rate Hz: sox's pink noise band-passed to 250–3500 Hz (where a cough's
// energy is), a 5 ms attack and a decay over its last 70 %, its peak at
// −6 dBFS: the kind of short broadband burst a voice activity detector
// may take for the start of speech. It is the same on every run (sox -R).
// The result is shared: do not modify it.
func Cough(durMs, rate int) ([]int16, error) {
	d := float64(durMs) / 1000
	return render(key{fmt.Sprintf("\x00cough %d", durMs), rate}, func(string) (in, effects []string, err error) {
		return []string{"-n"}, []string{"synth", fmt.Sprintf("%.3f", d), "pinknoise", "sinc", "250-3500",
			"fade", "q", "0.005", fmt.Sprintf("%.3f", d), fmt.Sprintf("%.3f", 0.7*d), "norm", "-6"}, nil
	}, false)
}

// Say renders text with espeak-ng's default English voice at 160 words a
// minute and returns it as mono 16-bit samples at rate Hz, trimmed of
// espeak-ng's leading and trailing silence (so sample 0 is the onset).
// The result is shared: do not modify it.
func Say(text string, rate int) ([]int16, error) {
	return render(key{text, rate}, func(dir string) (in, effects []string, err error) {
		wav := filepath.Join(dir, "s.wav")
		if out, err := exec.Command("espeak-ng", "-s", "160", "-w", wav, text).CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("speech: espeak-ng: %v: %s", err, out)
		}
		return []string{"-D", wav}, nil, nil // no dither: the same samples every run
	}, true)
}

// render returns k's sound, made once and cached: source writes what it
// needs in a temporary directory and returns sox's input (with its
// options) and effects, which sox renders as mono PCM16 at k.rate; trim
// cuts the result to its active span.
func render(k key, source func(dir string) (in, effects []string, err error), trim bool) ([]int16, error) {
	if s, ok := cache.Load(k); ok {
		return s.([]int16), nil
	}
	dir, err := os.MkdirTemp("", "speech")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	in, effects, err := source(dir)
	if err != nil {
		return nil, err
	}
	raw := filepath.Join(dir, "s.raw")
	args := append([]string{"-R", "-V1"}, in...)
	args = append(args, "-r", strconv.Itoa(k.rate), "-b", "16", "-e", "signed-integer", "-c", "1", "-t", "raw", raw)
	args = append(args, effects...)
	if out, err := exec.Command("sox", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("speech: sox: %v: %s", err, out)
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		return nil, err
	}
	s := make([]int16, len(b)/2)
	_ = binary.Read(bytes.NewReader(b), binary.LittleEndian, s)
	if trim {
		first, last := activeSpan(s)
		s = s[first : last+1]
	}
	cache.Store(k, s)
	return s, nil
}

// activeSpan is the first and last sample at or above −40 dB relative to
// the peak.
func activeSpan(s []int16) (first, last int) {
	peak := 0
	for _, v := range s {
		peak = max(peak, abs(int(v)))
	}
	lim := peak / 100
	first, last = 0, len(s)-1
	for first < last && abs(int(s[first])) < lim {
		first++
	}
	for last > first && abs(int(s[last])) < lim {
		last--
	}
	return first, last
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// Utterance is one stretch of speech on a Script's timeline.
type Utterance struct {
	// StartMs and EndMs are where the speech starts and ends, ms from the
	// start of the script.
	StartMs, EndMs int
	Text           string
}

// Script is speech with pauses on one timeline, at Rate Hz.
type Script struct {
	Rate       int
	Samples    []int16
	Utterances []Utterance
}

// NewScript lays out texts at rate Hz: leadMs of silence, then each text
// followed by pauseMs of silence.
func NewScript(rate, leadMs, pauseMs int, texts ...string) (*Script, error) {
	sc := &Script{Rate: rate}
	sc.Pause(leadMs)
	for _, text := range texts {
		if err := sc.Say(text); err != nil {
			return nil, err
		}
		sc.Pause(pauseMs)
	}
	return sc, nil
}

// Pause appends ms of silence.
func (sc *Script) Pause(ms int) {
	sc.Samples = append(sc.Samples, make([]int16, ms*sc.Rate/1000)...)
}

// Say appends text spoken (Say) as the next utterance.
func (sc *Script) Say(text string) error {
	s, err := Say(text, sc.Rate)
	if err != nil {
		return err
	}
	sc.add(s, text)
	return nil
}

// Cough appends a cough-like burst of durMs (Cough) as the next
// utterance, its Text "(cough)".
func (sc *Script) Cough(durMs int) error {
	s, err := Cough(durMs, sc.Rate)
	if err != nil {
		return err
	}
	sc.add(s, "(cough)")
	return nil
}

func (sc *Script) add(s []int16, text string) {
	start := len(sc.Samples) * 1000 / sc.Rate
	sc.Samples = append(sc.Samples, s...)
	sc.Utterances = append(sc.Utterances, Utterance{StartMs: start, EndMs: len(sc.Samples) * 1000 / sc.Rate, Text: text})
}

// WriteWAV writes s as a mono 16-bit PCM WAV file (RIFF/WAVE, the format
// Chromium's fake audio capture reads).
func (sc *Script) WriteWAV(path string) error {
	var b bytes.Buffer
	n := 2 * len(sc.Samples)
	b.WriteString("RIFF")
	_ = binary.Write(&b, binary.LittleEndian, uint32(36+n))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(sc.Rate), uint32(2 * sc.Rate), uint16(2), uint16(16)} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	_ = binary.Write(&b, binary.LittleEndian, uint32(n))
	_ = binary.Write(&b, binary.LittleEndian, sc.Samples)
	return os.WriteFile(path, b.Bytes(), 0o644)
}
