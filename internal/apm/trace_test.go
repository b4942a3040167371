package apm

import (
	"fmt"
	"math"
	"strings"
	"path/filepath"
	"testing"
	"time"
)

var logFrames bool

func TestTraceDT(t *testing.T) {
	if *replayDir == "" {
		t.Skip()
	}
	for _, name := range []string{"echo", "barge", "noecho"} {
		var habs, hrel [2][numBands + 1]int
		frame := 0
		dtFrame = func(n int64) { frame = int(n) }
		var r replayed
		var onsets []int
		dtTrace = func(x, bound, floor *bands, nAbs, nRel, active int) {
			user := 0
			for _, o := range onsets {
				if frame*10 >= o && frame*10 < o+600 {
					user = 1
				}
			}
			habs[user][nAbs]++
			if user == 0 && nAbs >= 3 && logFrames {
				top, xt := -200.0, -200.0
				for b := range bound {
					top, xt = max(top, bound[b]), max(xt, x[b])
				}
				t.Logf("t=%d ms nAbs=%d active=%d bound top %.0f x top %.0f", frame*10, nAbs, active, top, xt)
			}
			hrel[user][nRel]++
		}
		// A first pass finds the onsets (in ms of the input).
		r = replay(t, filepath.Join(*replayDir, name+".apmdump"), Config{EchoCancellation: true})
		for _, f := range r.onsetFrames {
			onsets = append(onsets, int(r.t0.Add(time.Duration(f)*20*time.Millisecond).Sub(r.base).Milliseconds()))
		}
		habs, hrel = [2][numBands + 1]int{}, [2][numBands + 1]int{}
		logFrames = name == "echo"
		frame = 0
		replay(t, filepath.Join(*replayDir, name+".apmdump"), Config{EchoCancellation: true})
		t.Logf("%s: echo only: abs %v rel %v", name, habs[0], hrel[0])
		t.Logf("%s: user:      abs %v rel %v", name, habs[1], hrel[1])
	}
	dtTrace = nil
}

func TestTraceGate(t *testing.T) {
	if *replayDir == "" {
		t.Skip()
	}
	type fr struct {
		in, out, far float64
		talk, gated  bool
		d            int
	}
	frames := map[int64]fr{}
	gateTrace = func(frame int64, inDB, outDB, farDB float64, talk, gated bool, delayMs int) { // farDB: the output after the gate
		frames[frame] = fr{inDB, outDB, farDB, talk, gated, delayMs}
	}
	defer func() { gateTrace = nil }()
	r := replay(t, filepath.Join(*replayDir, "echo.apmdump"), Config{EchoCancellation: true})
	starts := reports(t, r.rate, r.clean)
	for _, s := range starts {
		t.Logf("start at %d ms", s)
		for f := s/10 - 12; f <= s/10; f++ {
			x, ok := frames[f]
			if !ok {
				t.Logf("  %d: not gated (no echo expected or not measured)", f*10)
				continue
			}
			t.Logf("  %d: in %.0f out %.0f far %.0f talk %v gated %v delay %d", f*10, x.in, x.out, x.far, x.talk, x.gated, x.d)
		}
	}
}

func TestTraceOnsets(t *testing.T) {
	if *replayDir == "" {
		t.Skip()
	}
	type fr struct {
		in, out, post float64
		talk, gated   bool
		d             int
	}
	frames := map[int64]fr{}
	gateTrace = func(frame int64, inDB, outDB, post float64, talk, gated bool, delayMs int) {
		frames[frame] = fr{inDB, outDB, post, talk, gated, delayMs}
	}
	defer func() { gateTrace = nil }()
	r := replay(t, filepath.Join(*replayDir, "barge.apmdump"), Config{EchoCancellation: true})
	for _, f := range r.onsetFrames {
		o := r.t0.Add(time.Duration(f) * 20 * time.Millisecond).Sub(r.base).Milliseconds()
		t.Logf("onset at %d ms", o)
		for f := o/10 - 2; f <= o/10+14; f++ {
			x, ok := frames[f]
			if !ok {
				t.Logf("  %d: not gated", f*10)
				continue
			}
			t.Logf("  %+d: in %.0f out %.0f post %.0f talk %v gated %v delay %d", f*10-o, x.in, x.out, x.post, x.talk, x.gated, x.d)
		}
	}
}

type setting struct {
	early, wide int
	decay, m    float64
	k           int
	lag         bool
	learned     bool
	lm, q, eo   float64
	confirm     int
	late        int
	raw         bool
}

func sweepSettings(def setting) []setting {
	out := []setting{def}
	add := func(f func(s *setting)) {
		s := def
		f(&s)
		out = append(out, s)
	}
	add(func(s *setting) { s.raw = true })
	add(func(s *setting) { s.confirm = 3 })
	add(func(s *setting) { s.confirm = 3; s.raw = true })
	add(func(s *setting) { s.confirm = 3; s.lag = true; s.early = 3; s.decay = 3; s.raw = true })
	return out
}

func TestSweep(t *testing.T) {
	if *replayDir == "" {
		t.Skip()
	}
	run := func(s setting) string {
		dtEarly, dtWide, dtDecayDB, dtMarginDB, dtBands, dtLag = s.early, s.wide, s.decay, s.m, s.k, s.lag
		dtLearned, dtLearnMarginDB, dtQuantile, dtEchoOnlyDB = s.learned, s.lm, s.q, s.eo
		dtConfirmBands, dtLate, dtPassRaw = s.confirm, s.late, s.raw
		out := fmt.Sprintf("%+v:", s)
		for _, name := range []string{"echo", "barge", "noecho"} {
			paths, _ := filepath.Glob(filepath.Join(*replayDir, name+"*.apmdump"))
			for _, p := range paths {
				r := replay(t, p, Config{EchoCancellation: true, GuardFirstReply: name == "echo"})
				var onsets []int64
				for _, f := range r.onsetFrames {
					onsets = append(onsets, r.t0.Add(time.Duration(f)*20*time.Millisecond).Sub(r.base).Milliseconds())
				}
				var heard []int64
				fs := 0
				for _, st := range reports(t, r.rate, r.clean) {
					u := false
					for _, o := range onsets {
						if st >= o && st < o+1500 {
							u = true
							heard = append(heard, st-o)
							break
						}
					}
					if !u {
						fs++
					}
				}
				out += fmt.Sprintf(" %s: false %d heard %v;", filepath.Base(p), fs, heard)
			}
		}
		return out
	}
	def := setting{5, 2, 0, 6, 3, false, false, 2, 0.95, 0, 6, 12, false}
	for _, s := range sweepSettings(def) {
		t.Log(run(s))
	}
	dtEarly, dtWide, dtDecayDB, dtMarginDB, dtBands, dtLag = def.early, def.wide, def.decay, def.m, def.k, def.lag
	dtLearned, dtLearnMarginDB, dtQuantile, dtEchoOnlyDB = def.learned, def.lm, def.q, def.eo
	dtConfirmBands, dtLate, dtPassRaw = def.confirm, def.late, def.raw
}

func TestTraceOnsetBands(t *testing.T) {
	if *replayDir == "" {
		t.Skip()
	}
	rows := map[int64]string{}
	var cur int64
	dtFrame = func(n int64) { cur = n }
	dtTrace = func(x, bound, floor *bands, nAbs, nRel, active int) {
		s := ""
		for b := range x {
			s += fmt.Sprintf("%4.0f", x[b]-bound[b])
		}
		rows[cur] = s + fmt.Sprintf(" | x0 %.0f b0 %.0f x8 %.0f b8 %.0f", x[0], bound[0], x[8], bound[8])
	}
	defer func() { dtTrace, dtFrame = nil, nil }()
	dtEarly, dtWide, dtDecayDB = 2, 1, 3
	defer func() { dtEarly, dtWide, dtDecayDB = 5, 2, 0 }()
	r := replay(t, filepath.Join(*replayDir, "barge.apmdump"), Config{EchoCancellation: true})
	for _, f := range r.onsetFrames[1:5] {
		o := r.t0.Add(time.Duration(f) * 20 * time.Millisecond).Sub(r.base).Milliseconds()
		t.Logf("onset at %d ms", o)
		for f := o/10 - 4; f <= o/10+10; f++ {
			t.Logf("  %+4d: %s", f*10-o, rows[f])
		}
	}
}

func TestTraceOffline(t *testing.T) {
	if *replayDir == "" {
		t.Skip()
	}
	run := 0
	var cur int64
	dtFrame = func(n int64) {
		if n == 1 {
			run++
		}
		cur = n
	}
	var nabs int
	dtTrace = func(x, bound, floor *bands, nAbs, nRel, active int) { nabs = nAbs }
	gateTrace = func(frame int64, inDB, outDB, post float64, talk, gated bool, delayMs int) {
		if run == 2 && frame*10 >= 14400 && frame*10 <= 14620 {
			t.Logf("%d: in %.0f out %.0f post %.0f talk %v (%d) gated %v delay %d", frame*10, inDB, outDB, post, talk, nabs, gated, delayMs)
		}
	}
	defer func() { dtTrace, dtFrame, gateTrace = nil, nil, nil }()
	_ = cur
	echoCase(t, 16000, false)
}

func TestTraceDelay(t *testing.T) {
	if *replayDir == "" {
		t.Skip()
	}
	for _, name := range []string{"echo", "barge"} {
		var c *Cleaner
		cleanerHook = func(x *Cleaner) { c = x }
		var lines []string
		var last int64
		dtFrame = func(n int64) {
			if c == nil || n-last < 50 {
				return
			}
			last = n
			el := float64(n) / 100 // s, about, since the first far end
			ph := math.Mod(el, 20) / 20
			tri := 1 - math.Abs(2*ph-1)
			truth := 150 + 150*tri
			lines = append(lines, fmt.Sprintf("%5.1fs use %3d est %3d (c %.2f) truth~%3.0f", el, c.delayMs, c.est.lag*10, c.est.confidence, truth))
		}
		replay(t, filepath.Join(*replayDir, name+".apmdump"), Config{EchoCancellation: true})
		cleanerHook, dtFrame = nil, nil
		t.Logf("%s:", name)
		for i := 0; i < len(lines); i += 4 {
			t.Logf("  %s", strings.Join(lines[i:min(i+4, len(lines))], " | "))
		}
	}
}
