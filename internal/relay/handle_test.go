package relay

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pion/stun/v4"
	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testCluster = 3

var (
	t7 = netip.MustParseAddrPort("127.0.0.1:4007") // member 7
	t8 = netip.MustParseAddrPort("127.0.0.1:4008") // member 8
)

func testKeyring(tb testing.TB, id uint8, fill byte) *token.Keyring {
	tb.Helper()
	k, err := token.NewKeyring(token.Key{ID: id, Secret: bytes.Repeat([]byte{fill}, 32)})
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func mint(tb testing.TB, k *token.Keyring, cluster uint16, transceiver uint32, issued time.Time) string {
	tb.Helper()
	u, err := k.Seal(token.Claims{Cluster: cluster, Transceiver: transceiver, IssuedMinute: token.MinuteOf(issued)}, rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// binding builds a Binding request the way an ICE agent does: USERNAME,
// MESSAGE-INTEGRITY, FINGERPRINT.
func binding(tb testing.TB, username string) []byte {
	tb.Helper()
	m, err := stun.Build(stun.TransactionID, stun.BindingRequest,
		stun.NewUsername(username), stun.NewShortTermIntegrity("pwd-of-the-session"), stun.Fingerprint)
	if err != nil {
		tb.Fatal(err)
	}
	return m.Raw
}

// rawSTUN builds a STUN message by hand (for values pion refuses to build).
func rawSTUN(typ uint16, attrType uint16, val []byte) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b, typ)
	binary.BigEndian.PutUint32(b[4:], 0x2112A442)
	if val != nil {
		b = binary.BigEndian.AppendUint16(b, attrType)
		b = binary.BigEndian.AppendUint16(b, uint16(len(val)))
		b = append(b, val...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)-20))
	return b
}

type fixture struct {
	r       *Relay
	keys    *token.Keyring
	members *membership.Table
	now     time.Time
}

func newFixture(tb testing.TB, cfg Config) *fixture {
	tb.Helper()
	return newTunedFixture(tb, cfg, defaultTuning)
}

// newTunedFixture is newFixture with the relay's tuning given.
func newTunedFixture(tb testing.TB, cfg Config, tune tuning) *fixture {
	tb.Helper()
	keys := testKeyring(tb, 1, 0xAA)
	keys.MaxAge = time.Hour
	members, err := membership.NewTable(map[uint32]netip.AddrPort{7: t7, 8: t8})
	if err != nil {
		tb.Fatal(err)
	}
	if cfg.PublicAddr == "" {
		cfg.PublicAddr, cfg.InternalAddr = "127.0.0.1:0", "127.0.0.1:0"
	}
	cfg.Cluster = testCluster
	cfg.Workers = 1
	r, err := newRelay(cfg, keys, members, nil, tune)
	if err != nil {
		tb.Fatal(err)
	}
	// Handler tests see every cap's drop: no waiting room holds what a cap
	// turned away (it needs New's sockets and loop; wait_test.go).
	r.wait = nil
	return &fixture{r: r, keys: keys, members: members, now: time.Now()}
}

// pub runs handlePublic on a copy of pkt placed after the headroom.
func (f *fixture) pub(from netip.AddrPort, pkt []byte) (netip.AddrPort, []byte, DropReason) {
	buf := make([]byte, hop.MaxHeaderLen+len(pkt))
	copy(buf[hop.MaxHeaderLen:], pkt)
	return f.r.handlePublic(from, buf, f.now)
}

func (f *fixture) internal(from, client netip.AddrPort, payload []byte) (netip.AddrPort, []byte, DropReason) {
	return f.r.handleInternal(from, append(hop.AppendHeader(nil, hop.TypeData, client), payload...), f.now)
}

func (f *fixture) good(transceiver uint32) []byte {
	return binding(testingTB{}, mint(testingTB{}, f.keys, testCluster, transceiver, f.now)+":cli1")
}

// testingTB lets fixtures build messages outside a test's Helper chain; any
// failure there is a broken test, so it panics.
type testingTB struct{ testing.TB }

func (testingTB) Helper()           {}
func (testingTB) Fatal(args ...any) { panic(args) }

var (
	c1 = netip.MustParseAddrPort("198.51.100.1:50000")
	c2 = netip.MustParseAddrPort("[2001:db8::2]:50001")
)

func TestHandlePublicDrops(t *testing.T) {
	f := newFixture(t, Config{})
	other := testKeyring(t, 1, 0xBB) // same key id, other secret
	retired := testKeyring(t, 9, 0xAA)
	tests := []struct {
		name string
		pkt  []byte
		want DropReason
	}{
		{"empty", nil, DropUnknownFirstByte},
		{"hop magic", []byte{hop.Magic, 0x11, 4, 0}, DropUnknownFirstByte},
		{"turn channel", []byte{0x40, 0, 0, 4}, DropUnknownFirstByte},
		{"dtls on miss", []byte{22, 0xfe, 0xfd, 0, 0}, DropNotSTUNOnMiss},
		{"rtp on miss", []byte{0x80, 111, 0, 1}, DropNotSTUNOnMiss},
		{"rtcp on miss", []byte{0x81, 200, 0, 1}, DropNotSTUNOnMiss},
		{"stun too short", []byte{0, 1, 0, 0}, DropSTUNMalformed},
		{"stun bad cookie", append([]byte{0, 1, 0, 0, 1, 2, 3, 4}, make([]byte, 12)...), DropSTUNMalformed},
		{"binding success", rawSTUN(0x0101, 0x0006, []byte("abcd:efgh")), DropSTUNNotBindingRequest},
		{"no username", rawSTUN(0x0001, 0x8022, []byte("soft")), DropNoUsername},
		{"username without colon", binding(t, mint(t, f.keys, testCluster, 7, f.now)), DropUsernameMalformed},
		{"username too long", rawSTUN(0x0001, 0x0006, bytes.Repeat([]byte("a"), 514)), DropUsernameMalformed},
		{"not a token", binding(t, "abcd:efgh"), DropTokenMalformed},
		{"token not base64", binding(t, strings.Repeat("-", token.Len)+":x"), DropTokenMalformed},
		{"forged token", binding(t, mint(t, other, testCluster, 7, f.now)+":x"), DropTokenForged},
		{"unknown key", binding(t, mint(t, retired, testCluster, 7, f.now)+":x"), DropTokenUnknownKey},
		{"expired token", binding(t, mint(t, f.keys, testCluster, 7, f.now.Add(-3*time.Hour))+":x"), DropTokenExpired},
		{"wrong cluster", binding(t, mint(t, f.keys, testCluster+1, 7, f.now)+":x"), DropWrongCluster},
		{"unknown transceiver", binding(t, mint(t, f.keys, testCluster, 99, f.now)+":x"), DropUnknownTransceiver},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			to, out, drop := f.pub(c1, tt.pkt)
			if drop != tt.want || out != nil || to.IsValid() {
				t.Fatalf("got (%v, %d bytes, %v), want drop %v", to, len(out), drop, tt.want)
			}
		})
	}
	if s := f.r.Stats(); s.Flows != 0 {
		t.Fatalf("%d flows created by rejected datagrams", s.Flows)
	}
}

func TestHandlePublicForwards(t *testing.T) {
	f := newFixture(t, Config{})
	for _, client := range []netip.AddrPort{c1, c2} {
		t.Run(client.String(), func(t *testing.T) {
			stunPkt := f.good(7)
			for _, tt := range []struct {
				name string
				pkt  []byte
			}{
				{"binding request creates the flow", stunPkt},
				{"dtls rides it", []byte{22, 0xfe, 0xfd, 1, 2, 3}},
				{"rtp rides it", []byte{0x80, 111, 0, 1, 9, 9}},
				{"rtcp rides it", []byte{0x81, 200, 0, 1}},
				{"consent check rides it", stunPkt},
				{"other stun rides it", rawSTUN(0x0011, 0x8022, []byte("x"))},
			} {
				to, out, drop := f.pub(client, tt.pkt)
				if drop != dropNone || to != t7 {
					t.Fatalf("%s: got (%v, %v), want forward to %v", tt.name, to, drop, t7)
				}
				_, gotClient, payload, err := hop.ParseHeader(out)
				if err != nil || gotClient != client || !bytes.Equal(payload, tt.pkt) {
					t.Fatalf("%s: header names %v (%v), payload %x; want %v and the datagram unchanged", tt.name, gotClient, err, payload, client)
				}
			}
		})
	}
	s := f.r.Stats()
	if s.Flows != 2 || s.PendingFlows != 2 || s.FlowsCreated != 2 {
		t.Fatalf("stats %+v, want 2 pending flows", s)
	}
	if _, _, drop := f.pub(c1, []byte{hop.Magic}); drop != DropUnknownFirstByte {
		t.Fatalf("unknown first byte on a flow: %v", drop)
	}
}

func TestHandleInternal(t *testing.T) {
	f := newFixture(t, Config{})
	if _, _, drop := f.pub(c1, f.good(7)); drop != dropNone {
		t.Fatal(drop)
	}
	payload := []byte{0x80, 0, 0, 1, 2, 3}
	hdr := hop.AppendHeader(nil, hop.TypeData, c1)
	tests := []struct {
		name string
		from netip.AddrPort
		b    []byte
		want DropReason
	}{
		{"non-member", netip.MustParseAddrPort("127.0.0.1:9999"), append(hdr, payload...), DropInternalUnknownPeer},
		{"member on another port", netip.MustParseAddrPort("127.0.0.1:4009"), append(hdr, payload...), DropInternalUnknownPeer},
		{"bad magic", t7, append([]byte{0x80}, payload...), DropInternalBadHeader},
		{"short", t7, hdr[:5], DropInternalBadHeader},
		{"empty payload", t7, hdr, DropInternalEmptyPayload},
		{"no flow", t7, hop.AppendHeader(nil, hop.TypeData, c2), DropInternalNoFlow},
		{"flow of another transceiver", t8, append(hdr, payload...), DropInternalFlowMismatch},
		{"reply", t7, append(bytes.Clone(hdr), payload...), dropNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "no flow" {
				tt.b = append(tt.b, payload...)
			}
			to, out, drop := f.r.handleInternal(tt.from, tt.b, f.now)
			if drop != tt.want {
				t.Fatalf("drop %v, want %v", drop, tt.want)
			}
			if drop == dropNone && (to != c1 || !bytes.Equal(out, payload)) {
				t.Fatalf("got (%v, %x), want (%v, %x)", to, out, c1, payload)
			}
			if drop != dropNone && out != nil {
				t.Fatal("output on a drop")
			}
		})
	}
	if s := f.r.Stats(); s.Flows != 1 || s.PendingFlows != 0 {
		t.Fatalf("stats %+v: the reply must confirm the flow", s)
	}
}

func TestFlowTableFull(t *testing.T) {
	f := newFixture(t, Config{MaxFlows: 1})
	if _, _, drop := f.pub(c1, f.good(7)); drop != dropNone {
		t.Fatal(drop)
	}
	if _, _, drop := f.pub(c2, f.good(7)); drop != DropFlowTableFull {
		t.Fatalf("second flow: %v, want %v", drop, DropFlowTableFull)
	}
	// The existing flow keeps working and is not evicted.
	if _, _, drop := f.pub(c1, []byte{0x80, 0}); drop != dropNone {
		t.Fatal(drop)
	}
	if s := f.r.Stats(); s.Flows != 1 {
		t.Fatalf("%d flows", s.Flows)
	}
}

func TestTransceiverGone(t *testing.T) {
	f := newFixture(t, Config{})
	if _, _, drop := f.pub(c1, f.good(7)); drop != dropNone {
		t.Fatal(drop)
	}
	if err := f.members.Set(map[uint32]netip.AddrPort{8: t8}); err != nil {
		t.Fatal(err)
	}
	if _, _, drop := f.pub(c1, []byte{0x80, 0}); drop != DropTransceiverGone {
		t.Fatalf("got %v, want %v", drop, DropTransceiverGone)
	}
	f.r.sweep(f.now)
	if s := f.r.Stats(); s.Flows != 0 {
		t.Fatal("sweeper kept a flow to a departed transceiver")
	}
}

func TestICERestart(t *testing.T) {
	f := newFixture(t, Config{})
	f.pub(c1, f.good(7))
	f.internal(t7, c1, []byte{1})
	if to, _, _ := f.pub(c1, f.good(7)); to != t7 {
		t.Fatal("a new token for the same transceiver must keep the route")
	}
	// A Binding request with an invalid new token does not move the flow.
	other := testKeyring(t, 1, 0xBB)
	if to, _, drop := f.pub(c1, binding(t, mint(t, other, testCluster, 8, f.now)+":x")); to != t7 || drop != dropNone {
		t.Fatalf("forged restart: (%v, %v), want the existing flow to %v", to, drop, t7)
	}
	// A valid token for transceiver 8: its Binding request goes to 8, but the
	// flow moves only when 8 answers (restart.go); media stays on 7 until then.
	if to, _, drop := f.pub(c1, f.good(8)); to != t8 || drop != dropNone {
		t.Fatalf("restart: (%v, %v), want %v", to, drop, t8)
	}
	if to, _, _ := f.pub(c1, []byte{0x80, 1}); to != t7 {
		t.Fatal("media moved before the new transceiver answered")
	}
	if _, _, drop := f.internal(t8, c1, []byte{1}); drop != dropNone {
		t.Fatalf("new transceiver's answer: %v", drop)
	}
	if s := f.r.Stats(); s.Flows != 1 || s.PendingFlows != 0 {
		t.Fatalf("stats %+v", s)
	}
	if _, _, drop := f.internal(t7, c1, []byte{1}); drop != DropInternalFlowMismatch {
		t.Fatalf("old transceiver after restart: %v", drop)
	}
	if to, _, _ := f.pub(c1, []byte{0x80, 1}); to != t8 {
		t.Fatal("media does not follow the restart")
	}
}

func TestSweep(t *testing.T) {
	f := newFixture(t, Config{PendingTimeout: time.Second, IdleTimeout: 5 * time.Second})
	f.pub(c1, f.good(7)) // stays pending
	f.pub(c2, f.good(7))
	f.internal(t7, c2, []byte{1}) // confirmed
	base := f.now
	at := func(d time.Duration) { f.r.sweep(base.Add(d)) }

	// Client retransmissions do not keep a pending flow alive.
	f.now = base.Add(900 * time.Millisecond)
	f.pub(c1, []byte{0x80, 0})
	at(500 * time.Millisecond)
	if s := f.r.Stats(); s.Flows != 2 {
		t.Fatalf("%d flows before any timeout", s.Flows)
	}
	at(1100 * time.Millisecond)
	if s := f.r.Stats(); s.Flows != 1 || s.PendingFlows != 0 || s.FlowsExpiredPending != 1 {
		t.Fatalf("after pending timeout: %+v", s)
	}
	// Traffic refreshes the confirmed flow.
	f.now = base.Add(4 * time.Second)
	if _, _, drop := f.internal(t7, c2, []byte{1}); drop != dropNone {
		t.Fatal(drop)
	}
	at(8 * time.Second)
	if s := f.r.Stats(); s.Flows != 1 {
		t.Fatal("refreshed confirmed flow expired")
	}
	at(9100 * time.Millisecond)
	if s := f.r.Stats(); s.Flows != 0 || s.FlowsExpiredConfirmed != 1 {
		t.Fatalf("after idle timeout: %+v", s)
	}
	if _, _, drop := f.internal(t7, c2, []byte{1}); drop != DropInternalNoFlow {
		t.Fatalf("reply after expiry: %v", drop)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{PublicAddr: ":3478", InternalAddr: ":0"}, ""},
		{"no public", Config{InternalAddr: ":0"}, "PublicAddr is empty"},
		{"bad internal", Config{PublicAddr: ":3478", InternalAddr: "3479"}, "InternalAddr \"3479\" is not host:port"},
		{"negative workers", Config{PublicAddr: ":1", InternalAddr: ":0", Workers: -1}, "Workers is -1"},
		{"too many workers", Config{PublicAddr: ":1", InternalAddr: ":0", Workers: 1000}, "at most"},
		{"negative pending", Config{PublicAddr: ":1", InternalAddr: ":0", PendingTimeout: -1}, "PendingTimeout"},
		{"negative idle", Config{PublicAddr: ":1", InternalAddr: ":0", IdleTimeout: -1}, "IdleTimeout"},
		{"negative max", Config{PublicAddr: ":1", InternalAddr: ":0", MaxFlows: -1}, "MaxFlows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tt.cfg.Workers < 1 || tt.cfg.PendingTimeout != DefaultPendingTimeout || tt.cfg.IdleTimeout != DefaultIdleTimeout || tt.cfg.MaxFlows != DefaultMaxFlows {
					t.Fatalf("defaults not filled: %+v", tt.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestDropReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for d := DropReason(1); d < NumDropReasons; d++ {
		s := d.String()
		if s == "" || s == "unknown" || seen[s] {
			t.Fatalf("reason %d has name %q", d, s)
		}
		seen[s] = true
	}
	if NumDropReasons.String() != "unknown" {
		t.Fatal("out of range reason")
	}
}

func TestHandlersAllocateNothing(t *testing.T) {
	// Limits high enough for one source to open a flow per iteration; the
	// limiter still runs on every first packet.
	f := newFixture(t, Config{NewFlowsPerIP: maxLimit, NewFlowsPerSecond: 1<<32 - 1})
	bind := f.good(7)
	buf := make([]byte, hop.MaxHeaderLen+1500)
	load := func(pkt []byte) []byte { return buf[:hop.MaxHeaderLen+copy(buf[hop.MaxHeaderLen:], pkt)] }
	rtp := append([]byte{0x80, 111}, make([]byte, 158)...)

	// First packet: STUN peek, token open, flow create. The flow is removed
	// after each run, so its struct comes back from the shard's free list.
	n := testing.AllocsPerRun(1000, func() {
		if _, _, drop := f.r.handlePublic(c1, load(bind), f.now); drop != dropNone {
			t.Fatal(drop)
		}
		f.r.flows.remove(c1)
	})
	if n != 0 {
		t.Errorf("first packet: %v allocations, want 0", n)
	}
	f.r.handlePublic(c1, load(bind), f.now)
	for _, tt := range []struct {
		name string
		pkt  []byte
	}{{"hit rtp", rtp}, {"hit consent check", bind}} {
		if n := testing.AllocsPerRun(1000, func() {
			if _, _, drop := f.r.handlePublic(c1, load(tt.pkt), f.now); drop != dropNone {
				t.Fatal(drop)
			}
		}); n != 0 {
			t.Errorf("handlePublic %s: %v allocations, want 0", tt.name, n)
		}
	}
	reply := append(hop.AppendHeader(nil, hop.TypeData, c1), rtp...)
	if n := testing.AllocsPerRun(1000, func() {
		if _, _, drop := f.r.handleInternal(t7, reply, f.now); drop != dropNone {
			t.Fatal(drop)
		}
	}); n != 0 {
		t.Errorf("handleInternal: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		f.r.handlePublic(c2, load(rtp), f.now) // drop path
	}); n != 0 {
		t.Errorf("drop: %v allocations, want 0", n)
	}
}

func BenchmarkHandlePublicHit(b *testing.B) {
	f := newFixture(b, Config{})
	f.pub(c1, f.good(7))
	buf := make([]byte, hop.MaxHeaderLen+160)
	buf[hop.MaxHeaderLen] = 0x80
	b.ReportAllocs()
	for b.Loop() {
		f.r.handlePublic(c1, buf, f.now)
	}
}

func BenchmarkHandleInternal(b *testing.B) {
	f := newFixture(b, Config{})
	f.pub(c1, f.good(7))
	reply := append(hop.AppendHeader(nil, hop.TypeData, c1), make([]byte, 160)...)
	b.ReportAllocs()
	for b.Loop() {
		f.r.handleInternal(t7, reply, f.now)
	}
}

func BenchmarkFirstPacket(b *testing.B) {
	// Limits high enough for one source to open a flow per iteration; the
	// limiter still runs on every first packet.
	f := newFixture(b, Config{NewFlowsPerIP: maxLimit, NewFlowsPerSecond: 1<<32 - 1})
	bind := f.good(7)
	buf := make([]byte, hop.MaxHeaderLen+len(bind))
	b.ReportAllocs()
	now := f.now
	for b.Loop() {
		copy(buf[hop.MaxHeaderLen:], bind)
		now = now.Add(2 * time.Microsecond) // under maxLimit new flows per one-second window
		if _, _, drop := f.r.handlePublic(c1, buf, now); drop != dropNone {
			b.Fatal(drop)
		}
		f.r.flows.remove(c1)
	}
}

// BenchmarkFlowLookup looks up one of 100k flows from all Ps at once.
func BenchmarkFlowLookup(b *testing.B) {
	tab := newFlowTable(1 << 20)
	var clients []netip.AddrPort
	for i := range 100_000 {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(1024+i%50000))
		clients = append(clients, c)
		tab.upsert(c, t7, 7, nil, 1)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			tab.touch(clients[i%len(clients)], 2)
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				tab.touch(clients[i%len(clients)], 2)
				i += 7
			}
		})
	})
}

// BenchmarkTokenOpen is the token decode on the first packet: base64,
// one AES block for the tag, one to decrypt.
func BenchmarkTokenOpen(b *testing.B) {
	f := newFixture(b, Config{})
	u := []byte(mint(b, f.keys, testCluster, 7, f.now))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.r.keys.Open(u, f.now); err != nil {
			b.Fatal(err)
		}
	}
}

// isHeld reports a handler's third outcome: neither forwarded nor dropped,
// but handed to the flow cache (flowcache.go).
func isHeld(out []byte, drop DropReason) bool { return out == nil && drop == dropNone }
