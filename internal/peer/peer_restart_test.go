package peer

import (
	"net/netip"
	"testing"
)

// TestRestartAfterMedia: after an ICE restart in a call, a check of the
// new generation from a new address (the client's new path) makes it a
// candidate, and the client's SRTP from there moves the media, as for a
// NAT rebinding (signaling.md, "ICE restart").
func TestRestartAfterMedia(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	sel, next := newSock(t), newSock(t)
	checkFrom(t, sel, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	p := keySession(t, sess)
	p.sendFrom(t, s, sess, sel) // the media has begun
	if err := sess.Restart("local2", "local2pwdlocal2pwdlocal2", "remote2"); err != nil {
		t.Fatal(err)
	}
	moves := s.ep.Moves()
	checkFrom(t, next, s.addr(), check(t, "local2:remote2", "local2pwdlocal2pwdlocal2", true))
	if got := s.ep.Moves()[MoveDeferred]; got != moves[MoveDeferred]+1 {
		t.Fatalf("deferred moves %d, want %d", got, moves[MoveDeferred]+1)
	}
	if got := sess.RemoteAddr(); got != sockAddr(sel) {
		t.Fatalf("the new generation's check alone moved the media to %v", got)
	}
	p.sendFrom(t, s, sess, next)
	if got := sess.RemoteAddr(); got != sockAddr(next) {
		t.Fatalf("the client's SRTP from the new generation's address %v left the media on %v", sockAddr(next), got)
	}
	if got := s.ep.Moves()[MoveConfirmed]; got != moves[MoveConfirmed]+1 {
		t.Fatalf("confirmed moves %d, want %d", got, moves[MoveConfirmed]+1)
	}
}

// TestRestartVoidsOldCandidates: a candidate of the generation before an
// ICE restart confirms nothing after it. The restart forgets its address,
// so the client's SRTP from there is dropped (unknown_address); and when a
// check of the old generation races the restart (the read loop took the
// credentials before Restart and learns the address and makes it a
// candidate after Restart forgot the old ones; the test's goroutine plays
// the read loop for that packet and the SRTP after it), the client's SRTP
// from that address is taken but moves nothing.
func TestRestartVoidsOldCandidates(t *testing.T) {
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	s := newServer(t)
	sess := liteSession(t, s)
	sel, old := newSock(t), newSock(t)
	checkFrom(t, sel, s.addr(), check(t, user, pwd, true))
	p := keySession(t, sess)
	p.sendFrom(t, s, sess, sel) // the media has begun
	checkFrom(t, old, s.addr(), check(t, user, pwd, true))
	// The read loop hands this packet to the media reader after it took
	// the check: the candidates are the test's from here.
	p.sendFrom(t, s, sess, sel)
	oldCred := sess.credentials()
	if err := sess.Restart("local2", "local2pwdlocal2pwdlocal2", "remote2"); err != nil {
		t.Fatal(err)
	}
	moves := s.ep.Moves()
	unknown := s.ep.Drops()[DropUnknownAddress]
	if _, err := old.WriteToUDPAddrPort(p.next(t, nil), s.addr()); err != nil {
		t.Fatal(err)
	}
	waitDrop(t, s.ep, DropUnknownAddress, unknown+1)

	raced := netip.MustParseAddrPort("127.0.0.1:9")
	s.ep.learn(sess, raced)
	sess.candidate(raced, oldCred)
	var rd reader
	s.ep.handle(&rd, p.next(t, nil), raced)
	select {
	case bp := <-sess.rtpq:
		putBuf(bp)
	default:
		t.Fatalf("the client's SRTP from %v was not taken (drops %v)", raced, s.ep.Drops())
	}
	if got := sess.RemoteAddr(); got != sockAddr(sel) {
		t.Fatalf("SRTP from a candidate of the old generation moved the media to %v", got)
	}
	if got := s.ep.Moves(); got != moves {
		t.Fatalf("moves %v, then %v", moves, got)
	}
}

// TestRestartForgetsOldAddresses: an ICE restart forgets the addresses
// learned from the old generation's checks but the selected one, which
// keeps carrying DTLS and SRTP until the new generation moves the media
// (a nominating check before the client's media begins; after, the
// client's SRTP or SRTCP from a candidate: TestRestartAfterMedia).
func TestRestartForgetsOldAddresses(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	sel, other := newSock(t), newSock(t)
	checkFrom(t, sel, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	checkFrom(t, other, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", false))
	if s.ep.session(sockAddr(other)) != sess {
		t.Fatal("a valid check did not teach its address")
	}
	if err := sess.Restart("local2", "local2pwdlocal2pwdlocal2", "remote2"); err != nil {
		t.Fatal(err)
	}
	if s.ep.session(sockAddr(other)) != nil {
		t.Fatal("an address of the old generation is still mapped after the restart")
	}
	if s.ep.session(sockAddr(sel)) != sess || sess.RemoteAddr() != sockAddr(sel) {
		t.Fatal("the restart dropped the selected address")
	}
	// The old generation's credentials are refused, the new ones work.
	before := s.ep.Drops()[DropSTUNUnknownUfrag]
	sendRaw(t, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", false), false)
	waitDrop(t, s.ep, DropSTUNUnknownUfrag, before+1)
	checkFrom(t, other, s.addr(), check(t, "local2:remote2", "local2pwdlocal2pwdlocal2", false))
	// The new local ufrag with the old remote one: not this generation.
	before = s.ep.Drops()[DropSTUNBadUsername]
	sendRaw(t, s.addr(), check(t, "local2:remote", "local2pwdlocal2pwdlocal2", false), false)
	waitDrop(t, s.ep, DropSTUNBadUsername, before+1)
	_ = sess.Close()
	if err := sess.Restart("local3", "local3pwdlocal3pwdlocal3", "remote3"); err != ErrClosed {
		t.Fatalf("Restart after Close: %v, want ErrClosed", err)
	}
}
