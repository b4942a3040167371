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
	c, err := NewConn(sock, ConnConfig{Advertise: netip.MustParseAddrPort("127.0.0.1:3478")})
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
	}{
		{"a first check without the pwd fixes nothing", otherIP, check("guessed-password-xxxxxxxx"), otherIP, 0},
		{"first check fixes the address", oldAddr, check(pwd), oldAddr, 0},
		{"an authenticated check from another IP is another path, not a rebinding", otherIP, check(pwd), otherIP, 0},
		{"media from a new address alone does not move it", newAddr, rtp, newAddr, 0},
		{"a check without the pwd does not move it", newAddr, check("guessed-password-xxxxxxxx"), newAddr, 0},
		{"an authenticated check moves it", newAddr, check("the-session-pwd-of-24-chars"), oldAddr, 1},
		{"later media from the new address is the session's", newAddr, rtp, oldAddr, 1},
	}
	for _, st := range steps {
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
	// A check from the old address again ends the latch: writes go there.
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
