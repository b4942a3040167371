package peer

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/stun/v4"

	"github.com/switchboard-rtc/switchboard/internal/hop"
)

// hopServer is an Endpoint on internal/hop's Conn, as in the transceiver,
// with a socket standing for the relay in front of it.
type hopServer struct {
	*server
	conn  *hop.Conn
	relay *net.UDPConn
}

func newHopServer(t *testing.T) *hopServer {
	t.Helper()
	sock := newSock(t)
	conn, err := hop.NewConn(sock, hop.ConnConfig{Advertise: netip.MustParseAddrPort("127.0.0.1:3478")})
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t)
	// Swap the endpoint for one on the hop (newServer's is closed with its socket).
	ep, err := New(Config{Conn: conn, InsecureSkipHelloVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		ep.Close()
	})
	s.ep = ep
	return &hopServer{server: s, conn: conn, relay: newSock(t)}
}

// send delivers b as the relay would from client, with the hop type of
// client's transport (hop.TCPAddr's form: DATA_TCP).
func (h *hopServer) send(t *testing.T, client netip.AddrPort, b []byte) {
	t.Helper()
	plain, _ := hop.SplitTCP(client)
	if _, err := h.relay.WriteToUDPAddrPort(append(hop.AppendHeader(nil, hop.TypeFor(client), plain), b...), h.conn.SocketAddr()); err != nil {
		t.Fatal(err)
	}
}

// answer reads what the endpoint sent back through the relay.
func (h *hopServer) answer(t *testing.T) (hop.Type, netip.AddrPort, []byte) {
	t.Helper()
	_ = h.relay.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1600)
	n, _, err := h.relay.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	typ, client, p, err := hop.ParseHeader(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return typ, client, p
}

// srtp sends the client's next SRTP packet from client and waits for the
// session's media reader to get it.
func (h *hopServer) srtp(t *testing.T, p *srtpPair, sess *Session, client netip.AddrPort) {
	t.Helper()
	h.send(t, client, p.next(t, nil))
	_ = sess.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := sess.ReadRTP(make([]byte, 1500)); err != nil {
		t.Fatalf("SRTP from %v not delivered: %v", client, err)
	}
}

// TestPathsByTransport: a client's UDP and TCP paths of one ip:port are
// two paths. Each check is answered on the transport it came in on, with
// the client's plain address mapped; a nominating check on the other
// transport after the media began does not move the media there (a
// stray check, or a replay); the client's own SRTP on it does, as path
// selection moves media between any two addresses; and back.
func TestPathsByTransport(t *testing.T) {
	h := newHopServer(t)
	sess := liteSession(t, h.server)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	udp := netip.MustParseAddrPort("198.51.100.7:50000")
	tcp := hop.TCPAddr(udp)

	checkOn := func(from netip.AddrPort) {
		t.Helper()
		h.send(t, from, check(t, user, pwd, true))
		typ, client, p := h.answer(t)
		if typ != hop.TypeFor(from) || client != udp {
			t.Fatalf("check from %v answered as %v for %v", from, typ, client)
		}
		var m stun.Message
		m.Raw = p
		var xor stun.XORMappedAddress
		if err := m.Decode(); err != nil || xor.GetFrom(&m) != nil || !xor.IP.Equal(udp.Addr().AsSlice()) || xor.Port != int(udp.Port()) {
			t.Fatalf("answer to %v maps %v:%d (%v), want %v", from, xor.IP, xor.Port, err, udp)
		}
	}
	checkOn(udp)
	if got := sess.RemoteAddr(); got != udp {
		t.Fatalf("selected %v, want the UDP path", got)
	}
	p := keySession(t, sess)
	h.srtp(t, p, sess, udp) // the media has begun, on UDP

	moves := h.ep.Moves()
	checkOn(tcp)
	if got := sess.RemoteAddr(); got != udp {
		t.Fatalf("a nominating check on TCP moved live UDP media to %v", got)
	}
	if got := h.ep.Moves()[MoveDeferred]; got != moves[MoveDeferred]+1 {
		t.Fatalf("deferred %d, want %d", got, moves[MoveDeferred]+1)
	}
	h.srtp(t, p, sess, udp)
	if got := sess.RemoteAddr(); got != udp {
		t.Fatalf("the client's UDP media left the media on %v", got)
	}
	// The client's own SRTP on TCP, within the candidate's window: the
	// client moved its media to TCP (its UDP path broke), and so does the
	// session.
	h.srtp(t, p, sess, tcp)
	if got := sess.RemoteAddr(); got != tcp {
		t.Fatalf("the client's SRTP on TCP left the media on %v", got)
	}
	if got := h.ep.Moves()[MoveConfirmed]; got != moves[MoveConfirmed]+1 {
		t.Fatalf("confirmed %d, want %d", got, moves[MoveConfirmed]+1)
	}
	// What the session sends now goes out on TCP.
	if err := sess.WriteRTP(&rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: 1, SSRC: 0x5e}, make([]byte, 40)); err != nil {
		t.Fatal(err)
	}
	if typ, client, _ := h.answer(t); typ != hop.TypeDataTCP || client != udp {
		t.Fatalf("media sent as %v for %v, want DATA_TCP", typ, client)
	}
	// And the reverse: a check on UDP moves nothing by itself.
	checkOn(udp)
	if got := sess.RemoteAddr(); got != tcp {
		t.Fatalf("a nominating check on UDP moved live TCP media to %v", got)
	}
}
