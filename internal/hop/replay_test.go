package hop

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v4"
)

// TestReplayedNominationFromSecondPort: a nominating check captured from a
// client and replayed byte for byte from another port of the client's IP
// (same Wi-Fi, same CGNAT) while the client is live moves nothing in Conn:
// every datagram is reported under the address it came from, and writes to
// the client's address go to that address. Whether the session's media
// follows the second port is internal/peer's decision ("Path selection":
// only the client's own SRTP or SRTCP from there moves it). Conn used to
// latch on such a check on its own, behind the endpoint's back, and keep
// the media on the replayer's port while the replayer kept it live.
func TestReplayedNominationFromSecondPort(t *testing.T) {
	sock := listen(t)
	c, err := NewConn(sock, ConnConfig{Advertise: netip.MustParseAddrPort("127.0.0.1:3478")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	relay := listen(t)
	defer relay.Close()
	to := net.UDPAddrFromAddrPort(c.SocketAddr())
	const pwd = "the-session-pwd-of-24-chars"
	client := netip.MustParseAddrPort("198.51.100.9:40000")
	replayer := netip.MustParseAddrPort("198.51.100.9:50000")
	build := func(nominate bool) []byte {
		s := []stun.Setter{stun.TransactionID, stun.BindingRequest, stun.NewUsername("srvufrag:cli")}
		if nominate {
			s = append(s, stun.RawAttribute{Type: stun.AttrUseCandidate})
		}
		m, err := stun.Build(append(s, stun.NewShortTermIntegrity(pwd), stun.Fingerprint)...)
		if err != nil {
			t.Fatal(err)
		}
		return m.Raw
	}
	captured := build(true)
	rtp := []byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}
	deliver := func(from netip.AddrPort, payload []byte) {
		t.Helper()
		if _, err := relay.WriteTo(append(AppendHeader(nil, TypeData, from), payload...), to); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, got, err := c.ReadFromAddrPort(make([]byte, 1500))
		if err != nil {
			t.Fatal(err)
		}
		if got != from {
			t.Fatalf("a datagram from %v is reported from %v", from, got)
		}
	}
	wire := func(tag string, dst netip.AddrPort) netip.AddrPort {
		t.Helper()
		if _, err := c.WriteToAddrPort([]byte(tag), dst); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1500)
		for {
			_ = relay.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, _, err := relay.ReadFrom(buf)
			if err != nil {
				t.Fatal(err)
			}
			if _, named, p, _ := ParseHeader(buf[:n]); string(p) == tag {
				return named
			}
		}
	}
	deliver(client, captured)
	for range 5 {
		deliver(client, rtp)
	}
	deliver(replayer, captured) // the replay
	deliver(client, rtp)
	if w := wire("m1", client); w != client {
		t.Errorf("after the replay, a write to the client goes to %v", w)
	}
	plain := build(false)
	for range 5 {
		deliver(replayer, rtp)
		deliver(replayer, captured)
		deliver(client, rtp)
		deliver(client, plain)
	}
	if w := wire("m2", client); w != client {
		t.Errorf("with the replayer's port live, a write to the client goes to %v", w)
	}
	if w := wire("m3", replayer); w != replayer {
		t.Errorf("a write to the second port goes to %v", w)
	}
}
