package vad

import (
	"flag"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"slices"
	"testing"
)

var (
	sweep         = flag.Bool("vad.sweep", false, "run TestTuningSweep (minutes): the accuracy test's cases under other tunings")
	sweepFirstMix = flag.Int("vad.sweep.mix", 0, "first noise mix TestTuningSweep runs (TestAccuracy runs 0 to 3; 4 and on are held out)")
	sweepFrame    = flag.Int("vad.sweep.frame", Frame20ms, "frame length TestTuningSweep runs the detector at, ms (10 or 20)")
)

// TestTuningSweep runs the accuracy test's cases under a grid of tunings
// around defaultTuning and logs, for each, how many utterances were
// missed, merged, split or mislocated (onset error over 100 ms), the false
// starts on noise alone, and the onset error and reporting latency. It is
// how defaultTuning was chosen (docs/vad.md); it asserts nothing and runs
// only with -vad.sweep.
func TestTuningSweep(t *testing.T) {
	if !*sweep {
		t.Skip("run with -vad.sweep")
	}
	speech.Require(t)
	type tcase struct {
		rate  int
		sc    scene
		alone []byte
	}
	var cases []tcase
	for _, rate := range []int{Rate16k, Rate24k} {
		for _, k := range noiseKinds {
			for mix := *sweepFirstMix; mix < *sweepFirstMix+noiseMixes; mix++ {
				cases = append(cases, tcase{rate,
					makeScene(t, rate, func(n int) []float64 { return k.noise(t, rate, n, mix) }),
					toPCM(k.noise(t, rate, 60*rate, mix))})
			}
		}
	}
	runTuned := func(tu tuning, rate int, pcm []byte) (evs []Event, at []int64) {
		d, err := newDetector(DefaultTurnDetection(), rate, *sweepFrame, tu)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		for off := 0; off+d.FrameBytes() <= len(pcm); off += d.FrameBytes() {
			ev, _ := d.Process(pcm[off : off+d.FrameBytes()])
			if ev.Kind == SpeechStarted {
				evs = append(evs, ev)
				at = append(at, d.PositionMs())
			}
		}
		return evs, at
	}
	for _, rise := range []float64{2.5, 7.5} {
		for _, m := range []float64{12, 14, 16} {
			for _, sm := range []int{40, 60} {
				for _, q := range []float64{0.3, 0.5} {
					for _, start := range []int{40, 60} {
						tu := tuning{marginPerT: m, floorQ: q, smoothMs: sm, startMs: start, speechRise: rise}
						bad, falses := 0, 0
						var errs, lats []int64
						for _, c := range cases {
							starts, at := runTuned(tu, c.rate, c.sc.pcm)
							if len(starts) != len(c.sc.onsets) {
								bad += abs(len(starts) - len(c.sc.onsets))
							} else {
								for i, on := range c.sc.onsets {
									e := abs64(starts[i].SpeechMs - int64(on))
									errs = append(errs, e)
									lats = append(lats, at[i]-int64(on))
									if e > 100 {
										bad++
									}
								}
							}
							f, _ := runTuned(tu, c.rate, c.alone)
							falses += len(f)
						}
						if len(errs) == 0 {
							errs, lats = []int64{0}, []int64{0}
						}
						t.Logf("%+v: bad %d, false starts %d; |onset error| p50 %d max %d ms; reported after onset p50 %d p90 %d max %d ms",
							tu, bad, falses, pct(errs, 50), slices.Max(errs), pct(lats, 50), pct(lats, 90), slices.Max(lats))
					}
				}
			}
		}
	}
}
