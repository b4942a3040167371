package chaos

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// footprint is a process's goroutines (counted by goroutineCount, with
// the profile they were counted in) and heap after two GCs: live objects
// (go_gc_heap_live_bytes: what the last GC marked, so not the garbage
// that /debug/pprof/heap?gc=1 makes writing its profile after that GC,
// which go_memstats_heap_alloc_bytes counted: 1 to 2 MB, varying with the
// stacks sampled) and spans in use (go_memstats_heap_inuse_bytes, which
// also counts the free room in partly used spans).
type footprint struct {
	goroutines, liveMB, inuseMB float64
	profile                     string
	// clean is how many of the live heap readings it keeps the least of
	// were clean (see heapReadings); 0: the least of those that were not.
	clean int
}

func (f footprint) String() string {
	return fmt.Sprintf("%.0f goroutines, %.1f MB live heap (%.1f MB in use)", f.goroutines, f.liveMB, f.inuseMB)
}

func measure(t *testing.T, addr string) footprint {
	t.Helper()
	profile := goroutineDump(addr)
	n, err := goroutineCount(profile)
	if err != nil {
		t.Fatalf("goroutines of %s: %v", addr, err)
	}
	f := footprint{goroutines: float64(n), profile: profile, liveMB: math.Inf(1)}
	dirtyMB := math.Inf(1) // the least of the readings that were not clean
	for tries := 0; f.clean < heapReadings && tries < maxHeapTries; tries++ {
		before := mustScrape(t, addr)[gcCount]
		gc(t, addr)
		m := mustScrape(t, addr)
		live, ok := m["go_gc_heap_live_bytes"]
		if !ok {
			t.Fatalf("%s/metrics has no go_gc_heap_live_bytes", addr)
		}
		live /= 1 << 20
		if m[gcCount] != before+2 || mustScrape(t, addr)[gcCount] != m[gcCount] {
			dirtyMB = min(dirtyMB, live)
			continue
		}
		f.clean++
		if live < f.liveMB {
			f.liveMB, f.inuseMB = live, m["go_memstats_heap_inuse_bytes"]/(1<<20)
		}
	}
	if f.clean == 0 {
		f.liveMB = dirtyMB
	}
	return f
}

// gcCount is the series that counts a process's completed GC cycles
// (runtime.MemStats.NumGC).
const gcCount = "go_gc_duration_seconds_count"

// maxHeapTries bounds the readings measure takes to find heapReadings
// clean ones; with none clean, it keeps the least of them all.
const maxHeapTries = 10

// heapReadings is how many clean readings of the live heap measure takes;
// it keeps the least. A reading is clean when the process ran exactly
// the two GCs gc forced between the scrapes before and after it: writing
// the heap profile that forces a GC allocates enough (more after a load,
// the profile having more stacks) to start a GC of the process's own,
// which then finds runtime/pprof's profile builder live, some 1.2 to 1.7
// MB (a heap profile at 512-byte sampling put the difference there, not
// in the transceiver's objects). Such readings, up to five in six right
// after a load, made the repeated-load check fail about one run in five.
// go_gc_heap_live_bytes is what the last GC marked.
const heapReadings = 3

// floorReadings is how many footprints settledFloor takes, floorInterval
// apart.
const (
	floorReadings = 4
	floorInterval = time.Second
)

// settledFloor measures the process at addr floorReadings times,
// floorInterval apart, and returns the footprint with the least live heap
// (and the readings' live heaps in MB, in order). Each reading must have
// a clean one (see heapReadings). A process back to its goroutine
// baseline can still hold memory on its way out (objects with a finalizer
// or cleanup are kept, with all they reference, until the finalizer
// goroutine has run them); a leak stays in every reading.
func settledFloor(t *testing.T, addr string) (footprint, []float64) {
	t.Helper()
	var low footprint
	var trace []float64
	for i := range floorReadings {
		if i > 0 {
			time.Sleep(floorInterval)
		}
		f := measure(t, addr)
		if f.clean == 0 {
			t.Fatalf("%s: no clean live heap reading in %d (a GC of the process's own each time between measure's forced GCs and the scrape)", addr, maxHeapTries)
		}
		trace = append(trace, f.liveMB)
		if i == 0 || f.liveMB < low.liveMB {
			low = f
		}
	}
	return low, trace
}

// goroutineCount counts the goroutines of a goroutine profile
// (/debug/pprof/goroutine?debug=1) that the process keeps: all but
//   - the profile request's own handler and its connection's background
//     reader;
//   - net/http connections whose response is written and which are
//     closing (finishRequest, closeWriteAndWait, or serve's deferred
//     close): measure's earlier requests, which ask for no keep-alive;
//   - goroutines with no frame yet or any more (being created or exiting);
//   - the runtime's finalizer and cleanup goroutines, which a profile
//     lists only while they run user code, as right after measure's GCs.
//
// A connection kept alive between requests (its goroutine waiting in
// net/http.(*conn).serve for the next one) is counted, and so is an
// in-flight request's handler and background reader: a client that
// leaks keep-alive connections, or a handler that does not return, shows
// as goroutines above the baseline.
//
// The count is the same for the same process state, unlike go_goroutines:
// that is runtime.NumGoroutine taken during the scrape itself, while
// prometheus.Registry.Gather runs the collectors on a number of goroutines
// that varies with scheduling (12 to 17 for an idle relay), which made a
// baseline taken at a low moment look like a leak.
func goroutineCount(profile string) (int, error) {
	head, rest, _ := strings.Cut(profile, "\n")
	if !strings.HasPrefix(head, "goroutine profile: total ") {
		return 0, fmt.Errorf("not a goroutine profile: %.80q", profile)
	}
	n, ownHandler, ownReader := 0, false, false
	for rec := range strings.SplitSeq(rest, "\n\n") {
		m := profileRecord.FindStringSubmatch(rec)
		if m == nil {
			continue
		}
		c, _ := strconv.Atoi(m[1])
		inHandler := strings.Contains(rec, "net/http.serverHandler.ServeHTTP")
		switch {
		case !strings.Contains(rec, "\n#"): // no frame
		case strings.Contains(rec, "runtime.runFinalizers"), strings.Contains(rec, "runtime.runCleanups"):
		case strings.Contains(rec, "net/http.(*conn).serve") && !inHandler && closingConn(rec):
		case !ownReader && strings.Contains(rec, "net/http.(*connReader).backgroundRead"):
			ownReader = true
			n += c - 1
		case !ownHandler && strings.Contains(rec, "net/http/pprof.handler.ServeHTTP"):
			ownHandler = true
			n += c - 1
		default:
			n += c
		}
	}
	return n, nil
}

// closingConn reports whether a net/http connection goroutine's stack
// is past its last response: finishing it, or closing the connection.
func closingConn(rec string) bool {
	return strings.Contains(rec, "net/http.(*response).finishRequest") ||
		strings.Contains(rec, "net/http.(*conn).closeWriteAndWait") ||
		strings.Contains(rec, "net/http.(*conn).serve.func1")
}

// profileRecord matches a goroutine profile record's count ("3 @ 0x…").
var profileRecord = regexp.MustCompile(`(?m)^(\d+) @ `)

// How much the live heap after a load may exceed the baseline.
// Goroutines must come back exactly (goroutineCount; measure's requests
// use no keep-alive, so an idle connection counted is someone else's), but the
// Go runtime never frees a goroutine's descriptor (runtime.g, from
// runtime.malg, about 0.5 KB): it keeps every one for reuse, so the live
// heap after a load grows with the load's peak goroutine count, once. A
// leak grows with the number of sessions instead: TestLeaks runs the same
// load twice and requires the second not to add to the first. Heap in use
// (spans) is reported but not asserted: after a load it keeps partly used
// spans that the next load fills.
const (
	heapSlackMB    = 2
	gDescriptorKB  = 1   // per goroutine of the peak above the baseline, with room
	repeatGrowthKB = 256 // the second identical load may add at most this to the floor (settledFloor)
)

// allowance is the heap a process may keep after a load that peaked at
// peakGoroutines.
func allowance(base footprint, peakGoroutines float64) float64 {
	return heapSlackMB + max(0, peakGoroutines-base.goroutines)*gDescriptorKB/1024
}

// settle waits until the process at addr is back to base (goroutines at
// most base's, live heap within slackMB), and returns the last footprint
// and how long it took.
func settle(t *testing.T, addr string, base footprint, slackMB float64, timeout time.Duration) (footprint, time.Duration, bool) {
	t.Helper()
	var f footprint
	took, ok := waitFor(timeout, func() bool {
		f = measure(t, addr)
		return f.goroutines <= base.goroutines && f.liveMB <= base.liveMB+slackMB
	})
	if !ok {
		t.Logf("goroutines of %s at the baseline:\n%s\nand now:\n%s", addr, base.profile, f.profile)
	}
	return f, took, ok
}

// warmUp runs two short sessions so that one-time allocations (TLS
// certificates, pools, HTTP connections) are in the baseline, and waits
// for them to end.
func warmUp(t *testing.T, s *stack) {
	t.Helper()
	d := s.runDriver(t, "-sessions", "2", "-duration", "1s", "-ramp", "10ms")
	checkSessions(t, mustWait(t, d), 2)
	waitIdle(t, s, 30*time.Second)
}

func mustWait(t *testing.T, d *driver) []sessionReport {
	t.Helper()
	rs := d.wait(t, 2*time.Minute)
	return rs
}

// waitIdle waits until no transceiver has a session and the relay has no
// flow; it returns how long that took.
func waitIdle(t *testing.T, s *stack, timeout time.Duration) (sessionsGone, flowsGone time.Duration) {
	t.Helper()
	start := time.Now()
	if _, ok := waitFor(timeout, func() bool {
		for _, a := range s.trxHTTP {
			if m, err := scrape(a); err != nil || m["switchboard_transceiver_sessions"] != 0 {
				return false
			}
		}
		return true
	}); !ok {
		t.Fatalf("transceiver sessions still live %v after the clients left", timeout)
	}
	sessionsGone = time.Since(start)
	if _, ok := waitFor(timeout-sessionsGone, func() bool {
		m, err := scrape(s.relayOps)
		return err == nil && m.sum("switchboard_relay_flows") == 0
	}); !ok {
		t.Fatalf("relay flows still there %v after the clients left: %v", timeout, mustScrape(t, s.relayOps).sum("switchboard_relay_flows"))
	}
	return sessionsGone, time.Since(start)
}

// TestLeaks runs a full load of sessions to their end, twice, and checks
// that everything they held is given back (docs/design.md §5.9): the relay's
// flows expire within its idle timeout, the transceiver's and the relay's
// goroutines return to their baseline from before the load, their live
// heap to the baseline plus the goroutine descriptors the runtime keeps
// (see allowance), and the second load leaves no more than the first.
func TestLeaks(t *testing.T) {
	const idle = 3 * time.Second
	const pending = 3 * time.Second
	n := *flagSessions
	// GOGC 400 (not the default 100) for every process of the stack, so
	// that writing the heap profile of measure's forced GCs does not start
	// a GC of the process's own (see heapReadings): what a GC finds live
	// does not depend on GOGC, and with it readings are clean.
	t.Setenv("GOGC", "400")
	s := startStack(t, stackConfig{idleTimeout: idle, relayArgs: []string{"-pending-timeout", pending.String()}})
	warmUp(t, s)
	// The baseline is a floor too: the warm-up's sessions have left the
	// table, but their teardown may not be over.
	trxBase, baseTrace := settledFloor(t, s.trxHTTP[0])
	relayBase := measure(t, s.relayOps)
	t.Logf("transceiver baseline readings: %.2f MB live heap", baseTrace)

	var trxAfter [2]footprint
	for round := range 2 {
		peak := sample(s.trxHTTP[0], nil)
		d := s.runDriver(t, "-sessions", strconv.Itoa(n), "-duration", "6s", "-ramp", "30ms")
		rs := mustWait(t, d)
		trace := peak.series(func(m metrics) float64 { return m["go_goroutines"] })
		heapTrace := peak.series(func(m metrics) float64 { return m["go_memstats_heap_alloc_bytes"] / (1 << 20) })
		peak.at("")
		checkSessions(t, rs, n)
		peakG := slices.Max(append(trace, 0))

		sessionsGone, flowsGone := waitIdle(t, s, idle+pending+30*time.Second)
		if bound := max(idle, pending) + 2*time.Second; flowsGone > bound {
			t.Errorf("load %d: relay flows took %v to fall to 0 after the last session ended; bound %v (idle/pending timeout + sweep)", round+1, flowsGone, bound)
		}
		slack := allowance(trxBase, peakG)
		after, took, ok := settle(t, s.trxHTTP[0], trxBase, slack, 30*time.Second)
		if !ok {
			t.Errorf("load %d: transceiver not back to baseline 30 s after the sessions ended: %v, baseline %v (+%.1f MB for %.0f goroutines at the peak)", round+1, after, trxBase, slack, peakG)
		}
		relayAfter, _, relayOK := settle(t, s.relayOps, relayBase, heapSlackMB, 30*time.Second)
		if !relayOK {
			t.Errorf("load %d: relay not back to baseline 30 s after the sessions ended: %v, baseline %v", round+1, relayAfter, relayBase)
		}
		// The repeated-load check compares floors, not the first
		// readings back under the allowance.
		floor, trace := settledFloor(t, s.trxHTTP[0])
		trxAfter[round] = floor
		t.Logf("load %d: transceiver readings after it: %.2f MB live heap", round+1, trace)
		t.Logf("FIGURE leaks, load %d: %d sessions of 6 s; transceiver sessions at 0 %v after the last client left, relay flows at 0 %v after (relay -idle-timeout %v, -pending-timeout %v)",
			round+1, len(rs), sessionsGone.Round(100*time.Millisecond), flowsGone.Round(100*time.Millisecond), idle, pending)
		t.Logf("FIGURE leaks, load %d: transceiver baseline %v; peak %.0f goroutines, %.1f MB live heap; after %v (settled in %v); relay baseline %v, after %v",
			round+1, trxBase, peakG, slices.Max(append(heapTrace, 0)), after, took.Round(100*time.Millisecond), relayBase, relayAfter)
	}
	grew := (trxAfter[1].liveMB - trxAfter[0].liveMB) * 1024
	t.Logf("FIGURE leaks: the second load left %.0f KB more live heap in the transceiver than the first (floors %.2f and %.2f MB; bound %d KB)",
		grew, trxAfter[0].liveMB, trxAfter[1].liveMB, repeatGrowthKB)
	if grew > repeatGrowthKB {
		t.Errorf("the second identical load of %d sessions left %.0f KB more live heap in the transceiver than the first (%.1f KB a session; bound %d KB): a leak per session",
			n, grew, grew/float64(n), repeatGrowthKB)
	}
}

// vanishRamp is the delay between two clients of TestRestartLoop: with
// ICE connecting in tens of milliseconds and a vanish within 300 ms, a few
// clients are connecting at any time, as in a reconnect storm.
const vanishRamp = 50 * time.Millisecond

// TestRestartLoop connects clients in a loop (`switchboard load -vanish`),
// each opening a data channel and vanishing (its UDP sockets closed: no DELETE, no DTLS close_notify,
// no SCTP ABORT) a random 0–300 ms after ICE connects, mid-handshake or
// just after. The transceiver must end every session by itself within
// ICE's consent bound (ICE-lite server: disconnected after 5 s without a
// check, failed 25 s later; or its setup timeout, 30 s), with nothing left
// behind: no session, no goroutine, no heap growth, no relay flow.
func TestRestartLoop(t *testing.T) {
	if !*flagFull {
		t.Parallel() // mostly waiting for consent to expire
	}
	rounds := restartRounds()
	const idle = 5 * time.Second
	s := startStack(t, stackConfig{idleTimeout: idle})
	warmUp(t, s)
	trxBase, relayBase := measure(t, s.trxHTTP[0]), measure(t, s.relayOps)

	peak := sample(s.trxHTTP[0], nil)
	start := time.Now()
	d := s.runDriver(t, "-sessions", strconv.Itoa(rounds), "-ramp", vanishRamp.String(), "-vanish", "300ms")
	vs := d.wait(t, time.Duration(rounds)*time.Second+2*time.Minute)
	loopTook := time.Since(start)
	// The consent timeout (30 s without a packet, looked at once a second)
	// or the setup timeout (30 s), plus the teardown (the backend's
	// session.end, up to 2 s; closing the peer connection), plus slack for
	// a loaded machine. Observed: 31.0 s (36.4 s before the transceiver set
	// its own consent timeout).
	const bound = 45 * time.Second
	waitIdle(t, s, bound+idle+10*time.Second)
	liveTrace := peak.series(func(m metrics) float64 { return m["switchboard_transceiver_sessions"] })

	if len(vs) != rounds {
		t.Errorf("%d rounds reported, want %d", len(vs), rounds)
	}
	// The sessions gauge falls when a session leaves the table; its
	// "session ended" line follows the teardown (the backend's
	// session.end, closing the peer connection): wait for every line.
	ends := map[string]map[string]any{}
	waitFor(10*time.Second, func() bool {
		for _, m := range s.trx[0].jsonLines("session ended") {
			id, _ := m["session"].(string)
			ends[id] = m
		}
		for _, v := range vs {
			if v.Failure == "" && v.VanishedNS != 0 && ends[sessionID(v.Session)] == nil {
				return false
			}
		}
		return true
	})
	var closeAfter []float64
	reasons := map[string]int{}
	var dtlsUp, dcOpen, failed int
	for _, v := range vs {
		if v.Failure != "" || v.VanishedNS == 0 {
			failed++
			if failed <= 5 {
				t.Errorf("round %d: %s: %s", v.I, v.Failure, v.Error)
			}
			continue
		}
		if v.ConnectedNS != 0 && v.ConnectedNS <= v.VanishedNS {
			dtlsUp++
		}
		if v.DCOpen {
			dcOpen++
		}
		m, ok := ends[sessionID(v.Session)]
		if !ok {
			t.Errorf("round %d: session %s never ended", v.I, v.Session)
			continue
		}
		reason, _ := m["reason"].(string)
		reasons[reason]++
		after := float64(logTime(m).UnixNano()-v.VanishedNS) / 1e6
		closeAfter = append(closeAfter, after)
		if after > float64(bound.Milliseconds()) {
			t.Errorf("round %d: session ended %.0f ms after the client vanished, beyond %v", v.I, after, bound)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d rounds did not connect", failed, rounds)
	}
	goroutineTrace := peak.series(func(m metrics) float64 { return m["go_goroutines"] })
	peak.at("") // no scrape of its own during the measurements
	peakG := slices.Max(append(goroutineTrace, 0))
	slack := allowance(trxBase, peakG)
	trxAfter, _, trxOK := settle(t, s.trxHTTP[0], trxBase, slack, 30*time.Second)
	relayAfter, _, relayOK := settle(t, s.relayOps, relayBase, heapSlackMB, 30*time.Second)
	if !trxOK {
		t.Errorf("transceiver not back to baseline: %v, baseline %v (+%.1f MB for %.0f goroutines at the peak)", trxAfter, trxBase, slack, peakG)
	}
	if !relayOK {
		t.Errorf("relay not back to baseline: %v, baseline %v", relayAfter, relayBase)
	}
	t.Logf("FIGURE restart loop: %d rounds in %v (started %v apart); at the vanish DTLS was up in %d, the data channel open in %d; transceiver ended each session %s after its client vanished, reasons %v; peak live sessions %.0f",
		len(vs), loopTook.Round(time.Second), vanishRamp, dtlsUp, dcOpen, dist(closeAfter, " ms"), reasons, slices.Max(append(liveTrace, 0)))
	t.Logf("FIGURE restart loop: transceiver baseline %v, peak %.0f goroutines, after %v; relay baseline %v, after %v", trxBase, peakG, trxAfter, relayBase, relayAfter)
}

// TestGoroutineCount: goroutineCount leaves out the profile request's own
// handler and background reader, net/http connections past their last
// response, goroutines without frames and the runtime's finalizer
// goroutine, and counts the rest: a handler that hangs, another
// request's background reader and an idle keep-alive connection
// included.
func TestGoroutineCount(t *testing.T) {
	const profile = `goroutine profile: total 18
2 @ 0x1 0x2
#	0x1	github.com/switchboard-rtc/switchboard/internal/relay.(*Relay).forwardBatches+0x7a	loops.go:230

1 @ 0x3
#	0x3	runtime/pprof.writeGoroutine+0x44	pprof.go:784
#	0x4	net/http/pprof.handler.ServeHTTP+0x529	pprof.go:273
#	0x5	net/http.serverHandler.ServeHTTP+0x8d	server.go:3311
#	0x6	net/http.(*conn).serve+0x68f	server.go:2067

2 @ 0x7
#	0x7	net/http.(*connReader).backgroundRead+0x32	server.go:702

1 @ 0x10
#	0x10	bufio.(*Reader).Peek+0x1	bufio.go:152
#	0x11	net/http.(*conn).serve+0x1	server.go:2105

1 @ 0x12
#	0x12	time.Sleep+0x1	time.go:300
#	0x13	net/http.(*conn).closeWriteAndWait+0x1	server.go:1786
#	0x14	net/http.(*conn).serve+0x2	server.go:2078

1 @ 0x15
#	0x15	net/http.(*conn).close+0x1	server.go:1750
#	0x16	net/http.(*conn).serve.func1+0x1	server.go:1909
#	0x17	net/http.(*conn).serve+0x3	server.go:2127

1 @ 0x8
#	0x8	bufio.(*Writer).Flush+0x51	bufio.go:642
#	0x9	net/http.(*response).finishRequest+0x75	server.go:1664
#	0xa	net/http.(*conn).serve+0x6d4	server.go:2074

1 @ 0xb
#	0xb	github.com/switchboard-rtc/switchboard/internal/transceiver.(*Server).offer+0x10	server.go:1
#	0x5	net/http.serverHandler.ServeHTTP+0x8d	server.go:3311
#	0xc	net/http.(*conn).serve+0x68f	server.go:2067

1 @ 0xd

1 @ 0xe
#	0xe	runtime.runFinalizers+0x1	mfinal.go:200

3 @ 0xf
#	0xf	main.serveListener+0x264	commands.go:91
`
	// 2 loops, the hanging offer handler and its background reader, an
	// idle keep-alive connection, 3 listeners.
	if n, err := goroutineCount(profile); err != nil || n != 8 {
		t.Errorf("goroutineCount = %d, %v; want 8", n, err)
	}
	if _, err := goroutineCount("404 page not found\n"); err == nil {
		t.Error("goroutineCount of a non-profile: no error")
	}
}
