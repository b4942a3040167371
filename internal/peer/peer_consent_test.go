package peer

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/stun/v4"
)

// connectCuttable connects a client (with a data channel if data) to a
// server whose consent tick is 20 ms, through a path the test can cut
// (p.cut), with the session's disconnected and failed timeouts, and
// waits until the session is connected.
func connectCuttable(t *testing.T, data bool, disconnected, failed time.Duration) (*server, *path, *client, *sessionParts) {
	t.Helper()
	s := newServer(t, func(c *Config) { c.ConsentTick = 20 * time.Millisecond })
	c := newClient(t, data)
	p := newPath(t, s.addr(), c)
	_, parts := connectPath(t, s, c, p, func(sc *SessionConfig) {
		sc.DisconnectedTimeout, sc.FailedTimeout = disconnected, failed
	})
	return s, p, c, parts
}

// TestConsent: a connected client that goes silent is disconnected, back
// when its traffic resumes, and failed when it stays silent.
func TestConsent(t *testing.T) {
	_, p, c, parts := connectCuttable(t, false, 300*time.Millisecond, 3*time.Second)
	p.cut.Store(true)
	waitState(t, parts, StateDisconnected)
	p.cut.Store(false)
	if err := c.track.WriteRTP(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: 1}, Payload: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, parts, StateICEConnected)
	p.cut.Store(true)
	waitState(t, parts, StateDisconnected)
	waitState(t, parts, StateFailed)
}

// TestBadSTUN: checks that do not authenticate are dropped and counted by
// reason, and a good one is answered with the sender's address, signed.
func TestBadSTUN(t *testing.T) {
	var counted [NumDropReasons]atomic.Uint64
	s := newServer(t, func(c *Config) { c.OnDrop = func(r DropReason) { counted[r].Add(1) } })
	sess, err := s.ep.NewSession(SessionConfig{LocalUfrag: "local", LocalPwd: "localpwdlocalpwdlocalpwd", RemoteUfrag: "remote",
		Role: DTLSServer, Certificate: s.cert, Fingerprints: []Fingerprint{s.fp}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := s.ep.NewSession(SessionConfig{LocalUfrag: "local", LocalPwd: "x", RemoteUfrag: "y", Role: DTLSServer, Certificate: s.cert, Fingerprints: []Fingerprint{s.fp}}); err == nil {
		t.Fatal("a second session took the same ufrag")
	}
	cases := []struct {
		name string
		b    []byte
		want DropReason
	}{
		{"garbage", []byte{0, 1, 0, 0, 1, 2, 3}, DropSTUNMalformed},
		{"unknown ufrag", bindingRequest(t, "nobody:remote", "localpwdlocalpwdlocalpwd", true), DropSTUNUnknownUfrag},
		{"wrong remote ufrag", bindingRequest(t, "local:other", "localpwdlocalpwdlocalpwd", true), DropSTUNBadUsername},
		{"no colon", bindingRequest(t, "local", "localpwdlocalpwdlocalpwd", true), DropSTUNBadUsername},
		{"wrong pwd", bindingRequest(t, "local:remote", "wrongpwdwrongpwdwrongpwd", true), DropSTUNBadIntegrity},
		{"no fingerprint", bindingRequest(t, "local:remote", "localpwdlocalpwdlocalpwd", false), DropSTUNBadFingerprint},
		{"indication", mustBuild(t, stun.TransactionID, stun.NewType(stun.MethodBinding, stun.ClassIndication), stun.Fingerprint), DropSTUNIndication},
		{"response", mustBuild(t, stun.TransactionID, stun.BindingSuccess, stun.Fingerprint), DropSTUNNotRequest},
		{"DTLS from a stranger", []byte{22, 254, 253, 0, 0}, DropUnknownAddress},
		{"SRTP from a stranger", make([]byte, 40), DropUnknownPacket},
	}
	cases[len(cases)-1].b[0] = 0x80
	cases[len(cases)-1].want = DropUnknownAddress
	for _, tc := range cases {
		before := s.ep.Drops()[tc.want]
		sendRaw(t, s.addr(), tc.b, false)
		waitDrop(t, s.ep, tc.want, before+1)
		// The endpoint counts a drop before it calls OnDrop, so the
		// callback's count may trail Drops() by a moment: wait for it.
		deadline := time.Now().Add(5 * time.Second)
		for counted[tc.want].Load() < before+1 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := counted[tc.want].Load(); got != before+1 {
			t.Fatalf("%s: OnDrop counted %d, want %d", tc.name, got, before+1)
		}
	}
	sendRaw(t, s.addr(), []byte{70, 0, 0}, false)
	waitDrop(t, s.ep, DropUnknownPacket, 1)

	// A good check is answered, signed with the local pwd.
	m := sendRaw(t, s.addr(), bindingRequest(t, "local:remote", "localpwdlocalpwdlocalpwd", true), true)
	if m.Type != stun.BindingSuccess {
		t.Fatalf("reply %v", m.Type)
	}
	if err := stun.NewShortTermIntegrity("localpwdlocalpwdlocalpwd").Check(m); err != nil {
		t.Fatalf("reply integrity: %v", err)
	}
	if err := stun.Fingerprint.Check(m); err != nil {
		t.Fatalf("reply fingerprint: %v", err)
	}
}

// TestDTLSGarbageKeepsNoConsent: datagrams in the DTLS range from the
// client's address that do not authenticate do not refresh consent: the
// session still fails once the client's real traffic stops (RFC 7675).
func TestDTLSGarbageKeepsNoConsent(t *testing.T) {
	s, p, _, parts := connectCuttable(t, true, 200*time.Millisecond, 600*time.Millisecond)
	p.cut.Store(true)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// From the client's address as the server sees it (the path's
		// back socket): an application data record with a bad MAC, and
		// a handshake record.
		garbage := [][]byte{
			{23, 254, 253, 0, 1, 0, 0, 0, 0, 0, 9, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8},
			{22, 254, 253, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0},
		}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_, _ = p.back.Load().WriteToUDPAddrPort(garbage[i%2], s.addr())
		}
	}()
	waitState(t, parts, StateFailed)
	close(stop)
	wg.Wait()
}

// TestBadCheckTeachesNothing: a nominating check with a bad
// MESSAGE-INTEGRITY or FINGERPRINT from a new address is dropped without
// teaching that address, moving the session or refreshing its consent.
func TestBadCheckTeachesNothing(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	victim := newSock(t)
	checkFrom(t, victim, s.addr(), check(t, user, pwd, true))
	seen := sess.lastSeen.Load()
	badPwd := check(t, user, "wrongpwdwrongpwdwrongpwd", true)
	badFP := check(t, user, pwd, true)
	badFP[len(badFP)-1] ^= 0xff // the FINGERPRINT's CRC
	for _, tc := range []struct {
		b    []byte
		want DropReason
	}{{badPwd, DropSTUNBadIntegrity}, {badFP, DropSTUNBadFingerprint}} {
		attacker := newSock(t)
		before := s.ep.Drops()[tc.want]
		if _, err := attacker.WriteToUDPAddrPort(tc.b, s.addr()); err != nil {
			t.Fatal(err)
		}
		waitDrop(t, s.ep, tc.want, before+1)
		if s.ep.session(sockAddr(attacker)) != nil {
			t.Fatalf("%v: the check taught its address", tc.want)
		}
		if got := sess.RemoteAddr(); got != sockAddr(victim) {
			t.Fatalf("%v: the check moved the session to %v", tc.want, got)
		}
		if sess.lastSeen.Load() != seen {
			t.Fatalf("%v: the check refreshed consent", tc.want)
		}
		// And DTLS from it is still from a stranger.
		before = s.ep.Drops()[DropUnknownAddress]
		if _, err := attacker.WriteToUDPAddrPort([]byte{22, 254, 253, 0, 0}, s.addr()); err != nil {
			t.Fatal(err)
		}
		waitDrop(t, s.ep, DropUnknownAddress, before+1)
	}
}
