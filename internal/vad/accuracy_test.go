package vad

import (
	"fmt"
	"slices"
	"testing"
)

// noiseLevel is the RMS of the noise in the accuracy test: 10 dB under
// speechLevel (10 dB SNR).
const noiseLevel = speechLevel / 3.1622776601683795

// run feeds pcm to a detector with the default configuration at rate and
// returns its events, with the position at which each was decided
// (end of the frame that produced it).
func run(t testing.TB, rate int, pcm []byte) (evs []Event, decided []int64) {
	t.Helper()
	d, err := NewDetector(DefaultTurnDetection(), rate)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for off := 0; off+d.FrameBytes() <= len(pcm); off += d.FrameBytes() {
		ev, err := d.Process(pcm[off : off+d.FrameBytes()])
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind != None {
			evs = append(evs, ev)
			decided = append(decided, d.PositionMs())
		}
	}
	return evs, decided
}

// TestAccuracy runs the default detector over speech with pauses in
// silence, in white noise and in babble noise (10 dB SNR), at both input
// rates, and over 60 s of each noise alone. Every utterance must give
// exactly one speech start whose onset is within 100 ms of the true onset
// (from the generation) and one stop after it; noise alone must give no
// start. It logs the figures docs/vad.md reports.
func TestAccuracy(t *testing.T) {
	requireTools(t)
	if testing.Short() {
		t.Skip("generates a few minutes of audio")
	}
	const tolMs = 100
	type result struct {
		onsetErr, latency, endErr []int64
	}
	total := map[int]*result{}
	for _, rate := range []int{Rate16k, Rate24k} {
		total[rate] = &result{}
		conds := []struct {
			name  string
			noise func(n int) []float64
		}{
			{"silence", nil},
			{"white 10 dB", func(n int) []float64 { return whiteNoise(1, n, noiseLevel) }},
			{"babble 10 dB", func(n int) []float64 { return babble(t, rate, n, noiseLevel) }},
		}
		for _, c := range conds {
			t.Run(fmt.Sprintf("%d/%s", rate, c.name), func(t *testing.T) {
				sc := makeScene(t, rate, c.noise)
				evs, decided := run(t, rate, sc.pcm)
				var starts, stops []Event
				var startAt []int64
				for i, ev := range evs {
					// Events alternate, starting with a start.
					want := SpeechStarted
					if i%2 == 1 {
						want = SpeechStopped
					}
					if ev.Kind != want {
						t.Fatalf("event %d is %v, want %v (events %v)", i, ev.Kind, want, evs)
					}
					if ev.Kind == SpeechStarted {
						starts = append(starts, ev)
						startAt = append(startAt, decided[i])
					} else {
						stops = append(stops, ev)
					}
				}
				if len(starts) != len(sc.onsets) || len(stops) != len(sc.onsets) {
					t.Fatalf("%d starts and %d stops for %d utterances: %v (true onsets %v)", len(starts), len(stops), len(sc.onsets), evs, sc.onsets)
				}
				r := total[rate]
				for i, on := range sc.onsets {
					e := starts[i].SpeechMs - int64(on)
					r.onsetErr = append(r.onsetErr, abs64(e))
					r.latency = append(r.latency, startAt[i]-int64(on))
					r.endErr = append(r.endErr, stops[i].SpeechMs-int64(sc.offsets[i]))
					if abs64(e) > tolMs {
						t.Errorf("utterance %d: onset at %d ms, true onset %d ms (error %d ms > %d)", i, starts[i].SpeechMs, on, e, tolMs)
					}
					if want := starts[i].SpeechMs - DefaultPrefixPaddingMs; starts[i].AudioMs != max(0, want) {
						t.Errorf("utterance %d: audio_ms %d, want onset - prefix padding = %d", i, starts[i].AudioMs, want)
					}
					if stops[i].AudioMs-stops[i].SpeechMs != DefaultSilenceDurationMs {
						t.Errorf("utterance %d: stop audio_ms %d - speech end %d != silence_duration_ms", i, stops[i].AudioMs, stops[i].SpeechMs)
					}
				}
				t.Logf("onset errors (ms) %v, start decided after the true onset (ms) %v", signed(starts, sc.onsets), latencies(startAt, sc.onsets))
			})
		}
		for _, c := range []struct {
			name  string
			noise func(n int) []float64
		}{
			{"white alone", func(n int) []float64 { return whiteNoise(2, n, noiseLevel) }},
			{"babble alone", func(n int) []float64 { return babble(t, rate, n, noiseLevel) }},
		} {
			t.Run(fmt.Sprintf("%d/%s", rate, c.name), func(t *testing.T) {
				evs, _ := run(t, rate, toPCM(c.noise(60*rate)))
				if len(evs) != 0 {
					t.Errorf("%d events on 60 s of noise alone, want none: %v", len(evs), evs)
				}
			})
		}
	}
	for _, rate := range []int{Rate16k, Rate24k} {
		r := total[rate]
		t.Logf("%d Hz: onset |error| p50 %d ms, max %d ms; start decided after the onset p50 %d ms, max %d ms; speech end error p50 %d ms, min %d, max %d ms (n=%d)",
			rate, pct(r.onsetErr, 50), slices.Max(r.onsetErr), pct(r.latency, 50), slices.Max(r.latency),
			pct(r.endErr, 50), slices.Min(r.endErr), slices.Max(r.endErr), len(r.onsetErr))
	}
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

func signed(starts []Event, onsets []int) []int64 {
	out := make([]int64, len(onsets))
	for i, on := range onsets {
		out[i] = starts[i].SpeechMs - int64(on)
	}
	return out
}

func latencies(at []int64, onsets []int) []int64 {
	out := make([]int64, len(onsets))
	for i, on := range onsets {
		out[i] = at[i] - int64(on)
	}
	return out
}

// pct returns the p-th percentile of v (nearest rank).
func pct(v []int64, p int) int64 {
	s := slices.Clone(v)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	return s[max(0, i-1)]
}
