package vad

import (
	"fmt"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"slices"
	"sync"
	"testing"
)

// noiseLevel is the RMS of the noise in the accuracy test: 10 dB under
// speechLevel (10 dB SNR).
const noiseLevel = speechLevel / 3.1622776601683795

// frameLengths are the frame lengths the tests run the detector at, ms.
var frameLengths = []int{Frame20ms, Frame10ms}

// run feeds pcm to a detector with the default configuration at rate, in
// frames of frameMs, and returns its events, with the position at which
// each was decided (end of the frame that produced it).
func run(t testing.TB, rate, frameMs int, pcm []byte) (evs []Event, decided []int64) {
	t.Helper()
	d, err := NewDetector(DefaultTurnDetection(), rate, frameMs)
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

// noiseKinds are the noises of the accuracy test, each in several
// mixes: mix m of white noise is seed m, of babble it is babble's mix m.
var noiseKinds = []struct {
	name  string
	noise func(t testing.TB, rate, n, mix int) []float64
}{
	{"white", func(_ testing.TB, _, n, mix int) []float64 { return whiteNoise(uint64(100+mix), n, noiseLevel) }},
	{"babble", func(t testing.TB, rate, n, mix int) []float64 { return babble(t, rate, n, noiseLevel, mix) }},
}

// noiseMixes is how many mixes of each noise the accuracy test runs.
const noiseMixes = 4

// accuracyStats gathers the figures of TestAccuracy at one rate.
type accuracyStats struct {
	mu       sync.Mutex // guards the fields below: the cases run in parallel
	onsetErr []int64    // |reported onset - true onset|, ms
	latency  []int64    // end of the frame that reported the start - true onset, ms
	endErr   []int64    // reported speech end - true end, ms
	noiseSec int        // seconds of noise alone run
	falses   int        // speech starts on noise alone
}

// TestAccuracy runs the default detector over speech with pauses in
// digital silence, in white noise and in babble noise (10 dB SNR, four
// mixes of each), at both input rates and both frame lengths, and over
// 60 s of each noise mix alone. Every utterance must give exactly one
// speech start whose onset is within 100 ms of the true onset (from the
// generation) and one stop whose speech end is at most one frame after
// the true end; noise alone must give no start. It logs the figures
// docs/vad.md reports.
func TestAccuracy(t *testing.T) {
	speech.Require(t)
	if testing.Short() {
		t.Skip("generates minutes of audio")
	}
	for _, fm := range frameLengths {
		for _, rate := range []int{Rate16k, Rate24k} {
			accuracyAt(t, rate, fm)
		}
	}
}

// accuracyAt is TestAccuracy at one rate and frame length.
func accuracyAt(t *testing.T, rate, fm int) {
	st := &accuracyStats{}
	// The cases run in parallel; the figures are logged when all
	// are done.
	t.Run(fmt.Sprintf("%dms/%d", fm, rate), func(t *testing.T) {
		t.Run("silence", func(t *testing.T) {
			t.Parallel()
			checkScene(t, makeScene(t, rate, nil), fm, st)
		})
		for _, k := range noiseKinds {
			for mix := range noiseMixes {
				t.Run(fmt.Sprintf("%s%d", k.name, mix), func(t *testing.T) {
					t.Parallel()
					checkScene(t, makeScene(t, rate, func(n int) []float64 { return k.noise(t, rate, n, mix) }), fm, st)
				})
				t.Run(fmt.Sprintf("%s%d_alone", k.name, mix), func(t *testing.T) {
					t.Parallel()
					evs, _ := run(t, rate, fm, toPCM(k.noise(t, rate, 60*rate, mix)))
					st.mu.Lock()
					st.noiseSec += 60
					for _, ev := range evs {
						if ev.Kind == SpeechStarted {
							st.falses++
						}
					}
					st.mu.Unlock()
					if len(evs) != 0 {
						t.Errorf("%d events on 60 s of noise alone, want none: %v", len(evs), evs)
					}
				})
			}
		}
	})
	if len(st.onsetErr) > 0 {
		t.Logf("%d ms frames, %d Hz: %d onsets: |onset error| p50 %d ms, max %d ms; start reported after the true onset p50 %d ms, p90 %d ms, max %d ms; "+
			"speech end error p50 %d ms (min %d, max %d); %d false starts in %d s of noise alone",
			fm, rate, len(st.onsetErr), pct(st.onsetErr, 50), slices.Max(st.onsetErr), pct(st.latency, 50), pct(st.latency, 90), slices.Max(st.latency),
			pct(st.endErr, 50), slices.Min(st.endErr), slices.Max(st.endErr), st.falses, st.noiseSec)
	}
}

// checkScene runs the default detector over sc in frames of fm and
// checks its events against the truth, adding its figures to st.
func checkScene(t *testing.T, sc scene, fm int, st *accuracyStats) {
	t.Helper()
	const tolMs = 100
	evs, decided := run(t, sc.rate, fm, sc.pcm)
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
		t.Fatalf("%d starts and %d stops for %d utterances: %v (true onsets %v, ends %v)", len(starts), len(stops), len(sc.onsets), evs, sc.onsets, sc.offsets)
	}
	errs := make([]int64, len(sc.onsets))
	lats := make([]int64, len(sc.onsets))
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, on := range sc.onsets {
		e := starts[i].SpeechMs - int64(on)
		errs[i] = e
		lats[i] = startAt[i] - int64(on)
		st.onsetErr = append(st.onsetErr, abs64(e))
		st.latency = append(st.latency, startAt[i]-int64(on))
		st.endErr = append(st.endErr, stops[i].SpeechMs-int64(sc.offsets[i]))
		if abs64(e) > tolMs {
			t.Errorf("utterance %d: onset at %d ms, true onset %d ms (error %d ms > %d)", i, starts[i].SpeechMs, on, e, tolMs)
		}
		if want := max(0, starts[i].SpeechMs-DefaultPrefixPaddingMs); starts[i].AudioMs != want {
			t.Errorf("utterance %d: start audio_ms %d, want onset - prefix_padding_ms = %d", i, starts[i].AudioMs, want)
		}
		// The silence window runs from the speech: the end is never
		// placed past the frame in which the speech ended.
		if late := stops[i].SpeechMs - int64(sc.offsets[i]); late > int64(fm+sc.endSlackMs) {
			t.Errorf("utterance %d: speech end at %d ms, %d ms after the true end %d ms: more than a frame (+%d ms for the codec)", i, stops[i].SpeechMs, late, sc.offsets[i], sc.endSlackMs)
		}
		if stops[i].SpeechMs <= starts[i].SpeechMs || stops[i].AudioMs-stops[i].SpeechMs != DefaultSilenceDurationMs {
			t.Errorf("utterance %d: stop %+v after start %+v: want speech end after the onset and audio_ms = speech end + silence_duration_ms", i, stops[i], starts[i])
		}
	}
	t.Logf("onset errors %v ms; starts reported %v ms after the true onsets", errs, lats)
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// pct returns the p-th percentile of v (nearest rank).
func pct(v []int64, p int) int64 {
	s := slices.Clone(v)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	return s[max(0, i-1)]
}

// TestNoiseAfterSilence starts each noise after 2 s of digital silence
// (a microphone unmuted in a noisy room): the sudden noise may be taken
// for a talker once, but the detector must learn it as background and be
// out of speech within 5 s of its onset, then stay quiet.
func TestNoiseAfterSilence(t *testing.T) {
	speech.Require(t)
	if testing.Short() {
		t.Skip("generates minutes of audio")
	}
	const onsetMs, settleMs = 2000, 5000
	for _, fm := range frameLengths {
		for _, rate := range []int{Rate16k, Rate24k} {
			for _, k := range noiseKinds {
				for mix := range noiseMixes {
					t.Run(fmt.Sprintf("%dms/%d/%s%d", fm, rate, k.name, mix), func(t *testing.T) {
						x := k.noise(t, rate, 30*rate, mix)
						clear(x[:onsetMs*rate/1000])
						evs, _ := run(t, rate, fm, toPCM(x))
						for i, ev := range evs {
							if ev.AudioMs > onsetMs+settleMs {
								t.Errorf("event %v ends after %d ms", ev, onsetMs+settleMs)
							}
							if want := []Kind{SpeechStarted, SpeechStopped}[i%2]; ev.Kind != want {
								t.Errorf("event %d is %v, want %v", i, ev.Kind, want)
							}
						}
						if len(evs)%2 != 0 {
							t.Errorf("still in speech at the end: %v", evs)
						}
					})
				}
			}
		}
	}
}
