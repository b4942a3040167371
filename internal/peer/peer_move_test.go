package peer

import (
	"net"
	"sync"
	"testing"
	"time"
)

// TestPathStrangers: a stranger's flow to the path's front port (on a
// shared machine, another process's peer still sending to a port the
// path's socket was given) does not take the client's place: the client
// connects through the path, which would otherwise send the server's
// answers and every ClientHello to the stranger. The stranger sends every
// millisecond, oftener than the server answers on a loaded machine.
func TestPathStrangers(t *testing.T) {
	s := newServer(t)
	c := newClient(t, false)
	p := newPath(t, s.addr(), c)
	s.advertise = p.addr()
	stranger, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		rtp := make([]byte, 172) // a 20 ms Opus packet's size
		rtp[0] = 0x80
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_, _ = stranger.WriteToUDPAddrPort(rtp, p.addr())
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		_ = stranger.Close()
	})
	connectPath(t, s, c, p)
	if p.strangers.Load() == 0 {
		t.Fatal("no stranger's datagram reached the path")
	}
}

// TestReplayDoesNotRedirect: a captured nominating check replayed byte for
// byte from another address is answered but does not move the session's
// media there, nor teach that address; a valid non-nominating check from
// another address does not move it either; before the client's media has
// begun, a fresh nominating one does (after, TestOldReplayAfterMedia).
func TestReplayDoesNotRedirect(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	victim, attacker, other := newSock(t), newSock(t), newSock(t)
	nom := check(t, user, pwd, true)
	checkFrom(t, victim, s.addr(), nom)
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("remote %v after the nominating check, want %v", got, sockAddr(victim))
	}
	checkFrom(t, attacker, s.addr(), nom)
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("a replayed check from %v moved the session's media to %v", sockAddr(attacker), got)
	}
	if s.ep.session(sockAddr(attacker)) != nil {
		t.Fatal("a replayed check taught its address")
	}
	checkFrom(t, other, s.addr(), check(t, user, pwd, false))
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("a non-nominating check moved the session to %v", got)
	}
	if s.ep.session(sockAddr(other)) != sess {
		t.Fatal("a valid check did not teach its address")
	}
	checkFrom(t, other, s.addr(), check(t, user, pwd, true))
	if got := sess.RemoteAddr(); got != sockAddr(other) {
		t.Fatalf("a fresh nominating check from %v left the session on %v", sockAddr(other), got)
	}
}

// TestOldReplayAfterMedia: once the client's SRTP has authenticated, a
// captured nominating check older than the transaction-ID ring, replayed
// from another address, is answered and counted (MoveDeferred) but moves
// nothing and refreshes no consent, nor does the client's SRTP replayed
// from there; the client's fresh SRTP from a new address that a check
// came from (a NAT rebinding) moves the media, and a late packet from the
// address it left does not move it back.
func TestOldReplayAfterMedia(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	victim, attacker, rebound := newSock(t), newSock(t), newSock(t)
	captured := check(t, user, pwd, true)
	checkFrom(t, victim, s.addr(), captured)
	p := keySession(t, sess)
	rtpFrom := func(c *net.UDPConn) []byte { t.Helper(); return p.sendFrom(t, s, sess, c) }
	last := rtpFrom(victim) // the media has begun
	// The client's next txRing checks push the captured one out of the
	// ring.
	for range txRing {
		checkFrom(t, victim, s.addr(), check(t, user, pwd, true))
	}
	seen, moves := sess.lastSeen.Load(), s.ep.Moves()
	checkFrom(t, attacker, s.addr(), captured)
	if got := s.ep.Moves()[MoveDeferred]; got != moves[MoveDeferred]+1 {
		t.Fatalf("deferred moves %d, want %d: the replay did not get past the ring", got, moves[MoveDeferred]+1)
	}
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("a replayed check older than the ring moved the media to %v", got)
	}
	if sess.lastSeen.Load() != seen {
		t.Fatal("a replayed check from another address refreshed consent")
	}
	// The client's last SRTP packet replayed from the attacker's address
	// fails the replay window: it confirms nothing.
	auth := s.ep.Drops()[DropSRTPAuth]
	if _, err := attacker.WriteToUDPAddrPort(last, s.addr()); err != nil {
		t.Fatal(err)
	}
	waitDrop(t, s.ep, DropSRTPAuth, auth+1)
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("replayed SRTP moved the media to %v", got)
	}
	rtpFrom(victim)
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("the client's own SRTP left the media on %v", got)
	}

	// A rebinding: the client's consent check (not nominating) and then
	// its SRTP come from a new port.
	checkFrom(t, rebound, s.addr(), check(t, user, pwd, false))
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("a check alone moved the media to %v", got)
	}
	rtpFrom(rebound)
	if got := sess.RemoteAddr(); got != sockAddr(rebound) {
		t.Fatalf("the client's SRTP from its new port left the media on %v", got)
	}
	if got := s.ep.Moves()[MoveConfirmed]; got != moves[MoveConfirmed]+1 {
		t.Fatalf("confirmed moves %d, want %d", got, moves[MoveConfirmed]+1)
	}
	// A late packet from the old port moves nothing back.
	rtpFrom(victim)
	if got := sess.RemoteAddr(); got != sockAddr(rebound) {
		t.Fatalf("a late packet from the old port moved the media back to %v", got)
	}
}

// TestCandidateLapses: a candidate confirms only within its window after
// its check (candidateTTL): the client's SRTP from an address whose check
// is older than that moves nothing, so a replayed check is good for one
// short race. The same steps with the default window (2 s) move the
// media. The short window is a test's; the wait is longer than it, so
// the outcome does not depend on the machine's speed.
func TestCandidateLapses(t *testing.T) {
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	const wait = 20 * time.Millisecond
	for _, tc := range []struct {
		name  string
		ttl   time.Duration // 0: candidateTTL
		moves bool
	}{
		{name: "lapsed", ttl: time.Millisecond, moves: false},
		{name: "default", moves: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t)
			sess := liteSession(t, s)
			if tc.ttl != 0 {
				sess.setCandidateTTL(tc.ttl)
			}
			sel, other := newSock(t), newSock(t)
			checkFrom(t, sel, s.addr(), check(t, user, pwd, true))
			p := keySession(t, sess)
			p.sendFrom(t, s, sess, sel) // the media has begun
			checkFrom(t, other, s.addr(), check(t, user, pwd, true))
			time.Sleep(wait)
			p.sendFrom(t, s, sess, other)
			want, confirmed := sockAddr(sel), uint64(0)
			if tc.moves {
				want, confirmed = sockAddr(other), 1
			}
			if got := sess.RemoteAddr(); got != want {
				t.Fatalf("remote %v after SRTP from the candidate %v, %v after its check; want %v", got, sockAddr(other), wait, want)
			}
			if got := s.ep.Moves()[MoveConfirmed]; got != confirmed {
				t.Fatalf("confirmed moves %d, want %d", got, confirmed)
			}
		})
	}
}

// TestSRTCPConfirmsMove: the client's SRTCP alone begins its media and
// confirms a move, as its SRTP does (a client that sends no RTP still
// reports on what it receives, RFC 3550 §6.2).
func TestSRTCPConfirmsMove(t *testing.T) {
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	s := newServer(t)
	rtcpIn := make(chan struct{}, 1)
	sess := liteSession(t, s, func(c *SessionConfig) {
		c.OnRTCP = func([]byte) {
			select {
			case rtcpIn <- struct{}{}:
			default:
			}
		}
	})
	sel, rebound := newSock(t), newSock(t)
	checkFrom(t, sel, s.addr(), check(t, user, pwd, true))
	p := keySession(t, sess)
	// rtcpFrom sends the client's next SRTCP packet from c and waits
	// for the session to hand it to OnRTCP.
	rtcpFrom := func(c *net.UDPConn) {
		t.Helper()
		if _, err := c.WriteToUDPAddrPort(p.nextRTCP(t, nil), s.addr()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-rtcpIn:
		case <-time.After(5 * time.Second):
			t.Fatalf("SRTCP from %v did not reach OnRTCP (drops %v)", sockAddr(c), s.ep.Drops())
		}
	}
	rtcpFrom(sel)
	moves := s.ep.Moves()
	checkFrom(t, rebound, s.addr(), check(t, user, pwd, true))
	// Deferred, not nominated: the SRTCP began the client's media.
	if got := s.ep.Moves(); got[MoveDeferred] != moves[MoveDeferred]+1 || got[MoveNominated] != moves[MoveNominated] {
		t.Fatalf("moves %v after a nominating check from a new address, then %v: want it deferred", moves, got)
	}
	if got := sess.RemoteAddr(); got != sockAddr(sel) {
		t.Fatalf("a check alone moved the media to %v", got)
	}
	rtcpFrom(rebound)
	if got := sess.RemoteAddr(); got != sockAddr(rebound) {
		t.Fatalf("the client's SRTCP from %v left the media on %v", sockAddr(rebound), got)
	}
	if got := s.ep.Moves()[MoveConfirmed]; got != moves[MoveConfirmed]+1 {
		t.Fatalf("confirmed moves %d, want %d", got, moves[MoveConfirmed]+1)
	}
}

// TestRebindAfterOldReplay: a Pion client in a call. Its first
// nominating check, captured on the path and replayed from another
// address once it is older than the transaction-ID ring, is answered but
// the client's echoes keep coming; then the client's NAT gives it a new
// port, and the session follows it there (its next consent check, then
// its RTP) without signaling.
func TestRebindAfterOldReplay(t *testing.T) {
	s := newServer(t)
	c := newClient(t, false)
	p := newPath(t, s.addr(), c)
	sess, _ := connectPath(t, s, c, p)
	var wg sync.WaitGroup
	wg.Add(1)
	go echoRTP(sess, &wg)
	sendUntilEcho(t, c, 1)
	old := p.backAddr()
	if got := sess.RemoteAddr(); got != old {
		t.Fatalf("remote %v, want the path's %v", got, old)
	}
	captured := p.firstNom.Load()
	if captured == nil {
		t.Fatal("the client sent no nominating check through the path")
	}
	// Fresh checks with the session's credentials push the captured one
	// out of the ring, as txRing of the client's consent checks would
	// (Pion sends one every 2 s).
	filler := newSock(t)
	user := sess.cfg.LocalUfrag + ":" + sess.cfg.RemoteUfrag
	for range txRing {
		checkFrom(t, filler, s.addr(), check(t, user, sess.cfg.LocalPwd, false))
	}
	attacker := newSock(t)
	moves := s.ep.Moves()
	checkFrom(t, attacker, s.addr(), *captured)
	if got := s.ep.Moves()[MoveDeferred]; got != moves[MoveDeferred]+1 {
		t.Fatalf("deferred moves %d, want %d: the replay did not get past the ring", got, moves[MoveDeferred]+1)
	}
	// The session takes a check before it answers it.
	if got := sess.RemoteAddr(); got != old {
		t.Fatalf("the replayed check moved the media to %v", got)
	}
	sendUntilEcho(t, c, 2)
	if got := s.ep.Moves(); got[MoveConfirmed] != moves[MoveConfirmed] || got[MoveNominated] != moves[MoveNominated] {
		t.Fatalf("moves %v, then %v: the media moved", moves, got)
	}
	if got := sess.RemoteAddr(); got != old {
		t.Fatalf("the media is on %v, want the client's %v", got, old)
	}

	confirmed := s.ep.Moves()[MoveConfirmed]
	p.rebind(t)
	rebindAt := time.Now()
	sendUntilEcho(t, c, 3)
	t.Logf("echoes resumed %v after the rebinding", time.Since(rebindAt).Round(time.Millisecond))
	if got, want := sess.RemoteAddr(), p.backAddr(); got != want {
		t.Fatalf("remote %v after the rebinding, want %v", got, want)
	}
	if got := s.ep.Moves()[MoveConfirmed]; got != confirmed+1 {
		t.Fatalf("confirmed moves %d, want %d", got, confirmed+1)
	}
	_ = sess.Close()
	wg.Wait()
}

// TestEvictKeepsSelected: a session that learns more than maxLearned
// addresses forgets the oldest but the selected one, whose SRTP and DTLS
// must still reach it.
func TestEvictKeepsSelected(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	sel := newSock(t)
	checkFrom(t, sel, s.addr(), check(t, user, pwd, true))
	var others []*net.UDPConn
	for range maxLearned {
		c := newSock(t)
		checkFrom(t, c, s.addr(), check(t, user, pwd, false))
		others = append(others, c)
	}
	if got := sess.RemoteAddr(); got != sockAddr(sel) {
		t.Fatalf("remote %v, want the nominated %v", got, sockAddr(sel))
	}
	if s.ep.session(sockAddr(sel)) != sess {
		t.Fatal("the selected address was evicted: its SRTP and DTLS would drop as unknown_address")
	}
	if s.ep.session(sockAddr(others[0])) != nil {
		t.Fatal("the oldest unselected address was not evicted")
	}
	// SRTP from the selected address reaches the session (not yet
	// keyed: kept for the keys, not dropped as unknown_address).
	before := s.ep.Drops()[DropUnknownAddress]
	rtpPkt := make([]byte, 40)
	rtpPkt[0] = 0x80
	if _, err := sel.WriteToUDPAddrPort(rtpPkt, s.addr()); err != nil {
		t.Fatal(err)
	}
	// A DTLS datagram from a stranger after it, to know the read loop
	// has handled the SRTP.
	sendRaw(t, s.addr(), []byte{22, 254, 253, 0, 0}, false)
	waitDrop(t, s.ep, DropUnknownAddress, before+1)
	if got := s.ep.Drops()[DropUnknownAddress]; got != before+1 {
		t.Fatalf("SRTP from the selected address dropped as unknown_address")
	}
}
