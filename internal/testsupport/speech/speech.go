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

// Say renders text with espeak-ng's default English voice at 160 words a
// minute and returns it as mono 16-bit samples at rate Hz, trimmed of
// espeak-ng's leading and trailing silence (so sample 0 is the onset).
// The result is shared: do not modify it.
func Say(text string, rate int) ([]int16, error) {
	k := key{text, rate}
	if s, ok := cache.Load(k); ok {
		return s.([]int16), nil
	}
	dir, err := os.MkdirTemp("", "speech")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	wav := filepath.Join(dir, "s.wav")
	if out, err := exec.Command("espeak-ng", "-s", "160", "-w", wav, text).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("speech: espeak-ng: %v: %s", err, out)
	}
	raw := filepath.Join(dir, "s.raw")
	if out, err := exec.Command("sox", "-R", "-D", "-V1", wav, "-r", strconv.Itoa(rate), "-b", "16", "-e", "signed-integer", "-c", "1", "-t", "raw", raw).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("speech: sox: %v: %s", err, out)
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		return nil, err
	}
	s := make([]int16, len(b)/2)
	_ = binary.Read(bytes.NewReader(b), binary.LittleEndian, s)
	first, last := activeSpan(s)
	s = s[first : last+1]
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
	sc := &Script{Rate: rate, Samples: make([]int16, leadMs*rate/1000)}
	for _, text := range texts {
		s, err := Say(text, rate)
		if err != nil {
			return nil, err
		}
		start := len(sc.Samples) * 1000 / rate
		sc.Samples = append(sc.Samples, s...)
		sc.Utterances = append(sc.Utterances, Utterance{StartMs: start, EndMs: len(sc.Samples) * 1000 / rate, Text: text})
		sc.Samples = append(sc.Samples, make([]int16, pauseMs*rate/1000)...)
	}
	return sc, nil
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
