package trxbench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
)

var flagLeakSessions = flag.Int("trxbench.leak-sessions", 200, "sessions of each load in TestSessionsLeaveNothingBehind")

// footprint is the transceiver's goroutines and live heap after a GC.
type footprint struct{ goroutines, liveKiB float64 }

// parseLoadOutput reads `switchboard load -sessions-json` output: one
// SessionResult per line as each session ended, then the summary.
func parseLoadOutput(out string) (callclient.LoadSummary, []callclient.SessionResult, error) {
	dec := json.NewDecoder(strings.NewReader(out))
	var raw []json.RawMessage
	for dec.More() {
		var m json.RawMessage
		if err := dec.Decode(&m); err != nil {
			return callclient.LoadSummary{}, nil, fmt.Errorf("load output: %w: %q", err, out)
		}
		raw = append(raw, m)
	}
	if len(raw) == 0 {
		return callclient.LoadSummary{}, nil, fmt.Errorf("load output: no summary: %q", out)
	}
	var sum callclient.LoadSummary
	if err := json.Unmarshal(raw[len(raw)-1], &sum); err != nil {
		return sum, nil, fmt.Errorf("load summary: %w: %q", err, raw[len(raw)-1])
	}
	results := make([]callclient.SessionResult, len(raw)-1)
	for i, m := range raw[:len(raw)-1] {
		if err := json.Unmarshal(m, &results[i]); err != nil {
			return sum, nil, fmt.Errorf("load session result: %w: %q", err, m)
		}
	}
	return sum, results, nil
}

// setupErrors lists the sessions that did not connect, with their reason
// and error, one a line.
func setupErrors(results []callclient.SessionResult) string {
	var b strings.Builder
	for _, r := range results {
		if r.ConnectedNS == 0 {
			fmt.Fprintf(&b, "  session %d: %s: %s\n", r.I, r.Failure, r.Error)
		}
	}
	return b.String()
}

// gcCount is the series that counts a process's completed GC cycles
// (runtime.MemStats.NumGC).
const gcCount = "go_gc_duration_seconds_count"

// measureFootprint forces two GCs, so that sync.Pool's victim cache (kept
// through one) is gone too, and reads goroutines and the live heap
// (go_gc_heap_live_bytes: what the last GC marked). It keeps a reading
// only if the process ran exactly those two GCs between the scrapes
// before and after it: writing the heap profile of a forced GC (more
// after a load, with more stacks in it) can start a GC of the process's
// own, which then finds runtime/pprof's profile builder live, 1 to 2 MiB
// more. TestSessionsLeaveNothingBehind runs the stack with GOGC 400, so
// that such readings are rare.
func measureFootprint(t *testing.T, addr string) footprint {
	t.Helper()
	mustScrape := func() metrics {
		t.Helper()
		m, err := scrape(addr)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	const tries = 10
	for range tries {
		before := mustScrape().value(gcCount, "")
		for range 2 {
			resp, err := httpc.Get("http://" + addr + "/debug/pprof/heap?gc=1")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		m := mustScrape()
		if m.value(gcCount, "") != before+2 || mustScrape().value(gcCount, "") != m.value(gcCount, "") {
			continue
		}
		return footprint{m.value("go_goroutines", ""), m.value("go_gc_heap_live_bytes", "") / 1024}
	}
	t.Fatalf("%s: no clean live heap reading in %d (a GC of the process's own each time between the forced ones and the scrape)", addr, tries)
	return footprint{}
}

// floorFootprint measures the transceiver four times, a second apart,
// and returns the reading with the least live heap: memory on its way out
// (objects kept, with what they reference, until the finalizer goroutine
// has run their finalizers or cleanups) is gone from it, while a leak
// stays in every reading.
func floorFootprint(t *testing.T, addr string) footprint {
	t.Helper()
	var low footprint
	for i := range 4 {
		if i > 0 {
			time.Sleep(time.Second)
		}
		if f := measureFootprint(t, addr); i == 0 || f.liveKiB < low.liveKiB {
			low = f
		}
	}
	return low
}

// How much the live heap after a load may exceed the baseline: the Go
// runtime keeps every goroutine descriptor it ever made (about 0.5 KiB)
// for reuse, so a load leaves heap in proportion to its peak goroutine
// count, once; a leak grows with the sessions instead, which the second,
// identical load shows.
const (
	heapSlackKiB   = 2048
	gDescriptorKiB = 1
	repeatGrowKiB  = 256 // between floors (floorFootprint): 1.3 KiB a session at 200
)

// TestSessionsLeaveNothingBehind runs -trxbench.leak-sessions (200)
// real sessions through agent, relay and transceiver processes to their
// end, twice, and checks that the transceiver gives everything back:
// goroutines to the count before the load, live heap to the baseline plus
// the goroutine descriptors the runtime keeps, and the second load adds
// nothing to the first.
func TestSessionsLeaveNothingBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("runs hundreds of real sessions")
	}
	n := *flagLeakSessions
	bin := filepath.Join(t.TempDir(), "switchboard")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/switchboard-rtc/switchboard/cmd/switchboard").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx := context.Background()
	// GOGC 400 for every process of the stack: see measureFootprint. What
	// a GC finds live does not depend on it.
	t.Setenv("GOGC", "400")
	st, err := startStack(ctx, Options{Bin: bin, TrxCPU: -1, GenCPU: -1}, bridge.FormatOpus)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()

	load := func(sessions int, d time.Duration) (callclient.LoadSummary, float64) {
		t.Helper()
		var peak float64
		stop := make(chan struct{})
		var sampler sync.WaitGroup
		sampler.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(250 * time.Millisecond):
				}
				if m, err := scrape(st.trxHTTP); err == nil {
					peak = max(peak, m.value("go_goroutines", ""))
				}
			}
		})
		gen, err := st.start("load", -1, "load", "http://"+st.trxHTTP+"/v1/calls",
			"-sessions", strconv.Itoa(sessions), "-duration", d.String(), "-ramp", "10ms", "-progress", "0", "-sessions-json")
		if err != nil {
			t.Fatal(err)
		}
		<-gen.done
		close(stop)
		sampler.Wait()
		sum, results, err := parseLoadOutput(gen.cmd.Stdout.(*strings.Builder).String())
		if err != nil {
			t.Fatal(err)
		}
		// The target is 0 setup failures (issue 13), and every session
		// must have existed for its cleanup to be checked.
		if sum.Connected != sessions {
			t.Fatalf("%d of %d sessions did not connect (failures %v):\n%s", sessions-sum.Connected, sessions, sum.Failures, setupErrors(results))
		}
		if err := st.waitSessions(ctx, 0, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		return sum, peak
	}

	load(2, time.Second) // warm-up: pools, HTTP connections, the DTLS certificate
	// Sessions leave the table before their teardown ends (it runs on a
	// goroutine of its own): the baseline is taken once the goroutine
	// count holds still.
	base := measureFootprint(t, st.trxHTTP)
	for range 20 {
		time.Sleep(500 * time.Millisecond)
		f := measureFootprint(t, st.trxHTTP)
		if f.goroutines == base.goroutines {
			break
		}
		base = f
	}
	if f := floorFootprint(t, st.trxHTTP); f.liveKiB < base.liveKiB {
		base.liveKiB = f.liveKiB
	}
	var after [2]footprint
	for round := range 2 {
		sum, peak := load(n, 5*time.Second)
		slack := heapSlackKiB + max(0, peak-base.goroutines)*gDescriptorKiB
		var f footprint
		deadline := time.Now().Add(30 * time.Second)
		for {
			f = measureFootprint(t, st.trxHTTP)
			if f.goroutines <= base.goroutines && f.liveKiB <= base.liveKiB+slack {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("load %d: transceiver not back to baseline 30 s after %d sessions ended: %.0f goroutines, %.0f KiB live heap; baseline %.0f goroutines, %.0f KiB (+%.0f KiB allowed for %.0f goroutines at the peak)",
					round+1, sum.Connected, f.goroutines, f.liveKiB, base.goroutines, base.liveKiB, slack, peak)
			}
			time.Sleep(500 * time.Millisecond)
		}
		after[round] = floorFootprint(t, st.trxHTTP)
		t.Logf("load %d: %d sessions connected (failures %v); peak %.0f goroutines; after: %.0f goroutines, %.0f KiB live heap at first, floor %.0f KiB (baseline %.0f, %.0f KiB)",
			round+1, sum.Connected, sum.Failures, peak, f.goroutines, f.liveKiB, after[round].liveKiB, base.goroutines, base.liveKiB)
	}
	// Floors, not the first readings back under the allowance: those
	// were 1–4 MiB apart in our runs (readings with measure's own profile
	// builder live; memory on its way out).
	grew := after[1].liveKiB - after[0].liveKiB
	t.Logf("the second load left %.0f KiB more live heap than the first (floors %.0f and %.0f KiB; bound %d KiB)", grew, after[0].liveKiB, after[1].liveKiB, repeatGrowKiB)
	if grew > repeatGrowKiB {
		t.Fatalf("the second identical load of %d sessions left %.0f KiB more live heap than the first (%.1f KiB a session; bound %d KiB): a leak per session",
			n, grew, grew/float64(n), repeatGrowKiB)
	}
}
