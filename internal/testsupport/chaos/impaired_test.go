package chaos

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/impair"
)

// Impairment between the clients and the relay, applied to each direction
// by an internal/testsupport/impair proxy in a process of its own
// (impairproxy, without the race detector: in the test process, the race
// detector's cost per datagram made the proxy overflow its socket
// buffers at 100 sessions, which added loss of its own).
const (
	impairLoss    = 0.05
	impairDup     = 0.01
	impairReorder = 0.01
	impairDelay   = 20 * time.Millisecond // one way; a held-back datagram waits 21 ms more, past the next frame
)

// TestImpairedNetwork runs sessions for minutes through 5% loss, 1%
// duplication and 1% reordering (each direction, on every datagram:
// STUN, DTLS, SCTP, RTP, RTCP) between the clients and the relay, plus
// 20 ms of one-way delay. Invariant: no session is lost (ICE consent,
// DTLS and SCTP retransmissions ride it out; the final data channel ping
// comes back). Figure: the audio loss the clients see against the
// configured loss; an echoed packet crosses the impaired link twice, so
// the expected loss is 1-(1-0.05)² = 9.75%.
func TestImpairedNetwork(t *testing.T) {
	n := *flagSessions
	dur := impairedDuration()
	proxyAddr := freeUDP(t)
	s := startStack(t, stackConfig{advertise: proxyAddr})
	proxy := s.h.start("impairproxy", bins.impairproxy, "-listen", proxyAddr, "-target", s.public,
		"-loss", fmtF(impairLoss), "-dup", fmtF(impairDup), "-reorder", fmtF(impairReorder), "-delay", impairDelay.String())
	d := s.runDriver(t, "-sessions", strconv.Itoa(n), "-duration", dur.String(), "-ramp", "30ms")
	rs := d.wait(t, dur+3*time.Minute)
	proxy.stop() // it prints its counters as it exits
	var ps impair.Stats
	if err := json.Unmarshal([]byte(lastLine(proxy.log.String())), &ps); err != nil {
		t.Errorf("impairproxy's counters: %v in %q", err, proxy.log.String())
	}
	trx := mustScrape(t, s.trxHTTP[0])

	checkSessions(t, rs, n)
	var sent, recv, dups, reord int
	loss := column(rs, func(r sessionReport) float64 {
		sent += r.Sent
		recv += r.Received
		dups += r.Duplicates
		reord += r.Reordered
		if r.Sent == 0 {
			return 1
		}
		return 1 - float64(r.Received)/float64(r.Sent)
	})
	for i := range loss {
		loss[i] *= 100
	}
	expected := 1 - (1-impairLoss)*(1-impairLoss)
	seen := 1 - float64(recv)/float64(sent)
	// 200 000+ packets: the binomial spread is a fraction of a percent; the
	// margin allows for packets the end of a session cuts off.
	if seen < expected*0.8 || seen > expected*1.2 {
		t.Errorf("audio loss %.2f%%, expected %.2f%% from the configured %.0f%% per direction", seen*100, expected*100, impairLoss*100)
	}
	if dups != 0 {
		t.Errorf("%d duplicated packets reached the application (SRTP replay protection should drop them)", dups)
	}
	if ps.Dropped == 0 || ps.Duplicated == 0 || ps.Reordered == 0 {
		t.Errorf("the proxy did not impair: %+v", ps)
	}
	setup := column(rs, func(r sessionReport) float64 { return r.SetupMS })
	gap := column(rs, func(r sessionReport) float64 { return r.MaxGapMS })
	t.Logf("FIGURE impaired network (%v, loss %.0f%%, duplication %.0f%%, reordering %.0f%% each way, +%v one way): %d sessions, %d lost; audio loss seen %.2f%% (expected %.2f%%), per session %s; reordered arrivals %d; duplicates delivered %d",
		dur, impairLoss*100, impairDup*100, impairReorder*100, impairDelay, len(rs), len(rs)-countOK(rs), seen*100, expected*100, distF(loss, "%"), reord, dups)
	t.Logf("FIGURE impaired network: setup (POST to connected) %s; largest audio gap per session %s; proxy %+v; transceiver RTCP loss histogram count %v",
		dist(setup, " ms"), dist(gap, " ms"), ps, trx["switchboard_transceiver_loss_ratio_count"])
	t.Logf("CPU: %s", s.cpu())
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

func fmtF(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func distF(xs []float64, unit string) string {
	return "p50 " + strconv.FormatFloat(pct(xs, 50), 'f', 2, 64) + unit +
		", p99 " + strconv.FormatFloat(pct(xs, 99), 'f', 2, 64) + unit +
		", max " + strconv.FormatFloat(pct(xs, 100), 'f', 2, 64) + unit
}
