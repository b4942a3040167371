package apm

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// replayDir names a directory of dumps (e2e TestSpeakerphone's
// -speakerphone.dump: <run>.apmdump beside <run>.json) for TestReplay.
var replayDir = flag.String("apm.replay", "", "directory of echo dumps to replay (e2e -speakerphone.dump)")

// replayed is a dump run through a fresh Cleaner.
type replayed struct {
	rate        int
	raw, clean  []float64 // the input on its own clock, from the first position
	pos0        int64
	far         []float64 // the far end on the Cleaner's timeline, from its origin
	stats       Stats
	onsetFrames []int // the user's onsets, 20 ms frames of the client's
	t0          time.Time
	// base is when the input at pos0 was captured, about: the earliest
	// arrival less the audio's position.
	base time.Time
}

// replay runs the dump at path through a Cleaner made with cfg (its rate
// from the dump).
func replay(t testing.TB, path string, cfg Config) replayed {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r replayed
	var c *Cleaner
	var origin time.Time
	err = ReadDump(f, func(rate int, rec DumpRecord) error {
		if c == nil {
			cfg.Rate = rate
			r.rate = rate
			if c, err = New(cfg); err != nil {
				return err
			}
			origin = rec.At
		}
		switch rec.Kind {
		case DumpPlayed:
			at := int(rec.At.Sub(origin).Seconds() * float64(rate))
			x := samples(rec.PCM)
			if at >= 0 {
				for len(r.far) < at+len(x) {
					r.far = append(r.far, 0)
				}
				copy(r.far[at:], x)
			}
			return c.Played(rec.At, rec.PCM)
		default:
			if len(r.raw) == 0 && r.pos0 == 0 {
				r.pos0 = rec.Pos
			}
			at := int(rec.Pos - r.pos0)
			if b := rec.At.Add(-time.Duration(at+len(rec.PCM)/2) * time.Second / time.Duration(rate)); r.base.IsZero() || b.Before(r.base) {
				r.base = b
			}
			x := samples(rec.PCM)
			if err := c.Process(rec.PCM, rec.Pos, rec.At); err != nil {
				return err
			}
			y := samples(rec.PCM)
			for len(r.raw) < at+len(x) {
				r.raw, r.clean = append(r.raw, 0), append(r.clean, 0)
			}
			if at >= 0 {
				copy(r.raw[at:], x)
				copy(r.clean[at:], y)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrDump) {
		t.Fatal(err)
	} else if err != nil {
		t.Logf("%s: %v (replayed up to it)", path, err)
	}
	if c == nil {
		t.Fatalf("%s: no records", path)
	}
	r.stats = c.Stats()
	c.Close()
	if j, err := os.ReadFile(strings.TrimSuffix(path, ".apmdump") + ".json"); err == nil {
		var side struct {
			T0          int64 `json:"t0_unix_ns"`
			OnsetFrames []int `json:"onset_frames"`
		}
		if err := json.Unmarshal(j, &side); err != nil {
			t.Fatal(err)
		}
		r.onsetFrames, r.t0 = side.OnsetFrames, time.Unix(0, side.T0)
	}
	return r
}

// TestReplay replays recorded sessions (-apm.replay=DIR) through the
// Cleaner as it is now, and reports the speech starts the default
// detector hears in the input as it came and as cleaned: those within
// 1.5 s after a user's onset are the user heard (ms after the onset),
// the others are the echo or noise starting a turn. A diagnosis tool: it
// asserts nothing.
func TestReplay(t *testing.T) {
	if *replayDir == "" {
		t.Skip("no -apm.replay directory")
	}
	paths, _ := filepath.Glob(filepath.Join(*replayDir, "*.apmdump"))
	if len(paths) == 0 {
		t.Fatalf("no .apmdump files in %s", *replayDir)
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			for _, guard := range []bool{false, true} {
				r := replay(t, p, Config{EchoCancellation: true, GuardFirstReply: guard})
				ms := func(i int) int64 { return int64(i) * 1000 / int64(r.rate) }
				onsets := make([]int64, len(r.onsetFrames))
				for i, f := range r.onsetFrames {
					onsets[i] = r.t0.Add(time.Duration(f) * 20 * time.Millisecond).Sub(r.base).Milliseconds()
				}
				classify := func(starts []int64) (heard []int64, falseStarts []int64) {
					for _, s := range starts {
						user := false
						for _, o := range onsets {
							if s >= o && s < o+1500 {
								user = true
								heard = append(heard, s-o)
								break
							}
						}
						if !user {
							falseStarts = append(falseStarts, s)
						}
					}
					return heard, falseStarts
				}
				rh, rf := classify(reports(t, r.rate, r.raw))
				ch, cf := classify(reports(t, r.rate, r.clean))
				t.Logf("guard %v: %.1f s of input, far end %.1f s; delay %d ms (measured %v), %d of %d frames gated, coupling %.1f dB",
					guard, float64(ms(len(r.raw)))/1000, float64(ms(len(r.far)))/1000, r.stats.DelayMs, r.stats.Measured, r.stats.Gated, r.stats.Frames, r.stats.CouplingDB)
				t.Logf("  as it came: user heard after %v ms; other starts at %v ms", rh, rf)
				t.Logf("  cleaned:    user heard after %v ms; other starts at %v ms (%d)", ch, cf, len(cf))
			}
		})
	}
}
