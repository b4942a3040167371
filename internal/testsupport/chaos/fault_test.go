package chaos

import (
	"strconv"
	"sync"
	"testing"
	"time"
)

// sampler scrapes an address every 100 ms in the background and keeps
// the first time each watched condition held.
type sampler struct {
	mu    sync.Mutex
	first map[string]time.Time
	trace []metrics // one scrape a second
	stop  chan struct{}
	done  chan struct{}
}

func sample(addr string, conds map[string]func(metrics) bool) *sampler {
	s := &sampler{first: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if m, err := scrape(addr); err == nil {
				now := time.Now()
				s.mu.Lock()
				if len(s.trace) == 0 || len(s.trace) < int(now.Sub(start)/time.Second)+1 {
					s.trace = append(s.trace, m)
				}
				for name, cond := range conds {
					if _, ok := s.first[name]; !ok && cond(m) {
						s.first[name] = now
					}
				}
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// at stops the sampler and returns when cond first held, or zero.
func (s *sampler) at(name string) time.Time {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first[name]
}

// series returns one value a second of f over the scrapes.
func (s *sampler) series(f func(metrics) float64) []float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]float64, len(s.trace))
	for i, m := range s.trace {
		out[i] = f(m)
	}
	return out
}

// normalGapBoundMS bounds the audio gap of sessions a fault must not
// touch: well above this loaded machine's normal gaps (up to ~250 ms while
// other tests run beside), well below the 1–2 s a lost flow costs until it
// is rebuilt without the cache (TestRelayKill).
const normalGapBoundMS = 1500

// TestTransceiverKill runs sessions on two transceivers registered in
// Redis and kills one with SIGKILL (docs/design.md §5.8: losing a transceiver ends
// only its own sessions, with the backend told). Its clients must see
// their peer connection fail within ICE's consent bound; the agent must
// see each of their bridge connections end; the other transceiver's
// sessions must run on with no gap beyond the normal; the relay's flows
// to the dead transceiver must expire and it must leave the relay's
// membership table within the Redis registry's heartbeat bound.
func TestTransceiverKill(t *testing.T) {
	if !*flagFull {
		t.Parallel() // mostly waiting for consent to expire
	}
	const idle = 5 * time.Second
	n := *flagSessions
	s := startStack(t, stackConfig{transceivers: 2, redis: true, idleTimeout: idle})
	d := s.runDriver(t, "-sessions", strconv.Itoa(n), "-duration", "45s", "-ramp", "30ms")
	d.waitConnected(t, n, 60*time.Second)
	time.Sleep(2 * time.Second)
	survivors := n / 2 // sessions go round-robin: odd ones on transceiver 2
	confirmed := func(m metrics) float64 { return m[`switchboard_relay_flows{state="confirmed"}`] }
	perSession := confirmed(mustScrape(t, s.relayOps)) / float64(n)
	relay := sample(s.relayOps, map[string]func(metrics) bool{
		"members": func(m metrics) bool { return m.sum("switchboard_relay_members") == 1 },
		"flows":   func(m metrics) bool { return confirmed(m) <= perSession*float64(survivors) },
	})

	killed := d.mark(t)
	s.trx[0].kill9()
	rs := d.wait(t, 2*time.Minute)
	left, flowsGone := relay.at("members"), relay.at("flows")

	var dead, alive []sessionReport
	for _, r := range rs {
		if r.URLIndex == 0 {
			dead = append(dead, r)
		} else {
			alive = append(alive, r)
		}
	}
	checkSessions(t, alive, n-n/2)
	aliveGap := column(alive, func(r sessionReport) float64 { return r.MarkGapMS })
	alivePre := column(alive, func(r sessionReport) float64 { return r.PreMarkGapMS })
	if mx := pct(aliveGap, 100); mx > normalGapBoundMS {
		t.Errorf("the other transceiver's sessions: largest audio gap %.0f ms after the kill", mx)
	}

	// The dead transceiver's clients: peer connection failed within
	// Pion's consent bound (disconnected after 5 s, failed 25 s later).
	const failBound = 35 * time.Second
	var discAfter, failAfter []float64
	for _, r := range dead {
		end := r.FailedNS
		if end == 0 {
			end = r.ClosedNS
		}
		if r.ConnectedNS == 0 || end == 0 {
			t.Errorf("session %d on the killed transceiver: peer connection never failed or closed (%+v)", r.I, r)
			continue
		}
		failAfter = append(failAfter, float64(end-killed.UnixNano())/1e6)
		if r.DisconnectedNS != 0 {
			discAfter = append(discAfter, float64(r.DisconnectedNS-killed.UnixNano())/1e6)
		}
	}
	if mx := pct(failAfter, 100); mx > float64(failBound.Milliseconds()) {
		t.Errorf("a client of the killed transceiver saw its peer connection fail %.0f ms after the kill, beyond %v", mx, failBound)
	}

	// The backend was told: the agent saw each bridge connection end.
	ends := map[string]time.Time{}
	for _, m := range s.agent.jsonLines("session end") {
		id, _ := m["session_id"].(string)
		ends[id] = logTime(m)
	}
	var toldAfter []float64
	for _, r := range dead {
		at, ok := ends[sessionID(r.Session)]
		if !ok {
			t.Errorf("the agent never saw session %s (killed transceiver) end", sessionID(r.Session))
			continue
		}
		toldAfter = append(toldAfter, float64(at.Sub(killed).Milliseconds()))
	}
	if mx := pct(toldAfter, 100); mx > 5000 {
		t.Errorf("the agent saw a bridge of the killed transceiver end %.0f ms after the kill", mx)
	}

	// The relay: membership and flows.
	memberBound := 6*time.Second + time.Second + 2*time.Second // registry TTL + relay poll + slack
	if left.IsZero() || left.Sub(killed) > memberBound {
		t.Errorf("the killed transceiver left the relay's membership table at %v after the kill, want within %v", sinceOrNever(left, killed), memberBound)
	}
	flowBound := failBound + idle + 5*time.Second // clients stop their consent checks, then the idle timeout and a sweep
	if flowsGone.IsZero() || flowsGone.Sub(killed) > flowBound {
		t.Errorf("the relay's flows to the killed transceiver were gone at %v after the kill, want within %v", sinceOrNever(flowsGone, killed), flowBound)
	}
	trx2 := mustScrape(t, s.trxHTTP[1])
	if f := trx2.sum("switchboard_transceiver_sessions_ended_total") - trx2[`switchboard_transceiver_sessions_ended_total{reason="client_hangup"}`]; f != 0 {
		t.Errorf("the other transceiver ended %v sessions for a reason other than the client's hangup", f)
	}

	t.Logf("FIGURE transceiver kill: %d sessions on the killed transceiver, %d on the other. Killed transceiver's clients: ICE disconnected %s after the kill; peer connection failed %s after the kill; agent saw the bridge end %s after the kill",
		len(dead), len(alive), dist(discAfter, " ms"), dist(failAfter, " ms"), dist(toldAfter, " ms"))
	t.Logf("FIGURE transceiver kill: other transceiver's sessions: audio gap after the kill %s; normal (5 s before) %s; lost %d",
		dist(aliveGap, " ms"), dist(alivePre, " ms"), len(alive)-countOK(alive))
	t.Logf("FIGURE transceiver kill: left the relay's membership (Redis) %v after the kill (bound %v); relay flows to it gone %v after the kill (relay -idle-timeout %v)",
		sinceOrNever(left, killed), memberBound, sinceOrNever(flowsGone, killed), idle)
	t.Logf("relay confirmed flows, one a second from the kill: %v", relay.series(confirmed))
	t.Logf("CPU: %s", s.cpu())
}

func sinceOrNever(at, from time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return at.Sub(from).Round(100 * time.Millisecond).String()
}

// countOK counts sessions that ran to their end.
func countOK(rs []sessionReport) int {
	n := 0
	for _, r := range rs {
		if r.Failure == "" && r.FailedNS == 0 && !r.ICEFailed && r.DCEchoEnd {
			n++
		}
	}
	return n
}

// TestRedisKill kills redis-server with SIGKILL while sessions run, with
// transceivers registered in it and the relay reading its membership from
// it (and using it as its flow cache, when the relay has one). Redis is
// off the packet path: no session may be lost, media keeps flowing, the
// relay keeps its last membership table past the registry's TTL, and new
// sessions still connect while Redis is down.
func TestRedisKill(t *testing.T) {
	n := *flagSessions
	s := startStack(t, stackConfig{transceivers: 2, redis: true, flowCache: bins.flowCache})
	d := s.runDriver(t, "-sessions", strconv.Itoa(n), "-duration", "16s", "-ramp", "30ms")
	d.waitConnected(t, n, 60*time.Second)
	time.Sleep(2 * time.Second)

	d.mark(t)
	s.redis.kill9()
	// Past the registry's TTL (6 s) without Redis, a second wave of
	// sessions must still connect and echo.
	time.Sleep(8 * time.Second)
	wave := s.runDriver(t, "-sessions", "10", "-duration", "3s", "-ramp", "50ms")
	rs := d.wait(t, 2*time.Minute)
	ws := wave.wait(t, time.Minute)
	relay := mustScrape(t, s.relayOps)

	checkSessions(t, rs, n)
	checkSessions(t, ws, 10)
	if m := relay.sum("switchboard_relay_members"); m != 2 {
		t.Errorf("relay membership table has %v members with Redis down, want the last table read (2)", m)
	}
	if f := relay.sum("switchboard_relay_membership_read_failures_total"); f == 0 {
		t.Errorf("the relay never failed to read Redis: was it killed?")
	}
	gap := column(rs, func(r sessionReport) float64 { return r.MarkGapMS })
	pre := column(rs, func(r sessionReport) float64 { return r.PreMarkGapMS })
	if mx := pct(gap, 100); mx > normalGapBoundMS {
		t.Errorf("largest audio gap after the Redis kill: %.0f ms", mx)
	}
	t.Logf("FIGURE redis kill (flow cache %v): %d sessions live at the kill, %d lost; %d new sessions %v after the kill, %d lost; audio gap after the kill %s, normal (5 s before) %s; relay membership reads failed %v times, table kept at %v members",
		bins.flowCache, len(rs), len(rs)-countOK(rs), len(ws), 8*time.Second, len(ws)-countOK(ws), dist(gap, " ms"), dist(pre, " ms"),
		relay.sum("switchboard_relay_membership_read_failures_total"), relay.sum("switchboard_relay_members"))
	t.Logf("relay drops: %s; flow cache up %v, cache writes %v; CPU: %s", drops(relay),
		relay.sum("switchboard_relay_flow_cache_up"), relay.sum("switchboard_relay_flow_cache_writes_total"), s.cpu())
}
