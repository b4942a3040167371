package hop

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v4"
)

// TestLatch: a session's client that moves (NAT rebinding) is followed only
// after a Binding request that verifies with the session's pwd; a sniffed
// ufrag without the pwd, or media alone, never moves it.
func TestLatch(t *testing.T) {
	sock := listen(t)
	const quiet = time.Second // generous: a loaded machine must not make a live address look quiet
	c, err := NewConn(sock, ConnConfig{Advertise: netip.MustParseAddrPort("127.0.0.1:3478"), LatchQuiet: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	relay := listen(t)
	defer relay.Close()
	to := net.UDPAddrFromAddrPort(c.SocketAddr())
	c.AddSession("srvufrag", "the-session-pwd-of-24-chars")

	oldAddr := netip.MustParseAddrPort("198.51.100.9:40000")
	newAddr := netip.MustParseAddrPort("198.51.100.9:40001")
	check := func(pwd string) []byte {
		m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername("srvufrag:cli"),
			stun.NewShortTermIntegrity(pwd), stun.Fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		return m.Raw
	}
	rtp := []byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}
	deliver := func(from netip.AddrPort, payload []byte) netip.AddrPort {
		t.Helper()
		if _, err := relay.WriteTo(append(AppendHeader(nil, TypeData, from), payload...), to); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, got, err := c.ReadFromAddrPort(make([]byte, 1500))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	otherIP := netip.MustParseAddrPort("203.0.113.5:40000") // the client's other network
	const pwd = "the-session-pwd-of-24-chars"
	steps := []struct {
		name    string
		from    netip.AddrPort
		payload []byte
		want    netip.AddrPort
		latched uint64
		wait    time.Duration // before the step: the old address goes quiet
	}{
		{"a first check without the pwd fixes nothing", otherIP, check("guessed-password-xxxxxxxx"), otherIP, 0, 0},
		{"first check fixes the address", oldAddr, check(pwd), oldAddr, 0, 0},
		{"an authenticated check from another IP is another path, not a rebinding", otherIP, check(pwd), otherIP, 0, 0},
		{"media from a new address alone does not move it", newAddr, rtp, newAddr, 0, 0},
		{"a check without the pwd does not move it", newAddr, check("guessed-password-xxxxxxxx"), newAddr, 0, 0},
		{"an authenticated check while the old address is live does not move it", newAddr, check(pwd), newAddr, 0, 0},
		{"an authenticated check after the old address went quiet moves it", newAddr, check(pwd), oldAddr, 1, quiet + 50*time.Millisecond},
		{"later media from the new address is the session's", newAddr, rtp, oldAddr, 1, 0},
	}
	for _, st := range steps {
		time.Sleep(st.wait)
		if got := deliver(st.from, st.payload); got != st.want {
			t.Fatalf("%s: reported as %v, want %v", st.name, got, st.want)
		}
		if l := c.Stats().Latched; l != st.latched {
			t.Fatalf("%s: latched %d, want %d", st.name, l, st.latched)
		}
	}
	// Writes to the session's address go to the new wire address.
	if _, err := c.WriteToAddrPort([]byte("reply"), oldAddr); err != nil {
		t.Fatal(err)
	}
	_ = relay.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	n, _, err := relay.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, named, p, err := ParseHeader(buf[:n]); err != nil || named != newAddr || string(p) != "reply" {
		t.Fatalf("reply went to %v (%q, %v), want %v", named, p, err, newAddr)
	}
	// The mapping comes back: the new address goes quiet and a check from
	// the old one ends the latch: writes go there.
	time.Sleep(quiet + 50*time.Millisecond)
	if got := deliver(oldAddr, check(pwd)); got != oldAddr {
		t.Fatalf("check from the old address reported as %v", got)
	}
	if _, err := c.WriteToAddrPort([]byte("back"), oldAddr); err != nil {
		t.Fatal(err)
	}
	n, _, err = relay.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, named, _, err := ParseHeader(buf[:n]); err != nil || named != oldAddr {
		t.Fatalf("after the mapping came back, write went to %v, want %v", named, oldAddr)
	}
	if got := deliver(newAddr, rtp); got != newAddr {
		t.Fatalf("the stale alias survived: %v", got)
	}
	// Removing the session drops its aliases.
	c.RemoveSession("srvufrag")
	if got := deliver(newAddr, rtp); got != newAddr {
		t.Fatalf("after RemoveSession: reported as %v", got)
	}
}

// TestLatchOnlyNominatingOrQuiet: a second socket on the live client's IP
// that keeps sending authenticated checks without USE-CANDIDATE (a browser
// with two interfaces behind one NAT) never takes the session's media while
// the current address is live; a nominating check moves it at once, and a
// plain check moves it only once the current address has gone quiet. Every
// move is counted under its reason.
func TestLatchOnlyNominatingOrQuiet(t *testing.T) {
	sock := listen(t)
	const quiet = time.Second
	c, err := NewConn(sock, ConnConfig{Advertise: netip.MustParseAddrPort("127.0.0.1:3478"), LatchQuiet: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	relay := listen(t)
	defer relay.Close()
	to := net.UDPAddrFromAddrPort(c.SocketAddr())
	const pwd = "the-session-pwd-of-24-chars"
	c.AddSession("srvufrag", pwd)

	a := netip.MustParseAddrPort("198.51.100.9:40000")
	b := netip.MustParseAddrPort("198.51.100.9:40001")
	check := func(nominate bool) []byte {
		setters := []stun.Setter{stun.TransactionID, stun.BindingRequest, stun.NewUsername("srvufrag:cli")}
		if nominate {
			setters = append(setters, stun.RawAttribute{Type: stun.AttrUseCandidate})
		}
		m, err := stun.Build(append(setters, stun.NewShortTermIntegrity(pwd), stun.Fingerprint)...)
		if err != nil {
			t.Fatal(err)
		}
		return m.Raw
	}
	rtp := []byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}
	deliver := func(from netip.AddrPort, payload []byte) netip.AddrPort {
		t.Helper()
		if _, err := relay.WriteTo(append(AppendHeader(nil, TypeData, from), payload...), to); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, got, err := c.ReadFromAddrPort(make([]byte, 1500))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// wireOf reports where a write to the session's address goes.
	buf := make([]byte, 1500)
	wireOf := func() netip.AddrPort {
		t.Helper()
		if _, err := c.WriteToAddrPort([]byte("media"), a); err != nil {
			t.Fatal(err)
		}
		_ = relay.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := relay.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		_, named, _, err := ParseHeader(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		return named
	}
	moves := func() [NumMoveReasons]uint64 { return c.Stats().Moves }

	if got := deliver(a, check(true)); got != a {
		t.Fatalf("first check reported as %v", got)
	}
	// Both sockets keep checking without nominating, A with media between:
	// nothing moves, no flapping.
	for i := range 10 {
		if got := deliver(b, check(false)); got != b {
			t.Fatalf("round %d: a non-nominating check from a second socket took the session (reported as %v)", i, got)
		}
		deliver(a, rtp)
		deliver(a, check(false))
		if w := wireOf(); w != a {
			t.Fatalf("round %d: media went to %v while %v is live", i, w, a)
		}
	}
	if m := moves(); m != ([NumMoveReasons]uint64{}) || c.Stats().Latched != 0 {
		t.Fatalf("moves %v, latched %d, want none", m, c.Stats().Latched)
	}
	// A nominating check from B moves the media at once, even though A is live.
	if got := deliver(b, check(true)); got != a {
		t.Fatalf("nominating check from %v reported as %v, want the session's %v", b, got, a)
	}
	if w := wireOf(); w != b {
		t.Fatalf("after the nomination media goes to %v, want %v", w, b)
	}
	if m := moves(); m[MoveNominated] != 1 || m[MoveQuiet] != 0 {
		t.Fatalf("moves %v, want one nominated", m)
	}
	// A, no longer selected, keeps checking: B stays.
	deliver(b, rtp)
	deliver(a, check(false))
	if w := wireOf(); w != b {
		t.Fatalf("media went to %v, want %v", w, b)
	}
	// B goes quiet (its NAT mapping changed, say) past LatchQuiet: A's
	// next plain check takes the media back.
	time.Sleep(quiet + 100*time.Millisecond)
	if got := deliver(a, check(false)); got != a {
		t.Fatalf("check after %v quiet reported as %v", quiet, got)
	}
	if w := wireOf(); w != a {
		t.Fatalf("after %v went quiet media goes to %v, want %v", b, w, a)
	}
	if m := moves(); m[MoveNominated] != 1 || m[MoveQuiet] != 1 {
		t.Fatalf("moves %v, want one nominated and one quiet", m)
	}
	if l := c.Stats().Latched; l != 2 {
		t.Fatalf("latched %d, want 2", l)
	}
}
