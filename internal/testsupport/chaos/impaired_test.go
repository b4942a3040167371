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
// 20 ms of one-way delay. Invariants: no session is lost (ICE consent,
// DTLS and SCTP retransmissions ride it out; the final data channel ping
// comes back); no duplicate reaches the application; and nothing is lost
// silently: the audio the clients miss is what the proxy dropped (an
// echoed packet crosses it twice, 1-(1-0.05)² = 9.75% at the configured
// rate; the test uses the rate the proxy actually drew), plus what was
// counted where it was lost, by the kernel at one of the UDP sockets
// audio crosses (a receive buffer overflow, watched per socket in
// /proc/net/udp) or by a product drop counter of a reason audio can
// hit, give or take the binomial noise. The relay's, the transceiver's
// and the proxy's own counts of their kernel drops must match the
// kernel's. Figure: the loss and where it happened.
func TestImpairedNetwork(t *testing.T) {
	n := *flagSessions
	dur := impairedDuration()
	s := startStack(t, stackConfig{proxyArgs: []string{
		"-loss", fmtF(impairLoss), "-dup", fmtF(impairDup), "-reorder", fmtF(impairReorder), "-delay", impairDelay.String()}})
	proxy := s.proxy
	watch := watchDrops(s.h)
	backlog := softnetDrops()
	d := s.runDriver(t, "-sessions", strconv.Itoa(n), "-duration", dur.String(), "-ramp", "30ms")
	rs := d.wait(t, dur+3*time.Minute)
	// The sessions are over: no more traffic, the counts hold still.
	kernel := watch.byProc()
	backlog = softnetDrops() - backlog
	trx := mustScrape(t, s.trxHTTP[0])
	rly := mustScrape(t, s.relayOps)
	proxy.stop() // it prints its counters as it exits
	var ps impair.Stats
	if err := json.Unmarshal([]byte(lastLine(proxy.log.String())), &ps); err != nil {
		t.Errorf("impairproxy's counters: %v in %q", err, proxy.log.String())
	}

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
	configured := 1 - (1-impairLoss)*(1-impairLoss)
	seen := 1 - float64(recv)/float64(sent)
	acct := accountLoss(sent, recv, ps, kernel, trx, rly)
	// The proxy does what it is told: 400 000+ datagrams in 30 s, so its
	// binomial spread is a small fraction of this band.
	if p := acct.proxyRate; p < impairLoss*0.9 || p > impairLoss*1.1 {
		t.Errorf("the proxy dropped %.2f%% of the datagrams it saw, configured %.0f%%: %+v", p*100, impairLoss*100, ps)
	}
	// Every audio packet lost is lost at the proxy, or counted where it
	// was lost: by the kernel at one of the sockets audio crosses, or by
	// a product drop counter of a reason audio can hit (udpdrops_test.go,
	// lossCounters). What is left over must be noise: the binomial
	// spread of the proxy's coin flips (4σ) and 0.1% for packets whose
	// count is missed by a hair (a client socket that dropped in its last
	// 100 ms, between two samples). Kernel drops at those sockets also
	// count datagrams that were not audio (STUN, RTCP, SCTP, duplicates),
	// so the sum may exceed the loss; the proxy alone may not.
	if acct.unexplained > acct.margin {
		t.Errorf("audio loss %.2f%% (%d of %d packets), of which %d (%.2f%%) unexplained, more than the %.0f allowed: %s; machine-wide input backlog drops during the run (anyone's): %d",
			seen*100, sent-recv, sent, int(acct.unexplained), 100*acct.unexplained/float64(sent), acct.margin, acct, backlog)
	}
	if lost := float64(sent - recv); lost < acct.atProxy-acct.sigma*4 {
		t.Errorf("audio loss %.2f%% (%d packets), less than the proxy alone explains (%.0f): %s", seen*100, sent-recv, acct.atProxy, acct)
	}
	// The product's own counters agree with the kernel's.
	if got, want := trx.sum("switchboard_transceiver_socket_dropped_total"), kernel["transceiver 1"]; uint64(got) != want {
		t.Errorf("switchboard_transceiver_socket_dropped_total %v, the kernel's count for the socket %d", got, want)
	}
	if got, want := rly.sum("switchboard_relay_socket_dropped_total"), kernel["relay"]; uint64(got) != want {
		t.Errorf("switchboard_relay_socket_dropped_total %v, the kernel's count for the relay's sockets %d", got, want)
	}
	if got, want := ps.SocketDropped, kernel["impairproxy"]; got != want {
		t.Errorf("impairproxy's SocketDropped %d, the kernel's count for its sockets %d", got, want)
	}
	if dups != 0 {
		t.Errorf("%d duplicated packets reached the application (SRTP replay protection should drop them)", dups)
	}
	if ps.Dropped == 0 || ps.Duplicated == 0 || ps.Reordered == 0 {
		t.Errorf("the proxy did not impair: %+v", ps)
	}
	setup := column(rs, func(r sessionReport) float64 { return r.SetupMS })
	gap := column(rs, func(r sessionReport) float64 { return r.MaxGapMS })
	t.Logf("FIGURE impaired network (%v, loss %.0f%%, duplication %.0f%%, reordering %.0f%% each way, +%v one way): %d sessions, %d lost; audio loss seen %.2f%% (%.2f%% from the configured loss), per session %s; reordered arrivals %d; duplicates delivered %d",
		dur, impairLoss*100, impairDup*100, impairReorder*100, impairDelay, len(rs), len(rs)-countOK(rs), seen*100, configured*100, distF(loss, "%"), reord, dups)
	t.Logf("FIGURE impaired network: audio lost %s", acct)
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
