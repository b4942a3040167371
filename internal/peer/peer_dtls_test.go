package peer

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/pion/rtp"
)

// TestWrongFingerprint: a client whose certificate matches no fingerprint
// of the offer fails DTLS.
func TestWrongFingerprint(t *testing.T) {
	s := newServer(t)
	c := newClient(t, true)
	_, parts := connect(t, s, c, func(sc *SessionConfig) {
		fp := sc.Fingerprints[0]
		fp.Digest = append([]byte(nil), fp.Digest...)
		fp.Digest[0] ^= 0xff
		sc.Fingerprints = []Fingerprint{fp}
	})
	waitState(t, parts, StateDTLSFailed)
}

// TestHandshakeTimeout: a client that nominates and never starts DTLS
// fails the session's handshake after HandshakeTimeout.
func TestHandshakeTimeout(t *testing.T) {
	s := newServer(t)
	states := make(chan State, 8)
	liteSession(t, s, func(c *SessionConfig) {
		c.HandshakeTimeout = 100 * time.Millisecond
		c.OnState = func(st State) { states <- st }
	})
	checkFrom(t, newSock(t), s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	for {
		select {
		case st := <-states:
			if st == StateDTLSFailed {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the handshake did not time out")
		}
	}
}

// TestFingerprintStrongestHash: the client's certificate is checked
// against the fingerprint of the strongest hash function offered; MD5 is
// not accepted.
func TestFingerprintStrongestHash(t *testing.T) {
	s := newServer(t)
	der := s.cert.Certificate[0]
	good256 := sha256.Sum256(der)
	good1 := sha1.Sum(der)
	goodMD5 := md5.Sum(der)
	bad := func(d []byte) []byte { d = bytes.Clone(d); d[0] ^= 0xff; return d }
	cases := []struct {
		name string
		fps  []Fingerprint
		ok   bool
	}{
		{"sha-256", []Fingerprint{{"sha-256", good256[:]}}, true},
		{"SHA-256 upper case", []Fingerprint{{"SHA-256", good256[:]}}, true},
		{"sha-1", []Fingerprint{{"sha-1", good1[:]}}, true},
		{"md5 only", []Fingerprint{{"md5", goodMD5[:]}}, false},
		{"wrong sha-256, right md5", []Fingerprint{{"sha-256", bad(good256[:])}, {"md5", goodMD5[:]}}, false},
		{"wrong sha-256, right sha-1", []Fingerprint{{"sha-1", good1[:]}, {"sha-256", bad(good256[:])}}, false},
		{"right sha-256, wrong sha-1", []Fingerprint{{"sha-1", bad(good1[:])}, {"sha-256", good256[:]}}, true},
		{"unknown hash", []Fingerprint{{"sha3-256", good256[:]}}, false},
	}
	for _, tc := range cases {
		sess := &Session{cfg: SessionConfig{Fingerprints: tc.fps}}
		err := sess.verifyCertificate([][]byte{der}, nil)
		if (err == nil) != tc.ok {
			t.Errorf("%s: verify %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestSRTPReplay: an SRTP packet the session already decrypted, sent again
// from the client's address, is dropped as srtp_auth (the replay window,
// RFC 3711 §3.3.2).
func TestSRTPReplay(t *testing.T) {
	s := newServer(t)
	c := newClient(t, false)
	p := newPath(t, s.addr(), c)
	sess, _ := connectPath(t, s, c, p)
	var wg sync.WaitGroup
	wg.Add(1)
	go echoRTP(sess, &wg)
	sendUntilEcho(t, c, 5)
	captured := p.lastRTP.Load()
	if captured == nil {
		t.Fatal("no SRTP went through the path")
	}
	before := s.ep.Drops()[DropSRTPAuth]
	if _, err := p.back.Load().WriteToUDPAddrPort(*captured, s.addr()); err != nil {
		t.Fatal(err)
	}
	waitDrop(t, s.ep, DropSRTPAuth, before+1)
	_ = sess.Close()
	wg.Wait()
}

// TestEarlySRTPBounded: SRTP from the selected address before the DTLS
// handshake gave keys is kept up to earlyMax packets; the rest are dropped
// as srtp_not_ready.
func TestEarlySRTPBounded(t *testing.T) {
	s := newServer(t)
	liteSession(t, s)
	c := newSock(t)
	checkFrom(t, c, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	pkt := make([]byte, 40)
	pkt[0], pkt[1] = 0x80, 111
	for range earlyMax + 1 {
		if _, err := c.WriteToUDPAddrPort(pkt, s.addr()); err != nil {
			t.Fatal(err)
		}
	}
	waitDrop(t, s.ep, DropSRTPNotReady, 1)
	// Sync on the read loop, then check that only the one past earlyMax
	// was dropped.
	before := s.ep.Drops()[DropUnknownPacket]
	sendRaw(t, s.addr(), []byte{70, 0, 0}, false)
	waitDrop(t, s.ep, DropUnknownPacket, before+1)
	if n := s.ep.Drops()[DropSRTPNotReady]; n != 1 {
		t.Fatalf("srtp_not_ready %d, want 1 (the packet past the %d kept)", n, earlyMax)
	}
}

// TestCloseRacesHandshake: Close right after the nominating check, while
// the session's goroutine starts the DTLS handshake, returns, leaks no
// goroutine (TestMain's goleak) and races nothing (-race).
func TestCloseRacesHandshake(t *testing.T) {
	s := newServer(t)
	c := newSock(t)
	for i := range 100 {
		sess := liteSession(t, s, func(sc *SessionConfig) {
			if i%2 == 0 {
				sc.Role = DTLSClient // sends its ClientHello at once
			}
		})
		checkFrom(t, c, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
		if err := sess.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestQueuesFull: DTLS that nobody reads yet (from an address the session
// learned, before its handshake has started) queues up to dtlsQueueBytes,
// then drops as dtls_queue_full; RTP that the media reader does not take
// drops as rtp_queue_full past SessionConfig.RTPQueue.
func TestQueuesFull(t *testing.T) {
	t.Run("dtls", func(t *testing.T) {
		s := newServer(t)
		sess := liteSession(t, s)
		// The address is learned as from a check, but the check's
		// handshake start is left out, so nothing reads the queue.
		c := newSock(t)
		s.ep.learn(sess, sockAddr(c))
		rec := make([]byte, 1200)
		rec[0], rec[1], rec[2] = 22, 254, 253
		for i := 0; s.ep.Drops()[DropDTLSQueueFull] == 0; i++ {
			if i == 5000 {
				t.Fatalf("no dtls_queue_full after %d records of %d bytes", i, len(rec))
			}
			if _, err := c.WriteToUDPAddrPort(rec, s.addr()); err != nil {
				t.Fatal(err)
			}
			if i%64 == 63 {
				time.Sleep(time.Millisecond) // let the socket buffer drain
			}
		}
		sess.dtls.mu.Lock()
		held := sess.dtls.qBytes
		sess.dtls.mu.Unlock()
		if held > dtlsQueueBytes || held < dtlsQueueBytes-len(rec) {
			t.Fatalf("the queue holds %d bytes when full, want about %d", held, dtlsQueueBytes)
		}
	})
	t.Run("rtp", func(t *testing.T) {
		s := newServer(t)
		c := newClient(t, false)
		_, parts := connect(t, s, c, func(sc *SessionConfig) { sc.RTPQueue = 2 })
		waitState(t, parts, StateConnected)
		for seq := uint16(0); s.ep.Drops()[DropRTPQueueFull] == 0; seq++ {
			if seq == 1000 {
				t.Fatal("no rtp_queue_full with nobody reading")
			}
			if err := c.track.WriteRTP(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq}, Payload: []byte{1}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
	})
}
