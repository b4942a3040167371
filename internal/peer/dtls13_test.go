package peer

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	dtls4 "github.com/pion/dtls/v4"
	"github.com/pion/dtls/v4/pkg/crypto/selfsign"
	"github.com/pion/dtls/v4/pkg/protocol"
)

// goneServer is the socket of a DTLS 1.3 server peer that goes away as
// it takes the client's last flight: from the first encrypted record it
// reads (a unified header, RFC 9147 §4: first bits 001) it sends nothing
// more, so that flight never gets its ACK. It counts the bursts of
// records in the handshake epoch (2, the unified header's low bits 10) it
// reads, the client's last flight: datagrams that come within burstGap of
// the one before are one burst, the flight sent once. (An ACK the client
// sends in epoch 3, of a record the server sent before it went, is not
// counted.)
type goneServer struct {
	dtlsOnly
	burstGap time.Duration
	gone     atomic.Bool
	bursts   atomic.Int64
	last     time.Time // the reader's alone
}

func (c *goneServer) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := c.dtlsOnly.ReadFrom(b)
	if err == nil && n > 0 && b[0]&0xe0 == 0x20 {
		c.gone.Store(true)
	}
	if err == nil && n > 0 && b[0]&0xe0 == 0x20 && b[0]&0x03 == 2 {
		now := time.Now()
		if now.Sub(c.last) > c.burstGap {
			c.bursts.Add(1)
		}
		c.last = now
	}
	return n, a, err
}

func (c *goneServer) WriteTo(b []byte, a net.Addr) (int, error) {
	if c.gone.Load() {
		return len(b), nil
	}
	return c.dtlsOnly.WriteTo(b, a)
}

// TestDTLS13LastFlightBounded: as the DTLS 1.3 client the session sends
// its last flight again until the server acknowledges it (RFC 9147
// §5.8.3), after its own handshake has completed; to a server that went
// away it goes at most maxRetransmits more times, as any flight (feed.go,
// "The DTLS 1.3 client's last flight"), not every retransmission timeout
// for as long as the session lives (pion/dtls v4 with its backoff off:
// 83 copies in 100 timeouts).
func TestDTLS13LastFlightBounded(t *testing.T) {
	s := newServer(t, func(c *Config) { c.DTLSVersion = DTLS13 })
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	const interval = 10 * time.Millisecond
	sess := liteSession(t, s, func(c *SessionConfig) { c.Role = DTLSClient })
	sess.setDTLSTimers(interval, -1)
	c := newSock(t)
	checkFrom(t, c, s.addr(), check(t, user, pwd, false))
	peer := &goneServer{dtlsOnly: dtlsOnly{c, s.addr()}, burstGap: interval / 4}
	conn, err := dtls4.Server(peer, net.UDPAddrFromAddrPort(s.addr()),
		dtls4.WithCertificates(s.cert), dtls4.WithSRTPProtectionProfiles(srtpProfiles...),
		dtls4.WithClientAuth(dtls4.RequireAnyClientCert), dtls4.WithInsecureSkipVerifyHello(true),
		dtls4.WithMinVersion(protocol.Version1_3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		t.Fatalf("the peer's handshake: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for sess.DTLSVersion() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if v := sess.DTLSVersion(); v != DTLS13 {
		t.Fatalf("negotiated %q, want 1.3", v)
	}
	// 100 timeouts: a flight sent every timeout goes 100 times. (The
	// flight's first sending, and a retransmission or two before its
	// handshake ended, are counted too: the bound is only looser.)
	time.Sleep(100 * interval)
	if n := peer.bursts.Load(); n > 1+maxRetransmits {
		t.Fatalf("the session sent its last flight %d times in %v, unanswered; want at most %d (once, and %d retransmissions)",
			n, 100*interval, 1+maxRetransmits, maxRetransmits)
	}
}

// TestFingerprintDTLS13: with DTLS 1.3 (pion/dtls v4's own handshake
// code, not the 1.2 one TestWrongFingerprint runs) the peer's certificate
// is still checked against the offer's fingerprint, in either DTLS role: a
// peer that presents another certificate fails the handshake, one that
// presents the offered one connects.
func TestFingerprintDTLS13(t *testing.T) {
	other, err := selfsign.GenerateSelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		role  DTLSRole
		wrong bool
		want  State
	}{
		{"client, offered certificate", DTLSClient, false, StateConnected},
		{"client, another certificate", DTLSClient, true, StateDTLSFailed},
		{"server, offered certificate", DTLSServer, false, StateConnected},
		{"server, another certificate", DTLSServer, true, StateDTLSFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, func(c *Config) { c.DTLSVersion = DTLS13 })
			states := make(chan State, 16)
			liteSession(t, s, func(c *SessionConfig) {
				c.Role = tc.role
				c.OnState = func(st State) { states <- st }
			})
			c := newSock(t)
			checkFrom(t, c, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
			cert := s.cert // the offer's fingerprint is s.fp
			if tc.wrong {
				cert = other
			}
			opts := []dtls4.Option{dtls4.WithCertificates(cert), dtls4.WithInsecureSkipVerify(true),
				dtls4.WithSRTPProtectionProfiles(srtpProfiles...), dtls4.WithMinVersion(protocol.Version1_3)}
			var conn *dtls4.Conn
			raddr := net.UDPAddrFromAddrPort(s.addr())
			if tc.role == DTLSClient {
				sopts := []dtls4.ServerOption{dtls4.WithClientAuth(dtls4.RequireAnyClientCert), dtls4.WithInsecureSkipVerifyHello(true)}
				for _, o := range opts {
					sopts = append(sopts, o)
				}
				conn, err = dtls4.Server(dtlsOnly{c, s.addr()}, raddr, sopts...)
			} else {
				copts := make([]dtls4.ClientOption, 0, len(opts))
				for _, o := range opts {
					copts = append(copts, o)
				}
				conn, err = dtls4.Client(dtlsOnly{c, s.addr()}, raddr, copts...)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = conn.HandshakeContext(ctx)
			}()
			timeout := time.After(10 * time.Second)
			for {
				select {
				case st := <-states:
					if st == StateConnected || st == StateDTLSFailed {
						if st != tc.want {
							t.Fatalf("state %v, want %v", st, tc.want)
						}
						return
					}
				case <-timeout:
					t.Fatalf("neither connected nor failed; want %v", tc.want)
				}
			}
		})
	}
}

// silentClient is the socket of a DTLS 1.3 client peer that sends its
// ClientHello and nothing more (it went away, or all it sends is lost):
// the server's flight is never answered. It counts the ServerHellos it
// reads, one per sending of the flight.
type silentClient struct {
	dtlsOnly
	writes       atomic.Int64
	serverHellos atomic.Int64
}

func (c *silentClient) WriteTo(b []byte, a net.Addr) (int, error) {
	if c.writes.Add(1) > 1 {
		return len(b), nil
	}
	return c.dtlsOnly.WriteTo(b, a)
}

func (c *silentClient) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := c.dtlsOnly.ReadFrom(b)
	if err == nil && isServerHello(b[:n]) {
		c.serverHellos.Add(1)
	}
	return n, a, err
}

// TestDTLS13FlightBounded: as the DTLS 1.3 server, the session sends its
// flight (ServerHello to Finished) to a client that never answers it once
// and at most maxRetransmits more times (feed.go, "Retransmission
// pacing"), as with DTLS 1.2: pion/dtls v4's DTLS 1.3 handshake
// retransmits on the same timer the pacing holds back.
func TestDTLS13FlightBounded(t *testing.T) {
	s := newServer(t, func(c *Config) { c.DTLSVersion = DTLS13 })
	const interval = 10 * time.Millisecond
	sess := liteSession(t, s)
	sess.setDTLSTimers(interval, -1)
	c := newSock(t)
	checkFrom(t, c, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	peer := &silentClient{dtlsOnly: dtlsOnly{c, s.addr()}}
	conn, err := dtls4.Client(peer, net.UDPAddrFromAddrPort(s.addr()), dtls4.WithCertificates(s.cert), dtls4.WithInsecureSkipVerify(true),
		dtls4.WithSRTPProtectionProfiles(srtpProfiles...), dtls4.WithMinVersion(protocol.Version1_3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = conn.HandshakeContext(ctx) // done once its (unsent) Finished is written
	}()
	// 100 timeouts: a flight sent every timeout goes 100 times.
	time.Sleep(100 * interval)
	if n := peer.serverHellos.Load(); n == 0 || n > 1+maxRetransmits {
		t.Fatalf("the session sent its flight %d times in %v, unanswered; want 1 to %d (once, and %d retransmissions)",
			n, 100*interval, 1+maxRetransmits, maxRetransmits)
	}
}
