package peer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/dtls/v3"
	"github.com/pion/rtp"
	"github.com/pion/srtp/v3"
)

// Call setup at the protocol floor: the DTLS handshake starts on the first
// authenticated check, not on the nomination (session.go, checked), and
// the first flight goes again on later checks until the client sends DTLS
// (feed.go, "The first flight").

// isClientHello reports whether b is a plaintext DTLS record carrying a
// ClientHello (RFC 6347 §4.1, §4.2.2).
func isClientHello(b []byte) bool {
	return len(b) >= 13+12 && b[0] == 22 && b[3] == 0 && b[4] == 0 && b[13] == 1
}

// earnings sends probe from c and returns what the server sent for it:
// the datagrams after probe's Binding response and before the response
// to sync (a check whose only earning is its response, sent once probe's
// response has come), in order. The read loop handles datagrams one at a
// time and writes what each earns before it reads the next, so nothing
// earned by probe can come after sync's response.
func earnings(t *testing.T, c *net.UDPConn, to netip.AddrPort, probe, sync []byte) (responded bool, earned [][]byte) {
	t.Helper()
	id := func(b []byte) []byte { return b[8:20] }
	if _, err := c.WriteToUDPAddrPort(probe, to); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	read := func() []byte {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("nothing from the server: %v", err)
		}
		return bytes.Clone(buf[:n])
	}
	for {
		b := read()
		if b[0] <= 3 && bytes.Equal(id(b), id(probe)) {
			responded = true
			break
		}
		earned = append(earned, b) // the handshake's own writes, before the response
	}
	if _, err := c.WriteToUDPAddrPort(sync, to); err != nil {
		t.Fatal(err)
	}
	for {
		b := read()
		if b[0] <= 3 && bytes.Equal(id(b), id(sync)) {
			return responded, earned
		}
		earned = append(earned, b)
	}
}

// waitClientHello reads from c until a ClientHello comes and returns it;
// it skips STUN.
func waitClientHello(t *testing.T, c *net.UDPConn) []byte {
	t.Helper()
	buf := make([]byte, 1500)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("no ClientHello: %v", err)
		}
		if isClientHello(buf[:n]) {
			return bytes.Clone(buf[:n])
		}
	}
}

// TestClientHelloOnFirstCheck: a session that is the DTLS client sends its
// ClientHello right after answering the first authenticated check, one
// without USE-CANDIDATE, and reports StateChecked then, not
// StateICEConnected, which waits for the nomination. A check that does not
// authenticate earns no ClientHello. Before, the handshake waited for the
// nomination.
func TestClientHelloOnFirstCheck(t *testing.T) {
	s := newServer(t)
	states := make(chan State, 8)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	sess := liteSession(t, s, func(c *SessionConfig) {
		c.Role = DTLSClient
		c.OnState = func(st State) { states <- st }
	})
	sess.setDTLSTimers(time.Hour, -1) // no retransmission by the timer
	bad, c := newSock(t), newSock(t)
	// A check with the wrong pwd from another address: dropped, nothing
	// sent.
	before := s.ep.Drops()[DropSTUNBadIntegrity]
	if _, err := bad.WriteToUDPAddrPort(check(t, user, "wrongpwdwrongpwdwrongpwd", false), s.addr()); err != nil {
		t.Fatal(err)
	}
	waitDrop(t, s.ep, DropSTUNBadIntegrity, before+1)

	first := check(t, user, pwd, false)
	if _, err := c.WriteToUDPAddrPort(first, s.addr()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if buf[0] > 3 || !bytes.Equal(buf[8:20], first[8:20]) {
		t.Fatalf("the first datagram back is not the check's Binding response: % x", buf[:min(n, 20)])
	}
	hello := waitClientHello(t, c)
	t.Logf("ClientHello of %d bytes after the first, non-nominating check", len(hello))
	select {
	case st := <-states:
		if st != StateChecked {
			t.Fatalf("first state %v, want %v", st, StateChecked)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no StateChecked")
	}
	select {
	case st := <-states:
		t.Fatalf("state %v before any nomination", st)
	default:
	}
	_ = bad.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := bad.Read(buf); err == nil {
		t.Fatalf("the unauthenticated check's sender got %d bytes", n)
	}
	// The nomination reports ICE connected and starts nothing more.
	_, earned := earnings(t, c, s.addr(), check(t, user, pwd, true), first)
	for _, b := range earned {
		if !bytes.Equal(b, hello) {
			t.Fatalf("the nomination earned a datagram other than the first ClientHello again: % x", b[:min(len(b), 16)])
		}
	}
	select {
	case st := <-states:
		if st != StateICEConnected {
			t.Fatalf("state %v after the nomination, want %v", st, StateICEConnected)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no StateICEConnected after the nomination")
	}
}

// TestOneClientHelloPerSession: whatever the checks, a session sends one
// ClientHello: its first authenticated check starts the handshake once; a
// replayed check (a transaction ID seen) earns its Binding response only,
// from the client's address or another; a fresh check from an address
// other than the selected one earns only its response; a fresh check from
// the selected address, while the client has sent no DTLS, earns the same
// datagram again, maxResends times at most; once the client has sent DTLS,
// none. The handshake library's own timer is set beyond the test.
func TestOneClientHelloPerSession(t *testing.T) {
	s := newServer(t)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	sess := liteSession(t, s, func(c *SessionConfig) {
		c.Role = DTLSClient
		c.HandshakeTimeout = time.Hour
	})
	sess.setDTLSTimers(time.Hour, -1) // resend at once, so that earnings sees it
	c, other := newSock(t), newSock(t)
	first := check(t, user, pwd, false)
	checkFrom(t, c, s.addr(), first)
	hello := waitClientHello(t, c)
	copies := 0
	tally := func(what string, earned [][]byte, max int) {
		t.Helper()
		for _, b := range earned {
			if !bytes.Equal(b, hello) {
				t.Fatalf("%s earned a datagram other than the ClientHello: % x", what, b[:min(len(b), 16)])
			}
		}
		if len(earned) > max {
			t.Fatalf("%s earned %d copies of the ClientHello, want at most %d", what, len(earned), max)
		}
		copies += len(earned)
	}
	for range 5 {
		ok, earned := earnings(t, c, s.addr(), first, first)
		if !ok {
			t.Fatal("a replayed check was not answered")
		}
		tally("a replayed check from the client's address", earned, 0)
		_, earned = earnings(t, other, s.addr(), first, first)
		tally("a replayed check from another address", earned, 0)
		_, earned = earnings(t, other, s.addr(), check(t, user, pwd, false), first)
		tally("a fresh check from another address", earned, 0)
	}
	for range maxResends + 3 {
		_, earned := earnings(t, c, s.addr(), check(t, user, pwd, false), first)
		tally("a fresh check from the selected address", earned, 1)
	}
	if copies != maxResends {
		t.Fatalf("%d copies of the ClientHello on later checks, want %d", copies, maxResends)
	}

	// Once the client has sent DTLS, no more, even with budget left.
	s2 := newServer(t)
	sess2 := liteSession(t, s2, func(c *SessionConfig) {
		c.Role = DTLSClient
		c.HandshakeTimeout = time.Hour
	})
	sess2.setDTLSTimers(time.Hour, -1)
	c2 := newSock(t)
	first = check(t, user, pwd, false)
	checkFrom(t, c2, s2.addr(), first)
	waitClientHello(t, c2)
	// A handshake record too short to parse, which DTLS discards
	// silently (RFC 6347 §4.1.2.7): it counts as the client's DTLS.
	if _, err := c2.WriteToUDPAddrPort([]byte{22, 254, 253, 0, 0, 0, 0, 0, 0, 0, 9, 0, 1, 0}, s2.addr()); err != nil {
		t.Fatal(err)
	}
	_, earned := earnings(t, c2, s2.addr(), check(t, user, pwd, false), first)
	if len(earned) != 0 {
		t.Fatalf("a fresh check after the client's DTLS earned %d datagrams", len(earned))
	}
}

// TestResendWaitsForDTLS: the first flight sent again on a check waits
// resendDelay, and goes only if no DTLS from the client came meanwhile (a
// client that had it answers right behind its check); without the
// client's DTLS it goes. The wait is the test's, long enough that the
// client's datagram sent right after the check is always inside it.
func TestResendWaitsForDTLS(t *testing.T) {
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	const wait = 300 * time.Millisecond
	for _, answered := range []bool{true, false} {
		s := newServer(t)
		sess := liteSession(t, s, func(c *SessionConfig) {
			c.Role = DTLSClient
			c.HandshakeTimeout = time.Hour
		})
		sess.setDTLSTimers(time.Hour, wait)
		c := newSock(t)
		checkFrom(t, c, s.addr(), check(t, user, pwd, false))
		hello := waitClientHello(t, c)
		if _, err := c.WriteToUDPAddrPort(check(t, user, pwd, false), s.addr()); err != nil {
			t.Fatal(err)
		}
		if answered {
			// The client's answer, right behind its check: a handshake
			// record DTLS discards, as the client's own DTLS counts.
			if _, err := c.WriteToUDPAddrPort([]byte{22, 254, 253, 0, 0, 0, 0, 0, 0, 0, 9, 0, 1, 0}, s.addr()); err != nil {
				t.Fatal(err)
			}
		}
		copies := 0
		buf := make([]byte, 1500)
		_ = c.SetReadDeadline(time.Now().Add(wait + 500*time.Millisecond))
		for {
			n, err := c.Read(buf)
			if err != nil {
				break
			}
			if bytes.Equal(buf[:n], hello) {
				copies++
			}
		}
		if want := map[bool]int{true: 0, false: 1}[answered]; copies != want {
			t.Fatalf("client answered %v: %d copies of the ClientHello after the check, want %d", answered, copies, want)
		}
	}
}

// dtlsOnly is a UDP socket that a DTLS peer reads: it returns only the
// DTLS datagrams (first byte 20–63, RFC 7983) from the server.
type dtlsOnly struct {
	*net.UDPConn
	server netip.AddrPort
}

func (c dtlsOnly) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, a, err := c.ReadFromUDPAddrPort(b)
		if err != nil {
			return 0, nil, err
		}
		if a == c.server && n > 0 && b[0] >= 20 && b[0] <= 63 {
			return n, net.UDPAddrFromAddrPort(a), nil
		}
	}
}

// dtlsServerPeer runs a DTLS server on c, the client's side of a session
// that is the DTLS client, presenting cert, and returns its SRTP context
// for what it sends.
func dtlsServerPeer(t *testing.T, c *net.UDPConn, server netip.AddrPort, s *server) *srtp.Context {
	t.Helper()
	conn, err := dtls.ServerWithOptions(dtlsOnly{c, server}, net.UDPAddrFromAddrPort(server),
		dtls.WithCertificates(s.cert),
		dtls.WithSRTPProtectionProfiles(dtls.SRTP_AEAD_AES_128_GCM),
		dtls.WithExtendedMasterSecret(dtls.RequireExtendedMasterSecret),
		dtls.WithClientAuth(dtls.RequireAnyClientCert),
		dtls.WithInsecureSkipVerifyHello(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		t.Fatalf("the peer's DTLS handshake: %v", err)
	}
	state, ok := conn.ConnectionState()
	if !ok {
		t.Fatal("no DTLS state")
	}
	cfg := srtp.Config{Profile: srtp.ProtectionProfileAeadAes128Gcm}
	if err := cfg.ExtractSessionKeysFromDTLS(&state, false); err != nil {
		t.Fatal(err)
	}
	local, err := srtp.CreateContext(cfg.Keys.LocalMasterKey, cfg.Keys.LocalMasterSalt, cfg.Profile)
	if err != nil {
		t.Fatal(err)
	}
	return local
}

// TestMediaBeforeNomination: a client that has sent authenticated checks
// but no nomination completes the DTLS handshake and its SRTP is taken, as
// Chromium's is below ~48 ms of RTT (its nomination comes on a later check,
// after the handshake); SRTP from an address no authenticated check came
// from is dropped (unknown_address); and the first nomination, from
// another address, still moves the session's media there, although the
// client's media began before it. Before, nothing started until the
// nomination.
func TestMediaBeforeNomination(t *testing.T) {
	s := newServer(t)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	connected := make(chan State, 8)
	sess := liteSession(t, s, func(c *SessionConfig) {
		c.Role = DTLSClient
		c.OnState = func(st State) {
			if st == StateConnected || st == StateICEConnected {
				connected <- st
			}
		}
	})
	c, stranger, nominee := newSock(t), newSock(t), newSock(t)
	checkFrom(t, c, s.addr(), check(t, user, pwd, false))
	srtpOut := dtlsServerPeer(t, c, s.addr(), s)
	select {
	case st := <-connected:
		if st != StateConnected {
			t.Fatalf("state %v, want %v before any nomination", st, StateConnected)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not connect without a nomination")
	}
	seq := uint16(0)
	next := func() []byte {
		seq++
		hdr := rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: uint32(seq) * 960, SSRC: 0xc1}
		plain, err := (&rtp.Packet{Header: hdr, Payload: []byte{0xfc, 1, 2, 3}}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		out, err := srtpOut.EncryptRTP(nil, plain, &hdr)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := s.ep.Drops()[DropUnknownAddress]
	if _, err := stranger.WriteToUDPAddrPort(next(), s.addr()); err != nil {
		t.Fatal(err)
	}
	waitDrop(t, s.ep, DropUnknownAddress, before+1)
	if _, err := c.WriteToUDPAddrPort(next(), s.addr()); err != nil {
		t.Fatal(err)
	}
	_ = sess.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, err := sess.ReadRTP(buf)
	if err != nil {
		t.Fatalf("SRTP from the checked address before any nomination was not taken: %v (drops %v)", err, s.ep.Drops())
	}
	var p rtp.Packet
	if err := p.Unmarshal(buf[:n]); err != nil || p.SequenceNumber != seq {
		t.Fatalf("read packet seq %d (%v), want the one sent from the checked address, %d", p.SequenceNumber, err, seq)
	}
	if !sess.media.Load() {
		t.Fatal("the client's media has not begun")
	}
	// The first nomination comes from another address: the media goes
	// there.
	checkFrom(t, nominee, s.addr(), check(t, user, pwd, true))
	if got := sess.RemoteAddr(); got != sockAddr(nominee) {
		t.Fatalf("after the first nomination, from %v, the session sends to %v", sockAddr(nominee), got)
	}
	select {
	case st := <-connected:
		if st != StateICEConnected {
			t.Fatalf("state %v, want %v", st, StateICEConnected)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no StateICEConnected after the nomination")
	}
	// A later nomination from the first address is a candidate only (the
	// media began and the client nominated): it moves nothing. (The
	// peer's DTLS reads c: a fresh check from the nominee, answered after
	// it, says the read loop has handled it.)
	if _, err := c.WriteToUDPAddrPort(check(t, user, pwd, true), s.addr()); err != nil {
		t.Fatal(err)
	}
	checkFrom(t, nominee, s.addr(), check(t, user, pwd, false))
	if got := sess.RemoteAddr(); got != sockAddr(nominee) {
		t.Fatalf("a second nomination moved the media to %v before the client's SRTP came from there", got)
	}
}

// TestFlightInterval: the handshake's retransmission timeout is 2.5 times
// the time from the answer to the first authenticated check, within
// [minFlightInterval, maxFlightInterval]; without the answer's time it is
// RFC 6347's 1 s.
func TestFlightInterval(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answered time.Duration // before the first check; 0: not told
		want     time.Duration
	}{
		{"not told", 0, time.Second},
		{"50 ms path", 60 * time.Millisecond, 150 * time.Millisecond},
		{"loopback", time.Millisecond, minFlightInterval},
		{"slow client", 500 * time.Millisecond, maxFlightInterval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Session{}
			at := time.Unix(100, 0)
			if tc.answered > 0 {
				s.Answered(at.Add(-tc.answered))
			}
			s.checkAt.Store(at.UnixNano())
			if got := s.flightInterval(); got != tc.want {
				t.Fatalf("flight interval %v, want %v", got, tc.want)
			}
			if rtt, ok := s.SetupRTT(); ok != (tc.answered > 0) || rtt != tc.answered {
				t.Fatalf("SetupRTT %v %v, want %v", rtt, ok, tc.answered)
			}
		})
	}
}

// TestPacing: the handshake's retransmissions go after the timeout, then
// every twice it, at most maxRetransmits times per flight; a burst's
// writes share its fate; DTLS from the client makes the next burst a new
// flight, which goes at once and starts the schedule again.
func TestPacing(t *testing.T) {
	const T = 100 * time.Millisecond
	var p pacing
	t0 := time.Unix(100, 0)
	if p.suppress(t0) {
		t.Fatal("a write before start was held back")
	}
	p = pacing{}
	p.start(T)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if p.suppress(at(0)) || p.suppress(at(time.Millisecond)) {
		t.Fatal("the first flight was held back")
	}
	// The library's ticks, every T (a little late, as timers are).
	var went []int
	for k := 1; k <= 40; k++ {
		now := at(time.Duration(k)*T + time.Millisecond)
		if !p.suppress(now) {
			went = append(went, k)
			if p.suppress(now.Add(time.Millisecond)) {
				t.Fatalf("tick %d: the burst's second datagram was held back, its first went", k)
			}
		} else if !p.suppress(now.Add(time.Millisecond)) {
			t.Fatalf("tick %d: the burst's second datagram went, its first was held back", k)
		}
	}
	want := []int{1}
	for k := 3; len(want) < maxRetransmits; k += 2 {
		want = append(want, k)
	}
	if fmt.Sprint(went) != fmt.Sprint(want) {
		t.Fatalf("retransmissions at ticks %v, want %v", went, want)
	}
	// The client answers: the next burst is a new flight, and its first
	// retransmission waits one timeout again.
	p.heard()
	base := at(41 * T)
	if p.suppress(base) {
		t.Fatal("a new flight after the client's DTLS was held back")
	}
	if p.suppress(base.Add(T)) {
		t.Fatal("the new flight's first retransmission was held back")
	}
}
