package chaos

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// TestRelayKill kills the relay with SIGKILL under load and starts a new
// one on the same ports, with an empty flow table (docs/design.md §5.7: losing a
// relay loses no session). Three ways back, one subtest each:
//
//   - cache: the Redis flow cache only (-flow-cache, -relearn=false): the
//     new relay finds the flow of a client's first DTLS/RTP/RTCP datagram
//     in Redis;
//   - relearn: relearning only (-relearn, the default; no cache): the
//     transceiver's next datagram for the client rebuilds the flow;
//   - neither (-relearn=false, no cache): the flow comes back with the
//     client's next consent check (a STUN Binding request with the token).
//
// Invariant: no session reaches ICE failed, and every session's audio and
// data channel work to its end. Figure: per session, the largest gap in
// the echoed audio the client receives, over the intervals that end
// within 30 s after the kill (the normal cadence is 20 ms), as p50/p99/max.
func TestRelayKill(t *testing.T) {
	for _, v := range []struct {
		name             string
		cache, noRelearn bool
		maxGap           float64 // ms, the largest audio gap around the kill allowed
	}{
		{"cache", true, true, 2000},
		{"relearn", false, false, 2000},
		{"neither", false, true, 3000},
	} {
		t.Run(v.name, func(t *testing.T) {
			if v.cache && !bins.flowCache {
				t.Fatal("the relay has no -flow-cache flag")
			}
			n := *flagSessions
			s := startStack(t, stackConfig{redis: v.cache, flowCache: v.cache, noRelearn: v.noRelearn})
			d := s.runDriver(t, "-sessions", strconv.Itoa(n), "-duration", "14s", "-ramp", "30ms")
			d.waitConnected(t, n, 60*time.Second)
			time.Sleep(2 * time.Second) // steady state: every flow confirmed (and cached)
			before := mustScrape(t, s.relayOps)

			killed := d.mark(t)
			s.relay.kill9()
			restart := s.restartRelay(t)
			rs := d.wait(t, 2*time.Minute)
			after := mustScrape(t, s.relayOps)
			trx := mustScrape(t, s.trxHTTP[0])

			checkSessions(t, rs, n)
			if f := trx[`switchboard_transceiver_sessions_ended_total{reason="ice_failed"}`]; f != 0 {
				t.Errorf("transceiver ended %v sessions with ice_failed", f)
			}
			gap := column(rs, func(r sessionReport) float64 { return r.MarkGapMS })
			pre := column(rs, func(r sessionReport) float64 { return r.PreMarkGapMS })
			var disconnected int
			for _, r := range rs {
				if r.DisconnectedNS > killed.UnixNano() {
					disconnected++
				}
			}
			t.Logf("FIGURE relay kill (%s): %d sessions, %d reached ICE failed, %d went ICE disconnected; audio gap around the kill: %s; normal (5 s before): %s",
				v.name, len(rs), countFailed(rs), disconnected, dist(gap, " ms"), dist(pre, " ms"))
			t.Logf("relay back on its ports (/ready) %v after the kill; before the kill: %v flows; new relay: flows created by STUN %v, relearned %v, restored from the cache %v; drops: %s",
				restart.Round(time.Millisecond), before.sum("switchboard_relay_flows"), after.sum("switchboard_relay_flows_created_total"),
				after.sum("switchboard_relay_flows_relearned_total"), after.sum("switchboard_relay_flows_restored_total"), drops(after))
			t.Logf("CPU: %s", s.cpu())
			// The flows of the sessions live at the kill (every session
			// lives to its end: checkSessions), one per session; a flow
			// the old relay had beyond those belonged to no live session.
			live := min(before.sum("switchboard_relay_flows"), float64(n))
			restored, relearned, created := after.sum("switchboard_relay_flows_restored_total"),
				after.sum("switchboard_relay_flows_relearned_total"), after.sum("switchboard_relay_flows_created_total")
			switch v.name {
			case "cache":
				if restored < 0.9*live {
					t.Errorf("%v flows restored from the cache, want at least 90%% of the %v of live sessions", restored, live)
				}
			case "relearn":
				if relearned == 0 {
					t.Errorf("no flow was relearned")
				}
			case "neither":
				// Back by STUN alone: the consent checks' Binding requests.
				if restored != 0 || relearned != 0 || created < 0.9*live {
					t.Errorf("flows restored %v, relearned %v, created by STUN %v; want only STUN, at least 90%% of the %v of live sessions", restored, relearned, created, live)
				}
			}
			if mx := pct(gap, 100); mx > 20000 {
				t.Errorf("largest audio gap %.0f ms: clients were within reach of ICE failure", mx)
			} else if mx > v.maxGap {
				t.Errorf("largest audio gap %.0f ms, want at most %.0f ms for %s", mx, v.maxGap, v.name)
			}
		})
	}
}

func countFailed(rs []sessionReport) int {
	n := 0
	for _, r := range rs {
		if r.ICEFailed || r.FailedNS != 0 {
			n++
		}
	}
	return n
}

// drops lists the relay's non-zero drop counters.
func drops(m metrics) string {
	out := ""
	for k, v := range m {
		if v != 0 && len(k) > len("switchboard_relay_drops_total") && k[:len("switchboard_relay_drops_total")] == "switchboard_relay_drops_total" {
			out += fmt.Sprintf("%s=%v ", k[len("switchboard_relay_drops_total{reason=\""):len(k)-2], v)
		}
	}
	if out == "" {
		return "none"
	}
	return out
}
