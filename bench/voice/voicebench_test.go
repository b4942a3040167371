package voicebench

import (
	"bytes"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestShortRun is the CI version of `switchboard-bench voice`: two cycles
// (four user turns, two of them over the agent's reply) in each mode, at
// ptime 20 and 10, 50 ms RTT. It checks that every figure was measured,
// not how fast: speed is the benchmark's business (docs/benchmarks.md);
// and that Chromium's microphone sends the packet length the answer's
// a=ptime asks for.
func TestShortRun(t *testing.T) {
	if _, err := exec.LookPath("chromium"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed; in CI it must be")
		}
		t.Skip("chromium not installed")
	}
	for _, tool := range []string{"espeak-ng", "sox"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; in CI it must be", tool)
			}
			t.Skipf("%s not installed", tool)
		}
	}
	res, err := Run(t.Context(), Options{RTT: 50 * time.Millisecond, Cycles: 2, Ptimes: []int{20, 10}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	res.Markdown(&b)
	t.Logf("\n%s", b.String())
	for _, m := range res.Modes {
		if len(m.StopAtBackend) < 3 || len(m.Reply) < 3 || len(m.Quiet) < 1 {
			t.Errorf("%s: measured %d stops, %d replies, %d interruptions over %d turns; want at least 3, 3 and 1",
				m.Name, len(m.StopAtBackend), len(m.Reply), len(m.Quiet), m.Turns)
		}
		// The call's length over the packets sent: within a few ms of
		// the ptime (the page polls its stats every 500 ms).
		if len(m.ClientPacketMs) != 1 || math.Abs(m.ClientPacketMs[0]-float64(m.Ptime)) > 3 {
			t.Errorf("%s, ptime %d: the microphone sent a packet every %v ms, want about %d", m.Name, m.Ptime, m.ClientPacketMs, m.Ptime)
		}
	}
}

// TestEndLag runs the offline part of the bench, the detector's speech
// end against the page's on the script, for both packet lengths: every
// utterance is measured, and with 10 ms packets (10 ms frames) the ends
// are no later than with 20 ms ones, median, over the script's first
// four cycles (as they were before the cycles with a pause inside a
// sentence were added after them).
func TestEndLag(t *testing.T) {
	for _, tool := range []string{"espeak-ng", "sox"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; in CI it must be", tool)
			}
			t.Skipf("%s not installed", tool)
		}
	}
	sc, _, err := script()
	if err != nil {
		t.Fatal(err)
	}
	med := map[int]float64{}
	for _, pt := range []int{20, 10} {
		lags, err := endLag(sc, pt)
		if err != nil {
			t.Fatal(err)
		}
		if len(lags) != len(sc.Utterances) {
			t.Fatalf("%d ms packets: %d lags for %d utterances: %v", pt, len(lags), len(sc.Utterances), lags)
		}
		s := slices.Clone(lags[:2*len(firsts)])
		slices.Sort(s)
		med[pt] = (s[(len(s)-1)/2] + s[len(s)/2]) / 2
		t.Logf("%d ms packets: speech end lag per utterance %v ms, median %v", pt, lags, med[pt])
	}
	if med[10] > med[20] {
		t.Errorf("median speech end lag %v ms with 10 ms packets, later than %v with 20 ms", med[10], med[20])
	}
}

// TestStopLatenciesTenMsEnds checks (a) on a simulated call whose
// detector reports on a 10 ms grid (ptime 10) while the backend gets
// 20 ms frames: the client's packets end every 10 ms and reach the edge
// at their end's time, a 20 ms frame reaches the backend with the packet
// that completes it, and every stop reaches it share ms after the packet
// that ends its silence window. (a) must be share for every stop, those
// whose speech end falls in the middle of a frame included.
func TestStopLatenciesTenMsEnds(t *testing.T) {
	const silenceMs, share = 500, 3
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	at := func(ms int64) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tr := &tracer{frames: map[int64]time.Time{}}
	for end := int64(backendFrameMs); end <= 5000; end += backendFrameMs {
		tr.frames[end] = at(end)
	}
	ends := []int64{1000, 1730, 2250, 3020, 4010}
	for _, e := range ends {
		tr.stops = append(tr.stops, stopAt{ms: e + silenceMs, at: at(e + silenceMs + share)})
	}
	got := tr.stopLatencies(silenceMs)
	if len(got) != len(ends) {
		t.Fatalf("(a) measured for %d of %d stops: %v", len(got), len(ends), got)
	}
	for i, v := range got {
		if math.Abs(v-share) > 1e-9 {
			t.Errorf("stop at speech end %d ms: (a) %v ms, want %d", ends[i], v, share)
		}
	}
}

// TestShortRunTurnTaking is the CI version of the turn-taking modes: two
// cycles of the tentative mode (its second cycle's sentence has a pause
// the user goes on after) and one of the resume mode's script (coughs,
// a backchannel and an interruption over replies, an idle timeout), at
// ptime 10, with a parrot that answers 400 ms after the turn event. It
// checks that every figure was measured; how fast is the benchmark's
// business (docs/benchmarks.md).
func TestShortRunTurnTaking(t *testing.T) {
	if _, err := exec.LookPath("chromium"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed; in CI it must be")
		}
		t.Skip("chromium not installed")
	}
	requireSpeechTools(t)
	res, err := Run(t.Context(), Options{RTT: 50 * time.Millisecond, Cycles: 2, Ptimes: []int{10}, Modes: []string{ModeTentative, ModeResume},
		ReplyDelay: 400 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	res.Markdown(&b)
	t.Logf("\n%s", b.String())
	for _, m := range res.Modes {
		tt := m.TurnTaking
		switch m.Name {
		case ModeTentative:
			if len(m.Reply) < 3 || tt.HeldPlayed+tt.HeldDiscarded == 0 && len(m.Reply) == 0 {
				t.Errorf("tentative: %d replies measured; turn-taking %+v", len(m.Reply), tt)
			}
		case ModeResume:
			if tt.Bursts < 3 || tt.BurstReplies < 2 || tt.Interruptions < 1 || len(tt.IdleLateMs) < 1 || len(m.Quiet) < 1 {
				t.Errorf("resume: measured %d bursts over %d replies, %d interruptions, %d idle timeouts, %d real interruptions heard; want at least 3, 2, 1, 1, 1 (%+v)",
					tt.Bursts, tt.BurstReplies, tt.Interruptions, len(tt.IdleLateMs), len(m.Quiet), tt)
			}
		}
	}
}
