package relay

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/membership"
)

// dialTCP connects to the relay's TCP port from local address from (zero:
// any loopback port), closed at the end of the test.
func dialTCP(t *testing.T, r *Relay, from netip.Addr) *net.TCPConn {
	t.Helper()
	var laddr *net.TCPAddr
	if from.IsValid() {
		laddr = &net.TCPAddr{IP: from.AsSlice()}
	}
	c, err := net.DialTCP("tcp", laddr, net.TCPAddrFromAddrPort(r.TCPAddr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func tcpAddrOf(c *net.TCPConn) netip.AddrPort { return c.LocalAddr().(*net.TCPAddr).AddrPort() }

// frame is p framed as RFC 4571 does: a 2-byte length, then p.
func frame(p []byte) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(p))), p...) }

func writeFrame(t *testing.T, c *net.TCPConn, p []byte) {
	t.Helper()
	if _, err := c.Write(frame(p)); err != nil {
		t.Fatal(err)
	}
}

// readFrame reads one RFC 4571 frame, within d.
func readFrame(c *net.TCPConn, d time.Duration) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	p := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(c, p)
	return p, err
}

// expectRefused dials the relay from from and asserts that the connection
// is refused: reset at once (the dial itself may see the reset).
func expectRefused(t *testing.T, r *Relay, from netip.Addr) {
	t.Helper()
	c, err := net.DialTCP("tcp", &net.TCPAddr{IP: from.AsSlice()}, net.TCPAddrFromAddrPort(r.TCPAddr()))
	if err != nil {
		return
	}
	defer c.Close()
	expectClosed(t, c, 3*time.Second)
}

// expectClosed asserts that the relay closes c within d (EOF or a reset).
func expectClosed(t *testing.T, c *net.TCPConn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open after %v", d)
	}
}

// recvHop reads one hop datagram at the fake transceiver and parses it.
func recvHop(t *testing.T, c *net.UDPConn) (hop.Type, netip.AddrPort, []byte, netip.AddrPort) {
	t.Helper()
	b, from := recv(t, c)
	typ, client, p, err := hop.ParseHeader(b)
	if err != nil {
		t.Fatalf("not a hop datagram: %x: %v", b, err)
	}
	return typ, client, p, from
}

// TestTCPEndToEnd: a client's ICE-TCP connection carries its check, DTLS
// and RTP to the transceiver as DATA_TCP naming the client's TCP address,
// and the transceiver's answers come back framed on the connection. A UDP
// client on the same ip:port is another client, with its own flow.
func TestTCPEndToEnd(t *testing.T) {
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0"}, nil)
	if !e.r.TCPAddr().IsValid() || e.r.TCPAddr().Port() == 0 {
		t.Fatalf("TCP address %v", e.r.TCPAddr())
	}
	c := dialTCP(t, e.r, netip.Addr{})
	ca := tcpAddrOf(c)

	check := e.binding(t, 7)
	writeFrame(t, c, check)
	typ, client, p, _ := recvHop(t, e.tr)
	if typ != hop.TypeDataTCP || client != ca || !bytes.Equal(p, check) {
		t.Fatalf("transceiver got type %v for %v, %d bytes; want DATA_TCP for %v, the check", typ, client, len(p), ca)
	}
	answer := []byte{0x01, 0x01, 0x00, 0x00, 0x21, 0x12, 0xa4, 0x42}
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), answer...), e.r.InternalAddr())
	if got, err := readFrame(c, 5*time.Second); err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("client read %x, %v; want the answer", got, err)
	}

	// Media both ways, several frames in one write.
	rtp := func(seq byte) []byte { return append([]byte{0x80, 111, 0, seq}, make([]byte, 156)...) }
	if _, err := c.Write(append(frame(rtp(1)), frame(rtp(2))...)); err != nil {
		t.Fatal(err)
	}
	for seq := byte(1); seq <= 2; seq++ {
		if _, _, p, _ := recvHop(t, e.tr); !bytes.Equal(p, rtp(seq)) {
			t.Fatalf("frame %d: got %x", seq, p[:4])
		}
	}
	for seq := byte(3); seq <= 5; seq++ {
		send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), rtp(seq)...), e.r.InternalAddr())
	}
	for seq := byte(3); seq <= 5; seq++ {
		if got, err := readFrame(c, 5*time.Second); err != nil || !bytes.Equal(got, rtp(seq)) {
			t.Fatalf("client frame %d: %v", seq, err)
		}
	}

	// A UDP client on the same ip:port has no flow: its RTP is dropped, a
	// DATA (UDP) reply naming it goes nowhere, and a TCP reply naming the
	// UDP client's address never reaches a UDP socket.
	u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ca))
	if err != nil {
		t.Skipf("cannot bind UDP %v beside the TCP client: %v", ca, err)
	}
	defer u.Close()
	send(t, u, rtp(9), e.r.PublicAddr())
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, ca), rtp(10)...), e.r.InternalAddr())
	expectNothing(t, u)
	expectNothing(t, e.tr)
	eventually(t, "the UDP client's drops", func() bool {
		s := e.r.Stats()
		return s.Drops[DropNotSTUNOnMiss] == 1 && s.Drops[DropInternalNoFlow] == 1
	})
	// Its own check makes its own flow.
	send(t, u, check, e.r.PublicAddr())
	if typ, client, _, _ := recvHop(t, e.tr); typ != hop.TypeData || client != ca {
		t.Fatalf("UDP check reached the transceiver as %v for %v", typ, client)
	}
	s := e.r.Stats()
	if s.Flows != 2 || s.TCP.Established != 1 || s.TCP.ToTransceiverFrames != 3 || s.TCP.ToClientFrames != 4 ||
		s.TCP.ToClientBytes != uint64(len(answer)+3*160) {
		t.Fatalf("stats %+v", s)
	}

	// The connection's end removes its flow.
	c.Close()
	eventually(t, "the flow to go with the connection", func() bool {
		s := e.r.Stats()
		return s.Flows == 1 && s.TCP.Open == 0 && s.TCP.Closed[TCPClientClosed] == 1
	})
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), rtp(11)...), e.r.InternalAddr())
	eventually(t, "internal_no_flow for the gone connection", func() bool {
		return e.r.Stats().Drops[DropInternalNoFlow] == 2
	})

	// Every TCP series is exported from the start.
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += " " + l.GetValue()
			}
			series[name] = true
		}
	}
	for reason := range NumTCPCloseReasons {
		if !series["switchboard_relay_tcp_closed_total "+reason.String()] {
			t.Errorf("no series for %s", reason)
		}
	}
	for _, name := range []string{"switchboard_relay_tcp_connections established", "switchboard_relay_tcp_accepted_total",
		"switchboard_relay_tcp_frames_total to_client", "switchboard_relay_tcp_bytes_total to_transceiver",
		"switchboard_relay_drops_total tcp_queue_full", "switchboard_relay_drops_total tcp_no_connection"} {
		if !series[name] {
			t.Errorf("no series %s", name)
		}
	}
}

// TestTCPFirstFrame: a connection whose first frame is anything but a
// Binding request with a valid token is closed, the frame's drop reason
// and the close counted, and nothing reaches the transceiver.
func TestTCPFirstFrame(t *testing.T) {
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0", TCPFirstFrameTimeout: 300 * time.Millisecond}, nil)
	big := make([]byte, hop.MaxPayload+1)
	big[0] = 0x80
	tests := []struct {
		name  string
		bytes []byte // written on the connection; nil: nothing
		drop  DropReason
		close TCPCloseReason
	}{
		{"rtp", frame([]byte{0x80, 111, 0, 1}), DropNotSTUNOnMiss, TCPFirstFrameInvalid},
		{"dtls", frame([]byte{0x16, 0xfe, 0xfd, 0}), DropNotSTUNOnMiss, TCPFirstFrameInvalid},
		{"empty", frame(nil), DropUnknownFirstByte, TCPFirstFrameInvalid},
		{"hop magic", frame(append(hop.AppendHeader(nil, hop.TypeData, c1), 0x80)), DropUnknownFirstByte, TCPFirstFrameInvalid},
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), DropTooBig, TCPFrameTooBig},
		// A TLS record's first two bytes (0x16 0x03) read as a 5,635-byte frame.
		{"tls client hello", append([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}, make([]byte, 508)...), DropTooBig, TCPFrameTooBig},
		{"binding response", frame(rawSTUN(0x0101, 0, nil)), DropSTUNNotBindingRequest, TCPFirstFrameInvalid},
		{"no username", frame(rawSTUN(0x0001, 0, nil)), DropNoUsername, TCPFirstFrameInvalid},
		{"not a token", frame(binding(t, "abcdefgh:clnt")), DropTokenMalformed, TCPFirstFrameInvalid},
		{"forged token", frame(binding(t, mint(t, testKeyring(t, 1, 0xBB), testCluster, 7, e.now)+":clnt")), DropTokenForged, TCPFirstFrameInvalid},
		{"unknown transceiver", frame(e.binding(t, 99)), DropUnknownTransceiver, TCPFirstFrameInvalid},
		{"frame too big", frame(big), DropTooBig, TCPFrameTooBig},
		{"nothing", nil, 0, TCPFirstFrameTimeout},
		{"half a frame", frame(e.binding(t, 7))[:10], 0, TCPFirstFrameTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.r.Stats()
			c := dialTCP(t, e.r, netip.Addr{})
			if tt.bytes != nil {
				if _, err := c.Write(tt.bytes); err != nil {
					t.Fatal(err)
				}
			}
			expectClosed(t, c, 3*time.Second)
			eventually(t, "the close counted", func() bool {
				s := e.r.Stats()
				return s.TCP.Closed[tt.close] == before.TCP.Closed[tt.close]+1 && s.TCP.Open == 0
			})
			s := e.r.Stats()
			if tt.drop != 0 && s.Drops[tt.drop] != before.Drops[tt.drop]+1 {
				t.Errorf("%s drops %d, want %d", tt.drop, s.Drops[tt.drop], before.Drops[tt.drop]+1)
			}
			if s.Flows != 0 || s.TCP.ToTransceiverFrames != 0 {
				t.Errorf("flows %d, frames to the transceiver %d", s.Flows, s.TCP.ToTransceiverFrames)
			}
		})
	}
	expectNothing(t, e.tr)
}

// TestTCPCaps: connections over the per-source cap or the total cap are
// refused with a reset at once, counted, and the others keep working.
func TestTCPCaps(t *testing.T) {
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0", MaxTCPConnsPerIP: 2, MaxTCPConns: 3}, nil)
	a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	keep := []*net.TCPConn{dialTCP(t, e.r, a), dialTCP(t, e.r, a)}
	eventually(t, "two open", func() bool { return e.r.Stats().TCP.Open == 2 })
	expectRefused(t, e.r, a) // a's third
	keep = append(keep, dialTCP(t, e.r, b))
	eventually(t, "three open", func() bool { return e.r.Stats().TCP.Open == 3 })
	expectRefused(t, e.r, netip.MustParseAddr("127.0.0.3")) // the fourth in all
	s := e.r.Stats()
	if s.TCP.Closed[TCPRefusedSource] != 1 || s.TCP.Closed[TCPRefusedTotal] != 1 || s.TCP.Accepted != 5 || s.TCP.Open != 3 {
		t.Fatalf("stats %+v", s.TCP)
	}
	// The kept connections still carry checks.
	for _, c := range keep {
		writeFrame(t, c, e.binding(t, 7))
		if typ, client, _, _ := recvHop(t, e.tr); typ != hop.TypeDataTCP || client != tcpAddrOf(c) {
			t.Fatalf("got %v for %v", typ, client)
		}
	}
	// A closed connection gives its source's slot back.
	keep[0].Close()
	eventually(t, "the slot back", func() bool { return e.r.Stats().TCP.Open == 2 })
	c := dialTCP(t, e.r, a)
	writeFrame(t, c, e.binding(t, 7))
	if _, client, _, _ := recvHop(t, e.tr); client != tcpAddrOf(c) {
		t.Fatalf("got %v", client)
	}
}

// TestTCPIdleTimeout: an established connection that sends nothing for
// TCPIdleTimeout is closed, and its flow with it.
func TestTCPIdleTimeout(t *testing.T) {
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0", TCPIdleTimeout: 300 * time.Millisecond}, nil)
	c := dialTCP(t, e.r, netip.Addr{})
	writeFrame(t, c, e.binding(t, 7))
	recvHop(t, e.tr)
	// Traffic keeps it open past the timeout.
	for range 6 {
		time.Sleep(100 * time.Millisecond)
		writeFrame(t, c, []byte{0x80, 111, 0, 1})
		recvHop(t, e.tr)
	}
	if s := e.r.Stats(); s.TCP.Open != 1 {
		t.Fatalf("closed while sending: %+v", s.TCP)
	}
	expectClosed(t, c, 3*time.Second)
	eventually(t, "idle_timeout", func() bool {
		s := e.r.Stats()
		return s.TCP.Closed[TCPIdleTimeout] == 1 && s.Flows == 0
	})
}

// TestTCPDelayedFirstFrame: a first frame over its source's rate is not
// refused: it waits on its connection for the source's turn, then goes
// (over TCP a client sends a check once).
func TestTCPDelayedFirstFrame(t *testing.T) {
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0", NewFlowBurstPerIP: 1, NewFlowsPerIP: 5}, nil)
	first := dialTCP(t, e.r, netip.Addr{})
	writeFrame(t, first, e.binding(t, 7))
	recvHop(t, e.tr)
	start := time.Now()
	second := dialTCP(t, e.r, netip.Addr{})
	writeFrame(t, second, e.binding(t, 7))
	_, client, _, _ := recvHop(t, e.tr)
	if waited := time.Since(start); client != tcpAddrOf(second) || waited < 100*time.Millisecond {
		t.Fatalf("second check reached the transceiver for %v after %v; want it delayed about 200 ms", client, waited)
	}
	s := e.r.Stats()
	if s.Held != 1 || s.Admitted != 1 || s.Waiting != 0 || s.Drops[DropSourceRateDelayed]+s.Drops[DropSourceRateLimit] != 0 || s.TCP.Open != 2 {
		t.Fatalf("held %d, admitted %d, waiting %d; drops delayed %d, limit %d; open %d", s.Held, s.Admitted, s.Waiting,
			s.Drops[DropSourceRateDelayed], s.Drops[DropSourceRateLimit], s.TCP.Open)
	}
}

// TestTCPQueueDropsOldestAudio: a client that stops reading fills its
// connection's queue; the relay's loops never wait for it (another
// client's UDP echo keeps flowing), the oldest audio goes first, counted,
// and a DTLS record queued among the audio survives.
func TestTCPQueueDropsOldestAudio(t *testing.T) {
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0"}, nil)
	c := dialTCP(t, e.r, netip.Addr{})
	writeFrame(t, c, e.binding(t, 7))
	_, ca, _, _ := recvHop(t, e.tr)
	u := udp(t)
	send(t, u, e.binding(t, 7), e.r.PublicAddr())
	recvHop(t, e.tr)

	rtp := func(i int) []byte {
		p := make([]byte, 1200)
		p[0], p[1] = 0x80, 111
		binary.BigEndian.PutUint32(p[4:], uint32(i))
		return p
	}
	dtls := append([]byte{0x16, 0xfe, 0xfd}, make([]byte, 100)...)
	const n = 3000 // 3.6 MB: far beyond the kernel's buffers and the queue
	for i := range n {
		if i == n-5 {
			send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), dtls...), e.r.InternalAddr())
		}
		send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), rtp(i)...), e.r.InternalAddr())
		if i%500 == 0 {
			// The relay's internal loop is not held up: the UDP client's
			// datagrams still come through at once.
			send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, addrOf(u)), 0x80, 0, byte(i/500)), e.r.InternalAddr())
			if b, _ := recv(t, u); b[2] != byte(i/500) {
				t.Fatalf("UDP client got %x", b)
			}
		}
	}
	eventually(t, "queue drops", func() bool { return e.r.Stats().Drops[DropTCPQueueFull] > 0 })
	// Now read everything: the newest audio and the DTLS record are there.
	var got []int
	sawDTLS := false
	for {
		p, err := readFrame(c, 500*time.Millisecond)
		if err != nil {
			break
		}
		if p[0] == 0x16 {
			sawDTLS = true
			continue
		}
		got = append(got, int(binary.BigEndian.Uint32(p[4:])))
	}
	s := e.r.Stats()
	t.Logf("client read %d of %d frames; tcp_queue_full %d", len(got), n, s.Drops[DropTCPQueueFull])
	if len(got) == 0 || got[len(got)-1] != n-1 || !sawDTLS {
		t.Fatalf("last frame read %v, DTLS %v; want the newest audio (%d) and the DTLS record", got[len(got)-1:], sawDTLS, n-1)
	}
	if dropped := uint64(n - len(got)); s.Drops[DropTCPQueueFull] != dropped {
		t.Errorf("tcp_queue_full %d, frames missing %d", s.Drops[DropTCPQueueFull], dropped)
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("frames out of order at %d: %d after %d", i, got[i], got[i-1])
		}
	}
}

// TestTCPQueueEviction: the queue gives way by its oldest RTP frame, and
// only when none is audio by its oldest frame.
func TestTCPQueueEviction(t *testing.T) {
	s := &tcpServer{}
	s.bufs.New = func() any { b := make([]byte, 2+hop.MaxPayload); return &b }
	c := &tcpConn{s: s, wake: make(chan struct{}, 1)}
	pkt := func(first byte, id byte) []byte { return append([]byte{first, 111}, append(make([]byte, 10), id)...) }
	c.enqueue(pkt(0x16, 0)) // DTLS, oldest
	for i := byte(1); i < tcpQueue; i++ {
		c.enqueue(pkt(0x80, i))
	}
	if d := c.enqueue(pkt(0x80, 100)); d != DropTCPQueueFull {
		t.Fatalf("full queue: %v", d)
	}
	ids := func() (out []byte) {
		for i := range c.n {
			b := *c.q[(c.head+i)%len(c.q)]
			out = append(out, b[2], b[len(b)-1])
		}
		return out
	}
	want := []byte{0x16, 0}
	for i := byte(2); i < tcpQueue; i++ {
		want = append(want, 0x80, i)
	}
	want = append(want, 0x80, 100)
	if got := ids(); !bytes.Equal(got, want) {
		t.Fatalf("after the first eviction: %x, want %x (RTP 1 gone, DTLS kept)", got, want)
	}
	// A queue of nothing but DTLS gives way by its oldest.
	c = &tcpConn{s: s, wake: make(chan struct{}, 1)}
	for i := range byte(tcpQueue + 1) {
		c.enqueue(pkt(0x16, i))
	}
	if got := ids(); got[1] != 1 || got[len(got)-1] != tcpQueue {
		t.Fatalf("DTLS-only queue: %x", got)
	}
}

// TestTCPRelayClose: closing the relay closes its TCP connections
// (relay_closed): a restart loses them, and the client reconnects.
func TestTCPRelayClose(t *testing.T) {
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0"}, nil)
	var conns []*net.TCPConn
	for range 3 {
		c := dialTCP(t, e.r, netip.Addr{})
		writeFrame(t, c, e.binding(t, 7))
		recvHop(t, e.tr)
		conns = append(conns, c)
	}
	idle := dialTCP(t, e.r, netip.Addr{})
	eventually(t, "four open", func() bool { return e.r.Stats().TCP.Open == 4 })
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, c := range append(conns, idle) {
		wg.Go(func() { expectClosed(t, c, 3*time.Second) })
	}
	wg.Wait()
	if s := e.r.Stats(); s.TCP.Closed[TCPRelayClosed] != 4 || s.TCP.Open != 0 || s.Flows != 0 {
		t.Fatalf("stats %+v, flows %d", s.TCP, s.Flows)
	}
}

// TestTCPThroughGlobalRelay: a TCP client of a Global Relay reaches the
// transceiver through the cluster relay as DATA_TCP, and the answers come
// back the same way onto its connection.
func TestTCPThroughGlobalRelay(t *testing.T) {
	cluster := newEnv(t, Config{TrustedIngress: []string{"127.0.0.0/8"}}, nil)
	gm, err := membership.NewTable(map[uint32]netip.AddrPort{testCluster: cluster.r.PublicAddr()})
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", TCPAddr: "127.0.0.1:0", Ingress: true, Workers: 1}, cluster.keys, gm, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	c := dialTCP(t, g, netip.Addr{})
	ca := tcpAddrOf(c)
	writeFrame(t, c, cluster.binding(t, 7))
	typ, client, _, from := recvHop(t, cluster.tr)
	if typ != hop.TypeDataTCP || client != ca || from != cluster.r.InternalAddr() {
		t.Fatalf("transceiver got %v for %v from %v", typ, client, from)
	}
	answer := []byte{0x01, 0x01, 0, 0, 0x21, 0x12, 0xa4, 0x42}
	send(t, cluster.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), answer...), cluster.r.InternalAddr())
	if got, err := readFrame(c, 5*time.Second); err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("client read %x, %v", got, err)
	}
	rtp := []byte{0x80, 111, 0, 7}
	writeFrame(t, c, rtp)
	if _, _, p, _ := recvHop(t, cluster.tr); !bytes.Equal(p, rtp) {
		t.Fatalf("got %x", p)
	}
	if s := cluster.r.Stats(); s.Flows != 1 || s.TCP != (TCPStats{}) {
		t.Fatalf("cluster relay: flows %d, TCP %+v (its TCP side is off)", s.Flows, s.TCP)
	}
}

// TestTCPICERestart: an ICE restart over a TCP connection follows the UDP
// rules (restart.go): a check with a token for another transceiver goes
// there as the flow's candidate, media stays until that transceiver
// answers, then the flow is its.
func TestTCPICERestart(t *testing.T) {
	tr8 := udp(t)
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0"}, map[uint32]netip.AddrPort{8: addrOf(tr8)})
	c := dialTCP(t, e.r, netip.Addr{})
	ca := tcpAddrOf(c)
	writeFrame(t, c, e.binding(t, 7))
	recvHop(t, e.tr)
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), 0x01, 0x01, 0, 0), e.r.InternalAddr())
	if _, err := readFrame(c, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	rtp := []byte{0x80, 111, 0, 1}
	writeFrame(t, c, e.binding(t, 8)) // the restart's check, for transceiver 8
	if typ, client, _, _ := recvHop(t, tr8); typ != hop.TypeDataTCP || client != ca {
		t.Fatalf("restart check reached 8 as %v for %v", typ, client)
	}
	writeFrame(t, c, rtp) // media stays on 7 until 8 answers
	if _, _, p, _ := recvHop(t, e.tr); !bytes.Equal(p, rtp) {
		t.Fatalf("media before the answer went elsewhere: %x", p)
	}
	send(t, tr8, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), 0x01, 0x01, 0, 0), e.r.InternalAddr())
	if _, err := readFrame(c, 5*time.Second); err != nil {
		t.Fatalf("8's answer: %v", err)
	}
	writeFrame(t, c, rtp)
	if _, _, p, _ := recvHop(t, tr8); !bytes.Equal(p, rtp) {
		t.Fatalf("media after 8 answered: %x", p)
	}
	// 7's late datagrams no longer reach the client.
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), rtp...), e.r.InternalAddr())
	eventually(t, "7's datagram refused", func() bool { return e.r.Stats().Drops[DropInternalFlowMismatch] == 1 })
}

// TestTCPPathsAllocateNothing: a TCP client's frame on its flow (the
// reader's per-frame decision) and a transceiver's packet for it (the
// internal loop's decision and the copy into the connection's queue)
// allocate nothing once warm, as the UDP paths do.
func TestTCPPathsAllocateNothing(t *testing.T) {
	f := newFixture(t, Config{})
	client := hop.TCPAddr(c1)
	buf := make([]byte, hop.MaxHeaderLen+1500)
	load := func(pkt []byte) []byte { return buf[:hop.MaxHeaderLen+copy(buf[hop.MaxHeaderLen:], pkt)] }
	if _, _, drop := f.r.fromClient(client, netip.AddrPort{}, load(f.good(7)), hop.MaxHeaderLen, f.now); drop != dropNone {
		t.Fatal(drop)
	}
	// A connection with no socket: its queue is what the internal loop fills.
	s := &tcpServer{r: f.r, conns: map[netip.AddrPort]*tcpConn{}}
	s.bufs.New = func() any { b := make([]byte, 2+hop.MaxPayload); return &b }
	c := &tcpConn{s: s, client: client, wake: make(chan struct{}, 1)}
	s.conns[client] = c
	f.r.tcp = s
	rtp := append([]byte{0x80, 111}, make([]byte, 158)...)
	reply := append(hop.AppendHeader(nil, hop.TypeDataTCP, c1), rtp...)
	drain := func() {
		c.mu.Lock()
		for c.n > 0 {
			s.bufs.Put(c.q[c.head])
			c.q[c.head] = nil
			c.head = (c.head + 1) % len(c.q)
			c.n--
		}
		c.mu.Unlock()
		select {
		case <-c.wake:
		default:
		}
	}
	for range 10 { // warm the pool
		f.r.handleInternal(t7, reply, f.now)
		drain()
	}
	if n := testing.AllocsPerRun(1000, func() {
		if _, _, drop := f.r.fromClient(client, netip.AddrPort{}, load(rtp), hop.MaxHeaderLen, f.now); drop != dropNone {
			t.Fatal(drop)
		}
	}); n != 0 {
		t.Errorf("TCP frame on its flow: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if _, out, drop := f.r.handleInternal(t7, reply, f.now); drop != dropNone || out != nil {
			t.Fatal(drop)
		}
		drain()
	}); n != 0 {
		t.Errorf("transceiver packet for a TCP client: %v allocations, want 0", n)
	}
}

// TestTCPDrain: a draining relay takes no new ICE-TCP connection and is
// not ready, while its open connections go on both ways; Drain returns
// when the last one ends, or when its context does.
func TestTCPDrain(t *testing.T) {
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0"}, nil)
	c := dialTCP(t, e.r, netip.Addr{})
	ca := tcpAddrOf(c)
	writeFrame(t, c, e.binding(t, 7))
	recvHop(t, e.tr)
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan int, 1)
	go func() { drained <- e.r.Drain(ctx) }()
	eventually(t, "not ready", func() bool { return errors.Is(e.r.Ready(), ErrDraining) })
	if nc, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(e.r.TCPAddr())); err == nil {
		nc.Close()
		t.Fatal("a draining relay accepted a new connection")
	}
	rtp := []byte{0x80, 111, 0, 1}
	writeFrame(t, c, rtp)
	if _, _, p, _ := recvHop(t, e.tr); !bytes.Equal(p, rtp) {
		t.Fatalf("frame during the drain: %x", p)
	}
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, ca), rtp...), e.r.InternalAddr())
	if got, err := readFrame(c, 5*time.Second); err != nil || !bytes.Equal(got, rtp) {
		t.Fatalf("reply during the drain: %x %v", got, err)
	}
	select {
	case n := <-drained:
		t.Fatalf("Drain returned %d with a connection open", n)
	case <-time.After(100 * time.Millisecond):
	}
	c.Close()
	select {
	case n := <-drained:
		if n != 0 {
			t.Fatalf("Drain returned %d after the last connection ended", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return after the last connection ended")
	}
	cancel()

	// A drain whose context ends first reports what is left open.
	e2 := newEnv(t, Config{TCPAddr: "127.0.0.1:0"}, nil)
	dialTCP(t, e2.r, netip.Addr{})
	eventually(t, "open", func() bool { return e2.r.Stats().TCP.Open == 1 })
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	if n := e2.r.Drain(ctx2); n != 1 {
		t.Fatalf("Drain at its deadline returned %d, want 1", n)
	}
}
