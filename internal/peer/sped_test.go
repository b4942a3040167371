package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/dtls/v4"
	"github.com/pion/dtls/v4/pkg/crypto/selfsign"
	"github.com/pion/dtls/v4/pkg/protocol"
	"github.com/pion/stun/v4"
)

// SPED (sped.go) against a client of the tests' own: a pion/dtls v4 DTLS
// 1.3 client whose datagrams the test carries in Binding requests, as
// Chromium does with WebRTC-IceHandshakeDtls (internal/testsupport/e2e
// TestChromiumSPED tries the real one).

// memConn is the test client's DTLS transport: what DTLS writes is kept
// in out for the test to carry; what the test puts in in is read.
type memConn struct {
	in     chan []byte
	out    chan []byte
	closed chan struct{}
	once   sync.Once
}

func newMemConn() *memConn {
	return &memConn{in: make(chan []byte, 64), out: make(chan []byte, 64), closed: make(chan struct{})}
}

func (c *memConn) ReadFrom(p []byte) (int, net.Addr, error) {
	select {
	case b := <-c.in:
		return copy(p, b), memAddr{}, nil
	case <-c.closed:
		return 0, nil, net.ErrClosed
	}
}

func (c *memConn) WriteTo(p []byte, _ net.Addr) (int, error) {
	select {
	case c.out <- bytes.Clone(p):
	default: // the test is not carrying any more
	}
	return len(p), nil
}

func (c *memConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}
func (c *memConn) LocalAddr() net.Addr              { return memAddr{} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

type memAddr struct{}

func (memAddr) Network() string { return "mem" }
func (memAddr) String() string  { return "mem" }

// spedClient is a DTLS 1.3 client whose datagrams ride in checks sent
// from sock to a SPED session of s.
type spedClient struct {
	sock      *net.UDPConn
	mem       *memConn
	conn      *dtls.Conn
	done      chan error
	sess      *Session
	user, pwd string
	to        netip.AddrPort
}

// newSPEDClient registers a SPED session on s and starts a DTLS 1.3
// client for it; its ClientHello waits in c.mem.out.
func newSPEDClient(t *testing.T, s *server, mutate ...func(*SessionConfig)) *spedClient {
	t.Helper()
	cert, err := selfsign.GenerateSelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	ufrag, pwd := newCreds()
	cfg := SessionConfig{LocalUfrag: ufrag, LocalPwd: pwd, RemoteUfrag: "client", Role: DTLSServer, SPED: true,
		Certificate: s.cert, Fingerprints: []Fingerprint{{Hash: "sha-256", Digest: sum[:]}}}
	sess := newSession(t, s, cfg, mutate...)
	sess.setSPEDWait(5 * time.Second) // a loaded machine's handshake may take longer than spedResponseWait
	sock, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sock.Close() })
	mem := newMemConn()
	conn, err := dtls.Client(mem, memAddr{}, dtls.WithCertificates(cert), dtls.WithInsecureSkipVerify(true),
		dtls.WithSRTPProtectionProfiles(srtpProfiles...), dtls.WithMinVersion(protocol.Version1_3), dtls.WithMTU(spedMTU))
	if err != nil {
		t.Fatal(err)
	}
	c := &spedClient{sock: sock, mem: mem, conn: conn, done: make(chan error, 1), sess: sess, user: ufrag + ":client", pwd: pwd, to: s.addr()}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.done <- conn.HandshakeContext(ctx)
	}()
	t.Cleanup(func() { _ = conn.Close(); _ = mem.Close() })
	return c
}

// next returns the client's next DTLS datagram, waiting for it.
func (c *spedClient) next(t *testing.T) []byte {
	t.Helper()
	select {
	case b := <-c.mem.out:
		return b
	case <-time.After(5 * time.Second):
		t.Fatal("the client wrote no DTLS")
		return nil
	}
}

// check returns a Binding request of c's session carrying data and ack
// (nil: no attribute) before its MESSAGE-INTEGRITY, or, when after, past
// it (where the integrity does not cover them).
func (c *spedClient) check(t *testing.T, data, ack []byte, after bool) []byte {
	t.Helper()
	m := &stun.Message{}
	m.TransactionID = stun.NewTransactionID()
	m.Type = stun.BindingRequest
	m.WriteHeader()
	_ = stun.NewUsername(c.user).AddTo(m)
	add := func() {
		if ack != nil {
			m.Add(stun.AttrDtlsInStunAck, ack)
		}
		if data != nil {
			m.Add(stun.AttrDtlsInStun, data)
		}
	}
	if !after {
		add()
	}
	if err := stun.NewShortTermIntegrity(c.pwd).AddTo(m); err != nil {
		t.Fatal(err)
	}
	if after {
		add()
	}
	if err := stun.Fingerprint.AddTo(m); err != nil {
		t.Fatal(err)
	}
	return m.Raw
}

// spedExchange sends b from conn and returns the response to it and the
// plain DTLS datagrams that came with it, waiting quiet after the
// response for more.
func spedExchange(t *testing.T, conn *net.UDPConn, to netip.AddrPort, b []byte, quiet time.Duration) (*stun.Message, [][]byte) {
	t.Helper()
	if _, err := conn.WriteToUDPAddrPort(b, to); err != nil {
		t.Fatal(err)
	}
	var res *stun.Message
	var plain [][]byte
	buf := make([]byte, 1500)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if res != nil {
			deadline = time.Now().Add(quiet)
		}
		_ = conn.SetReadDeadline(deadline)
		n, err := conn.Read(buf)
		if err != nil {
			if res == nil {
				t.Fatalf("no response: %v", err)
			}
			return res, plain
		}
		p := bytes.Clone(buf[:n])
		if p[0] > 3 {
			plain = append(plain, p)
			continue
		}
		m := &stun.Message{Raw: p}
		if m.Decode() != nil || m.TransactionID != [stun.TransactionIDSize]byte(b[8:20]) {
			continue
		}
		res = m
	}
}

// spedAttrs returns a response's DTLS-IN-STUN and ACK (nil when absent).
func spedAttrs(m *stun.Message) (data, ack []byte) {
	if v, err := m.Get(stun.AttrDtlsInStun); err == nil {
		data = v
	}
	if v, err := m.Get(stun.AttrDtlsInStunAck); err == nil {
		ack = v
		if ack == nil {
			ack = []byte{}
		}
	}
	return data, ack
}

// isServerHello reports whether b starts with a plaintext handshake
// record holding a ServerHello (msg_type 2).
func isServerHello(b []byte) bool { return len(b) > 13+12 && b[0] == 22 && b[13] == 2 }

// acks reports whether the ACK attribute names datagram b.
func acks(ack, b []byte) bool {
	c := spedCRC(b)
	for i := 0; i+4 <= len(ack); i += 4 {
		if binary.BigEndian.Uint32(ack[i:]) == c {
			return true
		}
	}
	return false
}

// TestSPEDHandshake: the ClientHello rides the first check, the response
// to it carries the DTLS 1.3 ServerHello and acknowledges the ClientHello,
// and the client, fed only what came with that response, is done: its last
// flight rides the next check, whose response acknowledges it and carries
// no datagram. The session is connected with DTLS 1.3, in the checks.
func TestSPEDHandshake(t *testing.T) {
	s := newServer(t)
	c := newSPEDClient(t, s)
	hello := c.next(t)
	if !endsClientHello(hello) {
		t.Fatalf("the client's first datagram is not a whole ClientHello: % x", hello[:min(len(hello), 32)])
	}
	res, plain := spedExchange(t, c.sock, c.to, c.check(t, hello, []byte{}, false), 50*time.Millisecond)
	data, ack := spedAttrs(res)
	if !isServerHello(data) {
		t.Fatalf("the first response carries no ServerHello: data % x", data[:min(len(data), 32)])
	}
	if !acks(ack, hello) {
		t.Errorf("the first response's ACK % x does not name the ClientHello", ack)
	}
	if len(res.Raw) > 20+maxSPEDMessage {
		t.Errorf("response of %d bytes, over %d", len(res.Raw), 20+maxSPEDMessage)
	}
	t.Logf("first response %d bytes with a %d-byte datagram; %d plain datagrams with it", len(res.Raw), len(data), len(plain))
	for _, b := range append([][]byte{data}, plain...) {
		c.mem.in <- b
	}
	select {
	case err := <-c.done:
		if err != nil {
			t.Fatalf("client handshake: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client is not done with the first response's datagrams")
	}
	var ack2 []byte
	for _, d := range [][]byte{c.next(t)} {
		ack2 = binary.BigEndian.AppendUint32(ack2, spedCRC(data))
		res, _ = spedExchange(t, c.sock, c.to, c.check(t, d, ack2, false), 10*time.Millisecond)
		got, ack := spedAttrs(res)
		if got != nil || !acks(ack, d) {
			t.Errorf("the response to the client's last flight: data %d bytes, ACK % x; want none and its checksum", len(got), ack)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.sess.DTLSVersion() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if v := c.sess.DTLSVersion(); v != DTLS13 || !c.sess.SPED() {
		t.Fatalf("session: DTLS %q, SPED %v; want 1.3 in the checks", v, c.sess.SPED())
	}
	// A check with neither attribute ends the piggybacking: no ACK.
	res, _ = spedExchange(t, c.sock, c.to, c.check(t, nil, nil, false), 0)
	if d, a := spedAttrs(res); d != nil || a != nil {
		t.Errorf("after the handshake, a plain check's response carries SPED attributes: data %v, ack %v", d != nil, a != nil)
	}
}

// TestSPEDReplayEarnsResponseOnly: what checks carrying DTLS earn
// (docs/security.md). The ClientHello's check replayed (its transaction
// ID), or sent from another address, earns its Binding response with no
// DTLS datagram and no plain datagram; a fresh check from the selected
// address earns one datagram of the handshake in its response, at most
// maxSPEDData times in all.
func TestSPEDReplayEarnsResponseOnly(t *testing.T) {
	s := newServer(t)
	c := newSPEDClient(t, s)
	hello := c.next(t)
	first := c.check(t, hello, []byte{}, false)
	res, _ := spedExchange(t, c.sock, c.to, first, 50*time.Millisecond)
	if d, _ := spedAttrs(res); !isServerHello(d) {
		t.Fatal("the first response carries no ServerHello")
	}
	// The same check again (a retransmission, or a replay), from the
	// client's address and from another.
	other, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, from := range []*net.UDPConn{c.sock, other} {
		res, plain := spedExchange(t, from, c.to, first, 50*time.Millisecond)
		if d, _ := spedAttrs(res); d != nil || len(plain) != 0 {
			t.Errorf("a replayed check earned a %d-byte datagram in its response and %d plain ones", len(d), len(plain))
		}
	}
	// A fresh check with the ClientHello from another address: its
	// response carries no datagram, and nothing else goes there.
	res, plain := spedExchange(t, other, c.to, c.check(t, hello, []byte{}, false), 50*time.Millisecond)
	if d, _ := spedAttrs(res); d != nil || len(plain) != 0 {
		t.Errorf("a check from another address earned a %d-byte datagram and %d plain ones", len(d), len(plain))
	}
	// Fresh checks from the selected address while the client never
	// finishes: each response carries at most one datagram, maxSPEDData
	// in all (the first response's included).
	carried, bytesIn, bytesOut := 1, 0, 0
	for range 2 * maxSPEDData {
		b := c.check(t, nil, []byte{}, false)
		res, _ := spedExchange(t, c.sock, c.to, b, 0)
		bytesIn += len(b)
		bytesOut += len(res.Raw)
		if d, _ := spedAttrs(res); d != nil {
			carried++
		}
	}
	if carried != maxSPEDData {
		t.Errorf("%d responses carried a datagram, want %d (maxSPEDData)", carried, maxSPEDData)
	}
	t.Logf("%d fresh checks (%d bytes) earned %d bytes of responses, %d carrying a datagram", 2*maxSPEDData, bytesIn, bytesOut, carried)
}

// TestSPEDAttributesAfterIntegrity: DTLS-IN-STUN after the check's
// MESSAGE-INTEGRITY is not covered by it and is ignored: the handshake
// does not start, and the check counts as one without SPED attributes.
func TestSPEDAttributesAfterIntegrity(t *testing.T) {
	s := newServer(t)
	c := newSPEDClient(t, s)
	hello := c.next(t)
	res, plain := spedExchange(t, c.sock, c.to, c.check(t, hello, []byte{}, true), 50*time.Millisecond)
	if d, a := spedAttrs(res); d != nil || a != nil || len(plain) != 0 {
		t.Errorf("a check with DTLS past its integrity earned data %v, ack %v and %d plain datagrams", d != nil, a != nil, len(plain))
	}
	if p := c.sess.SetupPhase(); p != SetupNoDTLS {
		t.Errorf("setup phase %v, want no_dtls: DTLS past the integrity fed the handshake", p)
	}
}

// TestSPEDMalformedCounted: an authenticated check whose DTLS-IN-STUN is
// not a DTLS record, or whose DTLS-IN-STUN-ACK is not a list of 4-byte
// checksums, is answered, feeds nothing, and is counted as sped_malformed
// (nothing from the network is lost silently).
func TestSPEDMalformedCounted(t *testing.T) {
	s := newServer(t)
	c := newSPEDClient(t, s)
	for _, tc := range []struct {
		name      string
		data, ack []byte
	}{
		{"data not DTLS", []byte("not a DTLS record, only bytes"), []byte{}},
		{"ack of 3 bytes", nil, []byte{1, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.ep.Drops()[DropSPEDMalformed]
			res, plain := spedExchange(t, c.sock, c.to, c.check(t, tc.data, tc.ack, false), 20*time.Millisecond)
			if d, _ := spedAttrs(res); d != nil || len(plain) != 0 {
				t.Errorf("a malformed SPED check earned a %d-byte datagram and %d plain ones", len(d), len(plain))
			}
			if got := s.ep.Drops()[DropSPEDMalformed]; got != before+1 {
				t.Fatalf("sped_malformed %d, want %d", got, before+1)
			}
		})
	}
	if p := c.sess.SetupPhase(); p != SetupNoDTLS {
		t.Errorf("setup phase %v, want no_dtls: a malformed DTLS-IN-STUN fed the handshake", p)
	}
}

// TestSPEDSessionConfig: a SPED session must be the DTLS server with an
// ECDSA certificate.
func TestSPEDSessionConfig(t *testing.T) {
	s := newServer(t)
	base := SessionConfig{LocalUfrag: "spedcfg", LocalPwd: "pwdpwdpwdpwdpwdpwdpwdpwd", RemoteUfrag: "client", Role: DTLSServer,
		SPED: true, Certificate: s.cert, Fingerprints: []Fingerprint{s.fp}}
	client := base
	client.Role = DTLSClient
	if _, err := s.ep.NewSession(client); err == nil || !strings.Contains(err.Error(), "DTLS server") {
		t.Errorf("SPED as DTLS client: %v", err)
	}
	rsa := base
	rsa.Certificate.PrivateKey = nil
	if _, err := s.ep.NewSession(rsa); err == nil || !strings.Contains(err.Error(), "ECDSA") {
		t.Errorf("SPED without an ECDSA key: %v", err)
	}
}

// TestSPEDOffer: ParseOffer finds SPED's ICE options at media or session
// level (Chromium 156 writes "trickle sped googspedv1" in each section),
// and Answer repeats them, session level.
func TestSPEDOffer(t *testing.T) {
	raw, err := os.ReadFile("testdata/chromium-156-audio.sdp")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, offer string
		want        []string
	}{
		{"none", string(raw), nil},
		{"chromium 156", strings.ReplaceAll(string(raw), "a=ice-options:trickle\r\n", "a=ice-options:trickle sped googspedv1\r\n"), []string{"sped", "googspedv1"}},
		{"m149", strings.ReplaceAll(string(raw), "a=ice-options:trickle\r\n", "a=ice-options:trickle goog-sped-v1\r\n"), []string{"goog-sped-v1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseOffer(tc.offer)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.SPED, tc.want) {
				t.Fatalf("SPED %q, want %q", o.SPED, tc.want)
			}
			p := testParams()
			p.Setup, p.SPED = "passive", len(tc.want) > 0
			a, err := Answer(o, p)
			if err != nil {
				t.Fatal(err)
			}
			line := "a=ice-options:" + strings.Join(tc.want, " ") + "\r\n"
			if has := strings.Contains(a, line); has != p.SPED {
				t.Errorf("answer has %q: %v, want %v", line, has, p.SPED)
			}
			p.SPED = true
			if _, err := Answer(o, p); (err == nil) != (len(tc.want) > 0) {
				t.Errorf("Answer with SPED for this offer: %v", err)
			}
		})
	}
}

// clientHelloGroups returns the supported_groups (RFC 8446 §4.2.7) and the
// key_share groups of a whole ClientHello in one DTLS record, or fails.
func clientHelloGroups(t *testing.T, b []byte) (groups, shares []uint16) {
	t.Helper()
	if !endsClientHello(b) {
		t.Fatalf("not a whole ClientHello: % x", b[:min(len(b), 32)])
	}
	body := b[13+12:]
	i := 2 + 32                                     // client_version, random
	i += 1 + int(body[i])                           // session_id
	i += 1 + int(body[i])                           // cookie (DTLS)
	i += 2 + int(binary.BigEndian.Uint16(body[i:])) // cipher_suites
	i += 1 + int(body[i])                           // compression_methods
	i += 2                                          // extensions length
	for i+4 <= len(body) {
		typ, n := int(body[i])<<8|int(body[i+1]), int(body[i+2])<<8|int(body[i+3])
		v := body[i+4 : i+4+n]
		switch typ {
		case 10: // supported_groups
			for j := 2; j+2 <= len(v); j += 2 {
				groups = append(groups, binary.BigEndian.Uint16(v[j:]))
			}
		case 51: // key_share
			for j := 2; j+4 <= len(v); {
				shares = append(shares, binary.BigEndian.Uint16(v[j:]))
				j += 4 + int(binary.BigEndian.Uint16(v[j+2:]))
			}
		}
		i += 4 + n
	}
	return groups, shares
}

// TestClientHelloGroups: as the DTLS client with DTLS 1.3 the session
// sends one key share, X25519, and lists no group it has no share for
// that a server would rather take: X25519MLKEM768 is not listed, because
// Chromium's DTLS server takes a listed post-quantum group first and asks
// for its share with a HelloRetryRequest, a round trip (dtls.go).
func TestClientHelloGroups(t *testing.T) {
	s := newServer(t, func(c *Config) { c.DTLSVersion = DTLS13 })
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	sess := liteSession(t, s, func(c *SessionConfig) { c.Role = DTLSClient })
	sess.setDTLSTimers(time.Hour, -1)
	c := newSock(t)
	if _, err := c.WriteToUDPAddrPort(check(t, user, pwd, false), s.addr()); err != nil {
		t.Fatal(err)
	}
	hello := waitClientHello(t, c)
	groups, shares := clientHelloGroups(t, hello)
	const x25519, mlkem = 0x001d, 0x11ec
	if !slices.Equal(shares, []uint16{x25519}) || len(groups) == 0 || groups[0] != x25519 || slices.Contains(groups, mlkem) {
		t.Fatalf("ClientHello (%d bytes): groups %x, key shares %x; want X25519 first and its share only, no X25519MLKEM768", len(hello), groups, shares)
	}
	t.Logf("ClientHello of %d bytes: groups %x, key share %x", len(hello), groups, shares)
}

// FuzzSPEDParse: what SPED reads from the network (a check's attributes,
// the DTLS datagram's first record header, an ACK's checksums) never
// panics, whatever the bytes.
func FuzzSPEDParse(f *testing.F) {
	m := &stun.Message{}
	m.TransactionID = stun.NewTransactionID()
	m.Type = stun.BindingRequest
	m.WriteHeader()
	m.Add(stun.AttrDtlsInStunAck, []byte{1, 2, 3, 4})
	m.Add(stun.AttrDtlsInStun, []byte{22, 254, 253, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	_ = stun.NewShortTermIntegrity("pwdpwdpwdpwdpwdpwdpwdpwd").AddTo(m)
	f.Add(m.Raw)
	f.Add([]byte{22, 254, 253})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = endsClientHello(b)
		_ = isDTLS(b)
		var sp sped
		sp.stash = []stashed{{b: b, crc: spedCRC(b)}}
		sp.prune(b)
		msg := &stun.Message{Raw: append([]byte(nil), b...)}
		if msg.Decode() == nil {
			data, ack, _, _ := inSTUN(msg)
			_ = endsClientHello(data)
			if len(ack)%4 == 0 {
				sp.prune(ack)
			}
		}
	})
}
