package relay

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// udp opens a loopback UDP socket closed at the end of the test.
func udp(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

func send(t *testing.T, c *net.UDPConn, b []byte, to netip.AddrPort) {
	t.Helper()
	if _, err := c.WriteToUDPAddrPort(b, to); err != nil {
		t.Fatal(err)
	}
}

// recv reads one datagram, failing the test after a generous timeout.
func recv(t *testing.T, c *net.UDPConn) ([]byte, netip.AddrPort) {
	t.Helper()
	b, from, err := tryRecv(c, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return b, from
}

func tryRecv(c *net.UDPConn, d time.Duration) ([]byte, netip.AddrPort, error) {
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 2048)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	return buf[:n], from, err
}

// expectNothing asserts that no datagram arrives on c for a short while.
func expectNothing(t *testing.T, c *net.UDPConn) {
	t.Helper()
	b, from, err := tryRecv(c, 150*time.Millisecond)
	if err == nil {
		t.Fatalf("unexpected datagram from %v: %x", from, b)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds or a deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type env struct {
	r       *Relay
	reg     *prometheus.Registry
	keys    *token.Keyring
	tr      *net.UDPConn // fake transceiver 7, in the membership table
	members *membership.Table
	now     time.Time
}

func newEnv(t *testing.T, cfg Config, extra map[uint32]netip.AddrPort) *env {
	t.Helper()
	return newTunedEnv(t, cfg, extra, defaultTuning)
}

// newTunedEnv is newEnv with the relay's tuning given.
func newTunedEnv(t *testing.T, cfg Config, extra map[uint32]netip.AddrPort, tune tuning) *env {
	t.Helper()
	e := &env{reg: prometheus.NewRegistry(), keys: testKeyring(t, 1, 0xAA), tr: udp(t), now: time.Now()}
	m := map[uint32]netip.AddrPort{7: addrOf(e.tr)}
	for id, ap := range extra {
		m[id] = ap
	}
	var err error
	if e.members, err = membership.NewTable(m); err != nil {
		t.Fatal(err)
	}
	cfg.PublicAddr, cfg.InternalAddr, cfg.Cluster = "127.0.0.1:0", "127.0.0.1:0", testCluster
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	if e.r, err = start(cfg, e.keys, e.members, e.reg, nil, tune); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.r.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

func (e *env) binding(t *testing.T, transceiver uint32) []byte {
	return binding(t, mint(t, e.keys, testCluster, transceiver, e.now)+":clnt")
}

// TestRelayEndToEnd runs a client, the relay and a fake transceiver on real
// loopback sockets.
func TestRelayEndToEnd(t *testing.T) {
	for _, batch := range []int{1, DefaultBatch} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) { testRelayEndToEnd(t, Config{Batch: batch}) })
	}
}

func testRelayEndToEnd(t *testing.T, cfg Config) {
	e := newEnv(t, cfg, nil)
	if e.r.PublicAddr().Port() == 0 || e.r.InternalAddr().Port() == 0 || e.r.PublicAddr() == e.r.InternalAddr() {
		t.Fatalf("addresses %v %v", e.r.PublicAddr(), e.r.InternalAddr())
	}
	client := udp(t)
	clientAddr := addrOf(client)

	// The first Binding request creates the flow and reaches the transceiver
	// with a header naming the client's real address.
	req := e.binding(t, 7)
	send(t, client, req, e.r.PublicAddr())
	got, from := recv(t, e.tr)
	if from != e.r.InternalAddr() {
		t.Fatalf("transceiver got a datagram from %v, want the relay's internal address %v", from, e.r.InternalAddr())
	}
	_, named, payload, err := hop.ParseHeader(got)
	if err != nil || named != clientAddr || !bytes.Equal(payload, req) {
		t.Fatalf("header names %v (%v); want %v with the request unchanged", named, err, clientAddr)
	}

	// The transceiver answers; the client gets exactly the payload, from the VIP:port.
	resp := []byte{0x01, 0x01, 0, 0, 0x21, 0x12, 0xA4, 0x42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, clientAddr), resp...), e.r.InternalAddr())
	got, from = recv(t, client)
	if from != e.r.PublicAddr() || !bytes.Equal(got, resp) {
		t.Fatalf("client got %x from %v, want %x from %v", got, from, resp, e.r.PublicAddr())
	}
	eventually(t, "flow confirmed", func() bool { s := e.r.Stats(); return s.Flows == 1 && s.PendingFlows == 0 })

	// DTLS and RTP follow the flow both ways, untouched.
	for _, pkt := range [][]byte{{22, 0xfe, 0xfd, 0, 0, 0, 1}, append([]byte{0x80, 111, 0, 1}, bytes.Repeat([]byte{0xAB}, 160)...)} {
		send(t, client, pkt, e.r.PublicAddr())
		got, _ = recv(t, e.tr)
		if _, named, payload, err := hop.ParseHeader(got); err != nil || named != clientAddr || !bytes.Equal(payload, pkt) {
			t.Fatalf("forwarded %x for %v, want %x for %v", payload, named, pkt, clientAddr)
		}
		send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, clientAddr), pkt...), e.r.InternalAddr())
		if got, from = recv(t, client); !bytes.Equal(got, pkt) || from != e.r.PublicAddr() {
			t.Fatalf("client got %x from %v", got, from)
		}
	}

	// An unknown client's RTP is dropped and counted; nothing reaches the transceiver.
	stranger := udp(t)
	send(t, stranger, []byte{0x80, 111, 0, 2}, e.r.PublicAddr())
	expectNothing(t, e.tr)
	eventually(t, "not_stun_on_miss counted", func() bool { return e.r.Stats().Drops[DropNotSTUNOnMiss] == 1 })

	// A forged token creates no flow.
	forger := udp(t)
	other := testKeyring(t, 1, 0xBB)
	send(t, forger, binding(t, mint(t, other, testCluster, 7, e.now)+":evil"), e.r.PublicAddr())
	expectNothing(t, e.tr)
	eventually(t, "token_forged counted", func() bool { return e.r.Stats().Drops[DropTokenForged] == 1 })
	if s := e.r.Stats(); s.Flows != 1 {
		t.Fatalf("%d flows after a forged token", s.Flows)
	}

	// A non-member writing to the internal socket reaches no client, even
	// naming a client with a flow.
	intruder := udp(t)
	send(t, intruder, append(hop.AppendHeader(nil, hop.TypeData, clientAddr), 0x80, 1), e.r.InternalAddr())
	expectNothing(t, client)
	eventually(t, "internal_unknown_peer counted", func() bool { return e.r.Stats().Drops[DropInternalUnknownPeer] == 1 })

	// A member naming a client without a flow: no reflection to arbitrary addresses.
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, addrOf(stranger)), 0x80, 1), e.r.InternalAddr())
	expectNothing(t, stranger)
	eventually(t, "internal_no_flow counted", func() bool { return e.r.Stats().Drops[DropInternalNoFlow] == 1 })

	s := e.r.Stats()
	if s.ToTransceiverPackets != 3 || s.ToClientPackets != 3 {
		t.Fatalf("packets %d to transceiver, %d to client; want 3 and 3", s.ToTransceiverPackets, s.ToClientPackets)
	}
	if s.ToTransceiverBytes != uint64(len(req)+7+164) {
		t.Fatalf("bytes to transceiver %d", s.ToTransceiverBytes)
	}

	// The same numbers through Prometheus.
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"switchboard_relay_drops_total", `reason="not_stun_on_miss"`, 1},
		{"switchboard_relay_drops_total", `reason="token_forged"`, 1},
		{"switchboard_relay_drops_total", `reason="flow_table_full"`, 0},
		{"switchboard_relay_packets_total", `direction="to_client"`, 3},
		{"switchboard_relay_flows", `state="confirmed"`, 1},
		{"switchboard_relay_flows", `state="pending"`, 0},
		{"switchboard_relay_socket_dropped_total", `socket="public"`, 0}, // a few datagrams: no kernel drop
		{"switchboard_relay_socket_dropped_total", `socket="internal"`, 0},
	} {
		if v := gathered(t, e.reg, c.name, c.labels); v != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "switchboard_relay_drops_total" && len(mf.GetMetric()) != int(NumDropReasons)-1 {
			t.Fatalf("%d drop series: every reason must be exported from the start", len(mf.GetMetric()))
		}
	}
}

// gathered returns the value of the series name{labels} in reg.
func gathered(t *testing.T, reg *prometheus.Registry, name, labels string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
			}
			if strings.Join(ls, ",") != labels {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s{%s}", name, labels)
	return 0
}

func TestRelayFlowsExpire(t *testing.T) {
	e := newEnv(t, Config{PendingTimeout: 100 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}, nil)
	pendingClient, confirmedClient := udp(t), udp(t)
	send(t, pendingClient, e.binding(t, 7), e.r.PublicAddr())
	recv(t, e.tr) // never answered
	send(t, confirmedClient, e.binding(t, 7), e.r.PublicAddr())
	recv(t, e.tr)
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, addrOf(confirmedClient)), 1, 1, 0, 0), e.r.InternalAddr())
	recv(t, confirmedClient)

	eventually(t, "pending flow expired", func() bool {
		s := e.r.Stats()
		return s.FlowsExpiredPending == 1 && s.Flows == 1
	})
	eventually(t, "confirmed flow expired", func() bool {
		s := e.r.Stats()
		return s.FlowsExpiredConfirmed == 1 && s.Flows == 0
	})
	// After expiry media is dropped, and the transceiver cannot reach the client.
	send(t, confirmedClient, []byte{0x80, 0, 0, 1}, e.r.PublicAddr())
	expectNothing(t, e.tr)
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, addrOf(confirmedClient)), 0x80, 0), e.r.InternalAddr())
	expectNothing(t, confirmedClient)
	// The next Binding request rebuilds the flow.
	send(t, confirmedClient, e.binding(t, 7), e.r.PublicAddr())
	recv(t, e.tr)
}

func TestRelayWriteError(t *testing.T) {
	for _, batch := range []int{1, DefaultBatch} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			// Member 9 has an IPv6 address the IPv4 internal socket cannot send to.
			e := newEnv(t, Config{Workers: 1, Batch: batch}, map[uint32]netip.AddrPort{9: netip.MustParseAddrPort("[::1]:9")})
			client := udp(t)
			send(t, client, e.binding(t, 9), e.r.PublicAddr())
			eventually(t, "write_error counted", func() bool { return e.r.Stats().Drops[DropWriteError] == 1 })
		})
	}
}

// TestRelayTooBig: the relay forwards client datagrams up to hop.MaxPayload,
// the path's one limit, and drops longer ones from either side as too_big,
// with batches of 64 and of 1 alike (so that nothing the
// transceiver would drop crosses the hop).
func TestRelayTooBig(t *testing.T) {
	for _, batch := range []int{1, DefaultBatch} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			e := newEnv(t, Config{Workers: 1, Batch: batch}, nil)
			client := udp(t)
			send(t, client, e.binding(t, 7), e.r.PublicAddr())
			recv(t, e.tr)
			for i, n := range []int{hop.MaxPayload + 1, MaxBatchedPayload, MaxBatchedPayload + 1, 4000} {
				big := make([]byte, n)
				big[0] = 0x80
				send(t, client, big, e.r.PublicAddr())
				eventually(t, "too_big counted", func() bool { return e.r.Stats().Drops[DropTooBig] == uint64(i+1) })
			}
			// The largest allowed payload goes through, both ways.
			big := make([]byte, hop.MaxPayload+1)
			big[0] = 0x80
			send(t, client, big[:hop.MaxPayload], e.r.PublicAddr())
			got, _ := recv(t, e.tr)
			if _, _, payload, err := hop.ParseHeader(got); err != nil || len(payload) != hop.MaxPayload {
				t.Fatalf("forwarded %d bytes (%v), want %d", len(payload), err, hop.MaxPayload)
			}
			send(t, e.tr, got, e.r.InternalAddr())
			if back, _ := recv(t, client); len(back) != hop.MaxPayload {
				t.Fatalf("returned %d bytes", len(back))
			}
			// One byte more from the transceiver is dropped too.
			send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, client.LocalAddr().(*net.UDPAddr).AddrPort()), big...), e.r.InternalAddr())
			eventually(t, "too_big counted from the transceiver", func() bool { return e.r.Stats().Drops[DropTooBig] == 5 })
			if s := e.r.Stats(); s.ToTransceiverPackets != 2 || s.ToClientPackets != 1 {
				t.Fatalf("forwarded %d to the transceiver and %d to the client, want 2 and 1", s.ToTransceiverPackets, s.ToClientPackets)
			}
		})
	}
}

func TestRelayNewAndClose(t *testing.T) {
	keys := testKeyring(t, 1, 1)
	members := new(membership.Table)
	reg := prometheus.NewRegistry()
	cfg := Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Workers: 3}
	r, err := New(cfg, keys, members, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The metrics are registered once: a second relay on the same registry fails cleanly.
	if _, err := New(cfg, keys, members, reg, nil); err == nil {
		t.Fatal("second registration succeeded")
	}
	// A second relay on the first one's addresses (both groups would set
	// SO_REUSEPORT) fails and names the address instead of splitting its
	// traffic with the first.
	for _, second := range []Config{
		{PublicAddr: r.PublicAddr().String(), InternalAddr: "127.0.0.1:0", Workers: 3},
		{PublicAddr: "127.0.0.1:0", InternalAddr: r.InternalAddr().String(), Workers: 3},
	} {
		_, err := New(second, keys, members, nil, nil)
		if err == nil {
			t.Fatalf("second relay on %+v started", second)
		}
		if want := "is in use by another process"; !strings.Contains(err.Error(), want) || !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("second relay: error %q, want EADDRINUSE and %q", err, want)
		}
	}
	// Port taken without SO_REUSEPORT on our side.
	busy := udp(t)
	if _, err := New(Config{PublicAddr: addrOf(busy).String(), InternalAddr: "127.0.0.1:0", Workers: 1}, keys, members, nil, nil); err == nil {
		t.Fatal("bound a busy port")
	}
	if _, err := New(Config{PublicAddr: "127.0.0.1:0"}, keys, members, nil, nil); err == nil {
		t.Fatal("accepted an empty InternalAddr")
	}
	if _, err := New(cfg, nil, members, nil, nil); err == nil {
		t.Fatal("accepted a nil keyring")
	}
	if _, err := New(cfg, keys, nil, nil, nil); err == nil {
		t.Fatal("accepted a nil membership table")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	// Close unregistered the metrics, so the registry is free again.
	r2, err := New(cfg, keys, members, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2.Close()
}
