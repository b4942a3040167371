package trxbench

import (
	"context"
	"encoding/json"
	"flag"
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

func measureFootprint(t *testing.T, addr string) footprint {
	t.Helper()
	live, err := liveKiB(addr)
	if err != nil {
		t.Fatal(err)
	}
	m, err := scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	return footprint{m.value("go_goroutines", ""), live}
}

// How much the live heap after a load may exceed the baseline: the Go
// runtime keeps every goroutine descriptor it ever made (about 0.5 KiB)
// for reuse, so a load leaves heap in proportion to its peak goroutine
// count, once; a leak grows with the sessions instead, which the second,
// identical load shows.
const (
	heapSlackKiB   = 2048
	gDescriptorKiB = 1
	repeatGrowKiB  = 1024
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
			"-sessions", strconv.Itoa(sessions), "-duration", d.String(), "-ramp", "10ms", "-progress", "0")
		if err != nil {
			t.Fatal(err)
		}
		<-gen.done
		close(stop)
		sampler.Wait()
		var sum callclient.LoadSummary
		out := gen.cmd.Stdout.(*strings.Builder).String()
		if err := json.Unmarshal([]byte(out), &sum); err != nil {
			t.Fatalf("load summary: %v: %q", err, out)
		}
		// What is checked is the cleanup, of sessions that went through and
		// of those that failed alike; on a busy CI machine some fail to
		// set up, but most must have existed for the test to mean much.
		if sum.Connected < sessions/2 {
			t.Fatalf("only %d of %d sessions connected: %+v", sum.Connected, sessions, sum)
		}
		if err := st.waitSessions(ctx, 0, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		return sum, peak
	}

	load(2, time.Second) // warm-up: pools, HTTP connections, the DTLS certificate
	base := measureFootprint(t, st.trxHTTP)
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
		after[round] = f
		t.Logf("load %d: %d sessions connected (failures %v); peak %.0f goroutines; after: %.0f goroutines, %.0f KiB live heap (baseline %.0f, %.0f KiB)",
			round+1, sum.Connected, sum.Failures, peak, f.goroutines, f.liveKiB, base.goroutines, base.liveKiB)
	}
	if grew := after[1].liveKiB - after[0].liveKiB; grew > repeatGrowKiB {
		t.Errorf("the second identical load left %.0f KiB more live heap than the first: a leak per session", grew)
	}
}
