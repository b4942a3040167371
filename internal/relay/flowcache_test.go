package relay

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/flowstore"
	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/redistest"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

func init() { flowstore.LogRedisTo(slog.New(slog.DiscardHandler)) }

// newCache returns a flow cache for testCluster in the Redis at addr.
func newCache(t *testing.T, addr string) *flowstore.Redis {
	t.Helper()
	c, err := flowstore.New(addr, testCluster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// gatedCache holds every lookup until its gate is closed.
type gatedCache struct {
	FlowStore
	gate chan struct{}
}

func (g *gatedCache) Get(ctx context.Context, clients []netip.AddrPort, values [][]byte) error {
	if len(clients) == 1 && !clients[0].IsValid() { // the writer's start-up probe
		return g.FlowStore.Get(ctx, clients, values)
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.FlowStore.Get(ctx, clients, values)
}

// withCache returns the default tuning with the flow cache's parameters p.
func withCache(p cacheParams) tuning {
	t := defaultTuning
	t.cache = p
	return t
}

// newCacheRelay starts a relay with cache store for the members of e (the
// env's transceiver 7), logging to log (nil: nowhere).
func newCacheRelay(t *testing.T, e *env, store FlowStore, p *cacheParams, log *slog.Logger) *Relay {
	t.Helper()
	return newCacheRelayWith(t, e, Config{FlowStore: store}, p, log)
}

// newCacheRelayWith is newCacheRelay with more of the config (cfg.FlowStore
// is the store).
func newCacheRelayWith(t *testing.T, e *env, cfg Config, p *cacheParams, log *slog.Logger) *Relay {
	t.Helper()
	tune := defaultTuning
	if p != nil {
		tune.cache = *p
	}
	cfg.PublicAddr, cfg.InternalAddr, cfg.Cluster, cfg.Workers = "127.0.0.1:0", "127.0.0.1:0", testCluster, 2
	r, err := start(cfg, e.keys, e.members, prometheus.NewRegistry(), log, tune)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// confirm runs the first Binding request of client through r to e's
// transceiver and its answer back, and returns the request.
func confirm(t *testing.T, e *env, r *Relay, client *net.UDPConn) []byte {
	t.Helper()
	req := e.binding(t, 7)
	send(t, client, req, r.PublicAddr())
	got, _ := recv(t, e.tr)
	if _, named, _, err := hop.ParseHeader(got); err != nil || named != addrOf(client) {
		t.Fatalf("transceiver got %x", got)
	}
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, addrOf(client)), 0x01, 0x01, 0, 0), r.InternalAddr())
	recv(t, client)
	return req
}

// TestFlowCacheRestoresAfterRestart: a relay confirms a flow and writes it
// to the cache; a new relay with the same cache gets the client's DTLS and
// RTP without any STUN, holds them while it asks the cache, and delivers
// them in order to the right transceiver; the flow then works both ways.
func TestFlowCacheRestoresAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	e := newEnv(t, Config{}, nil) // only for its keys, members and transceiver socket
	e.r.Close()
	client := udp(t)

	// No refresh pass within the test: only the write at confirmation can
	// put the flow in the cache. (A 250 ms bound on that write used to
	// stand for this; it measured Redis and the race detector on a loaded
	// machine as much as the relay.)
	firstParams := defaultCacheParams
	firstParams.refresh = time.Hour
	first := newCacheRelay(t, e, newCache(t, srv.Addr), &firstParams, nil)
	confirm(t, e, first, client)
	eventually(t, "the confirmed flow written at its confirmation", func() bool { return first.Stats().FlowCache.WritesOK >= 1 })
	first.Close()

	p := defaultCacheParams
	p.hold = 5 * time.Second // the gate below decides when the lookup answers
	gated := &gatedCache{FlowStore: newCache(t, srv.Addr), gate: make(chan struct{})}
	second := newCacheRelay(t, e, gated, &p, nil)
	pkts := [][]byte{{22, 0xfe, 0xfd, 0, 0, 0, 1}, mediaPkt(1), mediaPkt(2), mediaPkt(3)}
	for _, pkt := range pkts {
		send(t, client, pkt, second.PublicAddr())
	}
	eventually(t, "4 datagrams held", func() bool { return second.Stats().FlowCache.Held == 4 })
	expectNothing(t, e.tr)
	close(gated.gate)
	for i, want := range pkts {
		got, from := recv(t, e.tr)
		_, named, payload, err := hop.ParseHeader(got)
		if err != nil || named != addrOf(client) || !bytes.Equal(payload, want) || from != second.InternalAddr() {
			t.Fatalf("held datagram %d: %x for %v from %v (%v), want %x for %v", i, payload, named, from, err, want, addrOf(client))
		}
	}
	// The restored flow carries what follows, both ways.
	send(t, client, mediaPkt(4), second.PublicAddr())
	if got, _ := recv(t, e.tr); !bytes.HasSuffix(got, mediaPkt(4)) {
		t.Fatalf("after restore: %x", got)
	}
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, addrOf(client)), mediaPkt(9)...), second.InternalAddr())
	if got, from := recv(t, client); !bytes.Equal(got, mediaPkt(9)) || from != second.PublicAddr() {
		t.Fatalf("reply after restore: %x from %v", got, from)
	}
	s := second.Stats()
	if s.FlowsRestored != 1 || s.FlowsCreated != 1 || s.Flows != 1 || s.PendingFlows != 0 || s.FlowCache.Hits != 1 || s.FlowCache.Forwarded != 4 || s.Dropped() != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestFlowCacheDown: with the cache unreachable (nothing listening, or a
// Redis killed under a running relay), the relay forwards STUN-made flows
// as usual, drops misses at once as flow_cache_down, logs it once per
// interval, and leaks nothing (TestMain's goleak).
func TestFlowCacheDown(t *testing.T) {
	// go-redis probes a dead server from a goroutine that sees its pool
	// closed only after a 1 s sleep: let it go before goleak looks.
	t.Cleanup(func() { time.Sleep(1200 * time.Millisecond) })
	for _, tt := range []struct {
		name   string
		killed bool
	}{{"closed port", false}, {"killed", true}} {
		t.Run(tt.name, func(t *testing.T) {
			var addr string
			var srv *redistest.Server
			if tt.killed {
				srv = redistest.Start(t)
				addr = srv.Addr
			} else {
				addr = fmt.Sprintf("127.0.0.1:%d", redistest.ClosedPort(t))
			}
			e := newEnv(t, Config{}, nil)
			e.r.Close()
			logs := &logbuf.Buffer{}
			r := newCacheRelay(t, e, newCache(t, addr), nil, slog.New(slog.NewTextHandler(logs, nil)))
			if tt.killed {
				eventually(t, "a working probe", func() bool { return r.Stats().FlowCache.Up })
				srv.Stop()
			}
			// STUN still makes flows, and media rides them.
			client := udp(t)
			confirm(t, e, r, client)
			send(t, client, mediaPkt(1), r.PublicAddr())
			if got, _ := recv(t, e.tr); !bytes.HasSuffix(got, mediaPkt(1)) {
				t.Fatalf("media: %x", got)
			}
			eventually(t, "the cache seen down", func() bool { return !r.Stats().FlowCache.Up })
			// Misses: dropped at once, under flow_cache_down, for seconds.
			stranger := udp(t)
			const n = 40
			for i := range n {
				send(t, stranger, mediaPkt(uint32(i)), r.PublicAddr())
				time.Sleep(25 * time.Millisecond)
			}
			eventually(t, "every miss counted", func() bool {
				s := r.Stats()
				return s.Drops[DropFlowCacheDown]+s.Drops[DropFlowCacheTimeout] == n
			})
			s := r.Stats()
			if s.Drops[DropFlowCacheTimeout] != 0 || s.FlowsRestored != 0 || s.Flows != 1 {
				t.Fatalf("stats %+v", s)
			}
			expectNothing(t, e.tr)
			if got := logs.Count("flow cache unreachable"); got != 1 {
				t.Fatalf("%d 'unreachable' log lines in a second of failures, want 1:\n%s", got, logs.String())
			}
		})
	}
}

// TestFlowCacheHoldBounds floods misses from many clients at a relay whose
// lookups never answer: held datagrams stay within the per-client cap and
// the pool, every other datagram is counted, the miss path allocates
// nothing, and when the lookups time out every buffer comes back.
func TestFlowCacheHoldBounds(t *testing.T) {
	srv := redistest.Start(t)
	p := defaultCacheParams
	p.bufs, p.buckets, p.perClient = 64, 16, 4
	gated := &gatedCache{FlowStore: newCache(t, srv.Addr), gate: make(chan struct{})}
	f := newTunedFixture(t, Config{FlowStore: gated}, withCache(p))
	fc := f.r.fc
	rtp := mediaPkt(1)
	const clients, each = 2000, 10
	held := 0
	drops := map[DropReason]int{}
	for i := range clients {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 40000)
		for range each {
			_, out, drop := f.pub(c, rtp)
			if isHeld(out, drop) {
				held++
			} else {
				drops[drop]++
			}
		}
	}
	if held > p.bufs || held == 0 || int(fc.held.Load()) != held {
		t.Fatalf("held %d (counter %d), pool %d", held, fc.held.Load(), p.bufs)
	}
	if len(drops) != 1 || drops[DropFlowCacheHoldFull] != clients*each-held {
		t.Fatalf("drops %v", drops)
	}
	for i := range fc.entries {
		if e := &fc.entries[i]; int(e.n) > p.perClient {
			t.Fatalf("entry %d holds %d datagrams, cap %d", i, e.n, p.perClient)
		}
	}
	if len(fc.slab) != p.bufs*batchSlot || len(fc.entries) != p.buckets*holdWays {
		t.Fatal("pool or table grew")
	}
	// The miss path that parks and enqueues (the table above is full, so
	// measure on an empty one) allocates nothing. Each run frees the
	// entry as the resolver would, so that every run takes that path.
	{
		g := newFixture(t, Config{FlowStore: nopCache{}})
		buf := make([]byte, hop.MaxHeaderLen+len(rtp))
		copy(buf[hop.MaxHeaderLen:], rtp)
		k := keyOf(c1)
		var other int
		if n := testing.AllocsPerRun(1000, func() {
			if _, out, drop := g.r.handlePublic(c1, buf, g.now); !isHeld(out, drop) {
				other++
				return
			}
			<-g.r.fc.lookups
			g.r.fc.finish(k, DropFlowCacheMiss, 0)
		}); n != 0 || other != 0 {
			t.Errorf("miss path: %v allocations, %d runs not held; want 0, 0", n, other)
		}
	}
	// The lookups time out (the gate never opens): every held datagram is
	// dropped as flow_cache_timeout and its buffer returns.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fc.p.hold = 50 * time.Millisecond
	var wg sync.WaitGroup
	f.r.wg.Add(1)
	wg.Go(func() { fc.resolveLoop(ctx) })
	eventually(t, "every held datagram accounted", func() bool {
		s := f.r.Stats()
		return s.Drops[DropFlowCacheTimeout]+s.Drops[DropFlowCacheDown] == uint64(held) &&
			len(fc.free) == p.bufs
	})
	cancel()
	wg.Wait()
}

// TestFlowCacheNeverInvents: a client gets a flow from the cache only if
// the cache has one for it, naming a current member by id and address.
// Misses are remembered, so a stream costs one lookup.
func TestFlowCacheNeverInvents(t *testing.T) {
	srv := redistest.Start(t)
	store := newCache(t, srv.Addr)
	e := newEnv(t, Config{}, nil)
	e.r.Close()
	trAddr := addrOf(e.tr)
	var uf [token.Len / 8]uint64
	uf, _ = ufragWords([]byte(mint(t, e.keys, testCluster, 7, e.now)))
	val := func(dst netip.AddrPort, tr uint32) []byte {
		return appendCachedFlow(nil, &flowInfo{dst: dst, tr: tr, ufrag: uf})
	}
	p := defaultCacheParams
	p.negative = time.Hour
	r := newCacheRelay(t, e, store, &p, nil)
	tests := []struct {
		name  string
		value []byte // nil: no entry
		drop  DropReason
	}{
		{"no entry", nil, DropFlowCacheMiss},
		{"member's address, another id", val(trAddr, 8), DropFlowCacheStale},
		{"member's id, another address", val(netip.MustParseAddrPort("192.0.2.7:4000"), 7), DropFlowCacheStale},
		{"unknown id", val(trAddr, 99), DropFlowCacheStale},
		{"garbage", []byte("2 not-an-address 7 - -"), DropFlowCacheStale},
		{"version 1 (no via)", []byte("1 " + trAddr.String() + " 7 -"), DropFlowCacheStale},
		{"id 0", val(trAddr, 0), DropFlowCacheStale},
		{"valid", val(trAddr, 7), dropNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := udp(t)
			if tt.value != nil {
				if err := store.Put(context.Background(), []netip.AddrPort{addrOf(client)}, [][]byte{tt.value}, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			before := r.Stats()
			send(t, client, mediaPkt(1), r.PublicAddr())
			if tt.drop == dropNone {
				if got, _ := recv(t, e.tr); !bytes.HasSuffix(got, mediaPkt(1)) {
					t.Fatalf("got %x", got)
				}
				if dst, ok := r.flows.touch(addrOf(client), 0); !ok || dst != trAddr {
					t.Fatalf("flow %v %v", dst, ok)
				}
				return
			}
			eventually(t, tt.drop.String(), func() bool { return r.Stats().Drops[tt.drop] == before.Drops[tt.drop]+1 })
			// Remembered: more datagrams are dropped without another lookup.
			for i := range 5 {
				send(t, client, mediaPkt(uint32(2+i)), r.PublicAddr())
			}
			eventually(t, "the stream dropped", func() bool { return r.Stats().Drops[tt.drop] == before.Drops[tt.drop]+6 })
			after := r.Stats()
			looked := func(s Stats) uint64 {
				return s.FlowCache.Hits + s.FlowCache.Misses + s.FlowCache.Stale + s.FlowCache.Errors + s.FlowCache.Refused
			}
			if looked(after)-looked(before) != 1 {
				t.Fatalf("%d lookups for one client's stream", looked(after)-looked(before))
			}
			if _, ok := r.flows.touch(addrOf(client), 0); ok || after.FlowsRestored != before.FlowsRestored {
				t.Fatal("a flow from nothing")
			}
			expectNothing(t, e.tr)
		})
	}
	// The members' side: a member changing address makes its entries stale.
	if err := e.members.Set(map[uint32]netip.AddrPort{7: netip.MustParseAddrPort("127.0.0.1:1")}); err != nil {
		t.Fatal(err)
	}
	client := udp(t)
	if err := store.Put(context.Background(), []netip.AddrPort{addrOf(client)}, [][]byte{val(trAddr, 7)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The client's stream, not one datagram: a datagram arriving while a
	// hold cap refusal for 127.0.0.1 from the cases above is still
	// remembered (150 ms) is refused without a lookup, as a real
	// client's next packet would not be.
	eventually(t, "stale after a member moved", func() bool {
		send(t, client, mediaPkt(1), r.PublicAddr())
		return r.Stats().FlowCache.Stale >= 6
	})
	if _, ok := r.flows.touch(addrOf(client), 0); ok {
		t.Fatal("a flow restored from a stale entry")
	}
}

// TestCachedFlowEncoding round-trips values and rejects malformed ones.
func TestCachedFlowEncoding(t *testing.T) {
	uf, _ := ufragWords(bytes.Repeat([]byte("A"), token.Len))
	for _, f := range []flowInfo{
		{dst: netip.MustParseAddrPort("10.0.0.5:4000"), tr: 7, ufrag: uf},
		{dst: netip.MustParseAddrPort("[2001:db8::5]:4000"), tr: 1<<32 - 1},
		{dst: netip.MustParseAddrPort("10.0.0.5:4000"), tr: 7, ufrag: uf, via: netip.MustParseAddrPort("192.0.2.10:3479")},
		{
			dst: netip.MustParseAddrPort("[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535"), tr: 1<<32 - 1, ufrag: uf,
			via: netip.MustParseAddrPort("[2001:db8:ffff:ffff:ffff:ffff:ffff:fffe]:65535"),
		},
	} {
		v := appendCachedFlow(nil, &f)
		cf, ok := parseCachedFlow(v)
		if !ok || cf.dst != f.dst || cf.via != f.via || cf.transceiver != f.tr || len(v) > maxCachedValue {
			t.Fatalf("%q → %+v %v", v, cf, ok)
		}
		if got, _ := ufragWords(cf.ufrag); got != f.ufrag {
			t.Fatalf("ufrag %q", cf.ufrag)
		}
	}
	for _, v := range []string{
		"", "2", "2 10.0.0.5:4000 7 -", "2 10.0.0.5:0 7 - -", "2 10.0.0.5:4000 -1 - -", "2 10.0.0.5:4000 7 short -",
		"2  10.0.0.5:4000 7 - -", "2 10.0.0.5:4000 7 - 192.0.2.1:0", "2 10.0.0.5:4000 7 - x", "2 10.0.0.5:4000 7 - - -",
		"1 10.0.0.5:4000 7 -", // version 1: no via
		strings.Repeat("x", 200),
	} {
		if _, ok := parseCachedFlow([]byte(v)); ok {
			t.Errorf("%q parsed", v)
		}
	}
}

// BenchmarkFlowCacheMiss is the read loop's cost of a miss with the cache
// on: hold (copy into a pooled buffer, enqueue the lookup). Each iteration
// also frees the entry, as the resolver would.
func BenchmarkFlowCacheMiss(b *testing.B) {
	f := newFixture(b, Config{FlowStore: nopCache{}})
	fc := f.r.fc
	buf := make([]byte, hop.MaxHeaderLen+160)
	buf[hop.MaxHeaderLen] = 0x80
	k := keyOf(c1)
	b.ReportAllocs()
	for b.Loop() {
		if _, out, drop := f.r.handlePublic(c1, buf, f.now); !isHeld(out, drop) {
			b.Fatal(drop)
		}
		<-fc.lookups
		fc.finish(k, DropFlowCacheMiss, 0)
	}
}

// BenchmarkFlowCacheNegative is a miss the cache already answered (a
// client's stream after its lookup missed): dropped in the read loop.
func BenchmarkFlowCacheNegative(b *testing.B) {
	f := newFixture(b, Config{FlowStore: nopCache{}})
	buf := make([]byte, hop.MaxHeaderLen+160)
	buf[hop.MaxHeaderLen] = 0x80
	f.r.handlePublic(c1, buf, f.now)
	<-f.r.fc.lookups
	f.r.fc.finish(keyOf(c1), DropFlowCacheMiss, f.r.mono(f.now)+int64(time.Hour))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, drop := f.r.handlePublic(c1, buf, f.now); drop != DropFlowCacheMiss {
			b.Fatal(drop)
		}
	}
}

// BenchmarkHandlePublicHitCache is BenchmarkHandlePublicHit with the
// cache on: the hit path must not change.
func BenchmarkHandlePublicHitCache(b *testing.B) {
	f := newFixture(b, Config{FlowStore: nopCache{}})
	f.pub(c1, f.good(7))
	buf := make([]byte, hop.MaxHeaderLen+160)
	buf[hop.MaxHeaderLen] = 0x80
	b.ReportAllocs()
	for b.Loop() {
		f.r.handlePublic(c1, buf, f.now)
	}
}

// BenchmarkHandleInternalCache is BenchmarkHandleInternal with the cache on.
func BenchmarkHandleInternalCache(b *testing.B) {
	f := newFixture(b, Config{FlowStore: nopCache{}})
	f.pub(c1, f.good(7))
	reply := append(hop.AppendHeader(nil, hop.TypeData, c1), make([]byte, 160)...)
	b.ReportAllocs()
	for b.Loop() {
		f.r.handleInternal(t7, reply, f.now)
	}
}

// nopCache has nothing and stores nothing.
type nopCache struct{}

func (nopCache) Put(context.Context, []netip.AddrPort, [][]byte, time.Duration) error { return nil }
func (nopCache) Get(_ context.Context, _ []netip.AddrPort, v [][]byte) error {
	clear(v)
	return nil
}

// cacheValue reads client's entry from store, decoded.
func cacheValue(t *testing.T, store FlowStore, client netip.AddrPort) (cachedFlow, []byte) {
	t.Helper()
	v := make([][]byte, 1)
	if err := store.Get(context.Background(), []netip.AddrPort{client}, v); err != nil {
		t.Fatal(err)
	}
	cf, _ := parseCachedFlow(v[0])
	return cf, v[0]
}

// holding counts the hold table's entries waiting for a lookup.
func holding(fc *flowCache) int {
	n := 0
	for b := 0; b < len(fc.entries)/holdWays; b++ {
		st := &fc.stripes[b%holdStripes]
		st.mu.Lock()
		for _, e := range fc.entries[b*holdWays : (b+1)*holdWays] {
			if e.state == holdLookup {
				n++
			}
		}
		st.mu.Unlock()
	}
	return n
}

// TestFlowCacheRelearnWritesRealID: a flow relearned from a transceiver's
// datagram is written with the member's real id (never 0), so another
// relay restores it instead of finding it stale; and a flow without an id
// is never written.
func TestFlowCacheRelearnWritesRealID(t *testing.T) {
	srv := redistest.Start(t)
	store := newCache(t, srv.Addr)
	e := newEnv(t, Config{}, nil)
	e.r.Close()
	trAddr := addrOf(e.tr)
	client := udp(t)
	c := addrOf(client)
	// The cache has the good entry the client's first relay wrote.
	uf, _ := ufragWords([]byte(mint(t, e.keys, testCluster, 7, e.now)))
	good := appendCachedFlow(nil, &flowInfo{dst: trAddr, tr: 7, ufrag: uf})
	if err := store.Put(context.Background(), []netip.AddrPort{c}, [][]byte{good}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// A restarted relay relearns the flow from the transceiver's reply.
	first := newCacheRelayWith(t, e, Config{FlowStore: store, Relearn: true}, nil, nil)
	send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeData, c), mediaPkt(9)...), first.InternalAddr())
	if got, _ := recv(t, client); !bytes.Equal(got, mediaPkt(9)) {
		t.Fatalf("relearned reply %x", got)
	}
	eventually(t, "the relearned flow written", func() bool { return first.Stats().FlowCache.WritesOK >= 1 })
	if cf, raw := cacheValue(t, store, c); cf.transceiver != 7 || cf.dst != trAddr || cf.via.IsValid() {
		t.Fatalf("relearned flow written as %q, want transceiver 7 at %v, direct", raw, trAddr)
	}
	first.Close()
	// The next relay restores it.
	second := newCacheRelay(t, e, store, nil, nil)
	send(t, client, mediaPkt(1), second.PublicAddr())
	if got, _ := recv(t, e.tr); !bytes.HasSuffix(got, mediaPkt(1)) {
		t.Fatalf("restored: %x", got)
	}
	if s := second.Stats(); s.FlowCache.Hits != 1 || s.FlowCache.Stale != 0 || s.FlowsRestored != 1 {
		t.Fatalf("stats %+v", s.FlowCache)
	}
	// A flow without a transceiver id is never written.
	w := &cacheWriter{fc: second.fc}
	w.put(context.Background(), c, &flowInfo{dst: trAddr, confirmed: true})
	if len(w.clients) != 0 {
		t.Fatal("a flow with transceiver id 0 queued for the cache")
	}
}

// TestFlowCacheHoldPerSource: one source IP (IPv6: one /64) gets at most
// perSource clients waiting for lookups and sourceBufs held datagrams;
// another source still gets held.
func TestFlowCacheHoldPerSource(t *testing.T) {
	for _, tt := range []struct {
		name string
		addr func(i int) netip.AddrPort
	}{
		{"IPv4 ports", func(i int) netip.AddrPort {
			return netip.AddrPortFrom(netip.MustParseAddr("198.51.100.9"), uint16(1024+i))
		}},
		{"IPv6 /64", func(i int) netip.AddrPort {
			a := netip.MustParseAddr("2001:db8:1:2::").As16()
			a[14], a[15] = byte(i>>8), byte(i)
			return netip.AddrPortFrom(netip.AddrFrom16(a), 5000)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := defaultCacheParams
			p.perSource, p.sourceBufs = 8, 12
			f := newTunedFixture(t, Config{FlowStore: &gatedCache{FlowStore: nopCache{}, gate: make(chan struct{})}}, withCache(p))
			fc := f.r.fc
			held := 0
			for i := range 1000 {
				for range 3 {
					if _, out, drop := f.pub(tt.addr(i), mediaPkt(1)); isHeld(out, drop) {
						held++
					} else if drop != DropFlowCacheHoldFull {
						t.Fatalf("flood: %v", drop)
					}
				}
			}
			if n := holding(fc); n > p.perSource || held > p.sourceBufs || held < p.perSource {
				t.Fatalf("one source: %d clients waiting, %d datagrams held; caps %d, %d", n, held, p.perSource, p.sourceBufs)
			}
			if _, out, drop := f.pub(c1, mediaPkt(1)); !isHeld(out, drop) {
				t.Fatalf("another source: %v", drop)
			}
			// Ending the lookups gives the source its share back.
			for range holding(fc) {
				fc.finish(<-fc.lookups, DropFlowCacheMiss, 0)
			}
			if got := fc.source(ptr(keyOf(tt.addr(0)))).Load(); got != 0 {
				t.Fatalf("source counts %#x after every lookup ended", got)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestFlowCacheSourceFlood: one IP sends 12,000 one-datagram fake DTLS
// packets from different ports in half a second (each a miss, remembered);
// a real client with a valid entry is still restored right after.
func TestFlowCacheSourceFlood(t *testing.T) {
	srv := redistest.Start(t)
	store := newCache(t, srv.Addr)
	e := newEnv(t, Config{}, nil)
	e.r.Close()
	p := defaultCacheParams
	p.negative = 10 * time.Second // the flood's misses stay remembered through the test
	r := newCacheRelay(t, e, store, &p, nil)
	dtls := []byte{22, 0xfe, 0xfd, 0, 0, 0, 1}
	buf := make([]byte, hop.MaxHeaderLen+len(dtls))
	flooder := netip.MustParseAddr("203.0.113.5")
	const n = 12000
	start := time.Now()
	drops := map[DropReason]int{}
	for i := range n {
		copy(buf[hop.MaxHeaderLen:], dtls)
		_, _, drop := r.handlePublic(netip.AddrPortFrom(flooder, uint16(1024+i)), buf, time.Now())
		drops[drop]++
		if i%500 == 499 {
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * 500 * time.Millisecond / n)))
		}
	}
	eventually(t, "the flood's lookups answered", func() bool { return holding(r.fc) == 0 })
	t.Logf("flood: %v in %v; lookups: %d misses; drops %v", n, time.Since(start).Round(time.Millisecond), r.Stats().FlowCache.Misses, drops)

	client := udp(t)
	uf, _ := ufragWords([]byte(mint(t, e.keys, testCluster, 7, e.now)))
	val := appendCachedFlow(nil, &flowInfo{dst: addrOf(e.tr), tr: 7, ufrag: uf})
	if err := store.Put(context.Background(), []netip.AddrPort{addrOf(client)}, [][]byte{val}, time.Minute); err != nil {
		t.Fatal(err)
	}
	send(t, client, dtls, r.PublicAddr())
	got, _, err := tryRecv(e.tr, 2*time.Second)
	if err != nil || !bytes.HasSuffix(got, dtls) {
		s := r.Stats()
		t.Fatalf("real client after the flood: %x (%v); hold_full %d, restored %d", got, err, s.Drops[DropFlowCacheHoldFull], s.FlowsRestored)
	}
	if s := r.Stats(); s.FlowsRestored != 1 {
		t.Fatalf("restored %d", s.FlowsRestored)
	}
}

// slowStore answers every Get after delay, with no entries.
type slowStore struct {
	delay time.Duration
	gets  atomic.Int64
}

func (s *slowStore) Put(context.Context, []netip.AddrPort, [][]byte, time.Duration) error { return nil }
func (s *slowStore) Get(ctx context.Context, clients []netip.AddrPort, v [][]byte) error {
	s.gets.Add(1)
	tm := time.NewTimer(s.delay)
	defer tm.Stop()
	select {
	case <-tm.C:
		clear(v)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestFlowCacheSlowStore: a store that answers every Get in 120 ms, under
// steady misses, is up: no lookup errors, no back-off. Held datagrams
// whose answer comes after the hold time are dropped as
// flow_cache_timeout, and every one is accounted for. A store slower than
// the Get timeout is down.
func TestFlowCacheSlowStore(t *testing.T) {
	for _, tt := range []struct {
		name  string
		delay time.Duration
		up    bool
	}{{"120ms", 120 * time.Millisecond, true}, {"beyond the Get timeout", 400 * time.Millisecond, false}} {
		t.Run(tt.name, func(t *testing.T) {
			p := defaultCacheParams
			p.getTimeout = 300 * time.Millisecond
			store := &slowStore{delay: tt.delay}
			f := newTunedFixture(t, Config{FlowStore: store}, withCache(p))
			fc := f.r.fc
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			f.r.wg.Add(1)
			wg.Go(func() { fc.resolveLoop(ctx) })
			defer func() { cancel(); wg.Wait() }()
			buf := make([]byte, hop.MaxHeaderLen+32)
			held, other := 0, map[DropReason]int{}
			for i := range 150 { // a new client every 10 ms for 1.5 s
				c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), 40000)
				for range 2 {
					copy(buf[hop.MaxHeaderLen:], mediaPkt(1))
					if _, out, drop := f.r.handlePublic(c, buf, time.Now()); isHeld(out, drop) {
						held++
					} else {
						other[drop]++
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			if !tt.up {
				eventually(t, "the store seen down", func() bool { return !f.r.Stats().FlowCache.Up })
				if s := f.r.Stats(); s.FlowCache.Errors == 0 || s.Drops[DropFlowCacheDown]+uint64(other[DropFlowCacheDown]) == 0 {
					t.Fatalf("stats %+v, drops %v", s.FlowCache, other)
				}
				return
			}
			eventually(t, "every lookup ended", func() bool { return holding(fc) == 0 })
			s := f.r.Stats()
			t.Logf("gets %d; held %d: miss %d, timeout %d; at hold %v", store.gets.Load(), held, s.Drops[DropFlowCacheMiss], s.Drops[DropFlowCacheTimeout], other)
			if !s.FlowCache.Up || s.FlowCache.Errors != 0 || fc.backoff.Load() != 0 || s.Drops[DropFlowCacheDown] != 0 || other[DropFlowCacheDown] != 0 {
				t.Fatalf("a store answering in %v seen as failing: %+v, backoff %v, down drops %d+%d",
					tt.delay, s.FlowCache, time.Duration(fc.backoff.Load()), s.Drops[DropFlowCacheDown], other[DropFlowCacheDown])
			}
			if got := s.Drops[DropFlowCacheMiss] + s.Drops[DropFlowCacheTimeout]; got != uint64(held) {
				t.Fatalf("%d of %d held datagrams accounted", got, held)
			}
			if s.FlowCache.Misses < 50 {
				t.Fatalf("only %d answers", s.FlowCache.Misses)
			}
		})
	}
}

// TestFlowCacheRestoresOnlyTheSamePath: a cached flow records whether its
// client's traffic came through a Global Relay, and which; a held datagram
// restores it only if it came the same way. Otherwise (a direct datagram
// with the address of a client behind a Global Relay, anyone can send
// one) the entry is stale and no flow is made.
func TestFlowCacheRestoresOnlyTheSamePath(t *testing.T) {
	srv := redistest.Start(t)
	store := newCache(t, srv.Addr)
	e := newEnv(t, Config{}, nil)
	e.r.Close()
	trAddr := addrOf(e.tr)
	gr, other := udp(t), udp(t) // Global Relays
	r := newCacheRelayWith(t, e, Config{FlowStore: store, TrustedIngress: []string{"127.0.0.0/8"}}, nil, nil)
	framed := func(client netip.AddrPort, p []byte) []byte {
		return append(hop.AppendHeader(nil, hop.TypeData, client), p...)
	}

	// Written: a flow confirmed through a Global Relay is cached with it.
	behind := netip.MustParseAddrPort("198.51.100.20:5000")
	send(t, gr, framed(behind, e.binding(t, 7)), r.PublicAddr())
	recv(t, e.tr)
	send(t, e.tr, framed(behind, []byte{0x01, 0x01, 0, 0}), r.InternalAddr())
	recv(t, gr)
	eventually(t, "the flow written", func() bool { return r.Stats().FlowCache.WritesOK >= 1 })
	if cf, raw := cacheValue(t, store, behind); cf.via != addrOf(gr) || cf.transceiver != 7 {
		t.Fatalf("flow through %v cached as %q", addrOf(gr), raw)
	}

	uf, _ := ufragWords([]byte(mint(t, e.keys, testCluster, 7, e.now)))
	put := func(client, via netip.AddrPort) {
		t.Helper()
		v := appendCachedFlow(nil, &flowInfo{dst: trAddr, tr: 7, ufrag: uf, via: via})
		if err := store.Put(context.Background(), []netip.AddrPort{client}, [][]byte{v}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	dtls := []byte{22, 0xfe, 0xfd, 0, 0, 0, 1}
	stale := func(what string, client netip.AddrPort, sendIt func()) {
		t.Helper()
		before := r.Stats()
		sendIt()
		eventually(t, what+": stale", func() bool { return r.Stats().Drops[DropFlowCacheStale] == before.Drops[DropFlowCacheStale]+1 })
		if _, ok := r.flows.touch(client, 0); ok || r.Stats().FlowsRestored != before.FlowsRestored {
			t.Fatalf("%s: restored", what)
		}
		expectNothing(t, e.tr)
	}

	// A direct datagram with the address of a client behind a Global Relay.
	direct := udp(t)
	put(addrOf(direct), addrOf(gr))
	stale("direct, cached through a Global Relay", addrOf(direct), func() { send(t, direct, dtls, r.PublicAddr()) })
	// Through a Global Relay, cached direct.
	c2 := netip.MustParseAddrPort("198.51.100.21:5000")
	put(c2, netip.AddrPort{})
	stale("through a Global Relay, cached direct", c2, func() { send(t, gr, framed(c2, dtls), r.PublicAddr()) })
	// Through another Global Relay.
	c3 := netip.MustParseAddrPort("198.51.100.22:5000")
	put(c3, addrOf(gr))
	stale("through another Global Relay", c3, func() { send(t, other, framed(c3, dtls), r.PublicAddr()) })

	// The same way: restored, and replies go back through the Global Relay.
	c4 := netip.MustParseAddrPort("198.51.100.23:5000")
	put(c4, addrOf(gr))
	send(t, gr, framed(c4, dtls), r.PublicAddr())
	if got, _ := recv(t, e.tr); !bytes.Equal(got, framed(c4, dtls)) {
		t.Fatalf("restored through the Global Relay: %x", got)
	}
	send(t, e.tr, framed(c4, mediaPkt(9)), r.InternalAddr())
	if got, _ := recv(t, gr); !bytes.Equal(got, framed(c4, mediaPkt(9))) {
		t.Fatalf("reply: %x", got)
	}
	// And a direct client cached direct.
	d := udp(t)
	put(addrOf(d), netip.AddrPort{})
	send(t, d, dtls, r.PublicAddr())
	if got, _ := recv(t, e.tr); !bytes.HasSuffix(got, dtls) {
		t.Fatalf("restored direct: %x", got)
	}
}

// TestFlowCacheCapRefusalRemembered: a restore a cap refuses (here the
// flow table is full) is remembered briefly under that reason, so a
// client's stream does not cost a lookup per datagram; after that short
// while the client is looked up again. Such a lookup counts as refused,
// not as a hit.
func TestFlowCacheCapRefusalRemembered(t *testing.T) {
	srv := redistest.Start(t)
	store := newCache(t, srv.Addr)
	e := newEnv(t, Config{}, nil)
	e.r.Close()
	p := defaultCacheParams
	p.capped = 500 * time.Millisecond // well above the stream below, even on a slow machine
	r := newCacheRelayWith(t, e, Config{FlowStore: store, MaxFlows: 1}, &p, nil)
	confirm(t, e, r, udp(t)) // the table's one flow
	client := udp(t)
	uf, _ := ufragWords([]byte(mint(t, e.keys, testCluster, 7, e.now)))
	v := appendCachedFlow(nil, &flowInfo{dst: addrOf(e.tr), tr: 7, ufrag: uf})
	if err := store.Put(context.Background(), []netip.AddrPort{addrOf(client)}, [][]byte{v}, time.Minute); err != nil {
		t.Fatal(err)
	}
	send(t, client, mediaPkt(0), r.PublicAddr())
	eventually(t, "refused", func() bool { return r.Stats().Drops[DropFlowTableFull] == 1 })
	start := time.Now()
	for i := range 5 {
		send(t, client, mediaPkt(uint32(1+i)), r.PublicAddr())
		time.Sleep(10 * time.Millisecond)
	}
	eventually(t, "the stream dropped", func() bool { return r.Stats().Drops[DropFlowTableFull] == 6 })
	// One lookup per capped interval at most, however slow this ran
	// (normally all within the first: one lookup).
	s := r.Stats()
	if most := 1 + uint64(time.Since(start)/p.capped); s.FlowCache.Refused < 1 || s.FlowCache.Refused > most || s.FlowCache.Hits != 0 {
		t.Fatalf("%d lookups refused (want 1 to %d), %d hits, for the stream of a client a cap refused", s.FlowCache.Refused, most, s.FlowCache.Hits)
	}
	before := s.FlowCache.Refused
	time.Sleep(p.capped)
	send(t, client, mediaPkt(9), r.PublicAddr())
	eventually(t, "looked up again", func() bool { return r.Stats().FlowCache.Refused > before })
	if s := r.Stats(); s.FlowCache.Hits != 0 || s.FlowsRestored != 0 {
		t.Fatalf("%d hits, %d restored with the table full", s.FlowCache.Hits, s.FlowsRestored)
	}
	expectNothing(t, e.tr)
}

// TestFlowCacheSpoofedPathDoesNotBlock: one datagram with the address of
// a client behind a Global Relay, sent another way (here directly), must
// not keep the client's own datagrams, through its Global Relay, from
// restoring its flow: the stale answer it gets is remembered only for
// datagrams that come its way. And a datagram arriving another way than
// the first held one while its lookup is out is dropped, not held: the
// restored flow could not be its.
func TestFlowCacheSpoofedPathDoesNotBlock(t *testing.T) {
	f := newFixture(t, Config{FlowStore: nopCache{}, TrustedIngress: []string{"127.0.0.0/8"}})
	fc := f.r.fc
	fc.sock = udp(t) // restored datagrams go out from it (to t7, nobody)
	gr := netip.MustParseAddrPort("127.0.0.1:9999")
	c := netip.MustParseAddrPort("198.51.100.20:5000")
	uf, _ := ufragWords([]byte(mint(t, f.keys, testCluster, 7, f.now)))
	val := appendCachedFlow(nil, &flowInfo{dst: t7, tr: 7, ufrag: uf, via: gr})
	dtls := []byte{22, 0xfe, 0xfd, 0, 0, 0, 1}
	framed := append(hop.AppendHeader(nil, hop.TypeData, c), dtls...)
	tm := f.r.mono(f.now)

	// The spoofed direct datagram: held, looked up, stale.
	if _, out, drop := f.pub(c, dtls); !isHeld(out, drop) {
		t.Fatalf("spoof: %v", drop)
	}
	fc.resolve(<-fc.lookups, val, tm)
	// More of the same are dropped without a lookup.
	if _, _, drop := f.pub(c, dtls); drop != DropFlowCacheStale || len(fc.lookups) != 0 {
		t.Fatalf("spoof again: %v, %d lookups", drop, len(fc.lookups))
	}
	// The real client, through its Global Relay: looked up, restored.
	if _, out, drop := f.pub(gr, framed); !isHeld(out, drop) || len(fc.lookups) != 1 {
		t.Fatalf("the real client's datagram through its Global Relay: %v, %d lookups", drop, len(fc.lookups))
	}
	// Meanwhile, a direct datagram with its address is not held with it.
	before := fc.held.Load()
	if _, _, drop := f.pub(c, dtls); drop != DropFlowCacheStale || fc.held.Load() != before {
		t.Fatalf("another way during the lookup: %v, held %d → %d", drop, before, fc.held.Load())
	}
	fc.resolve(<-fc.lookups, val, tm)
	if fl, ok := f.r.flows.get(keyOf(c)); !ok || fl.via != gr || fl.dst != t7 || !fl.confirmed {
		t.Fatalf("not restored through the Global Relay: %+v %v", fl, ok)
	}
	if s := f.r.Stats(); s.FlowsRestored != 1 {
		t.Fatalf("%d flows restored", s.FlowsRestored)
	}
}

// TestFlowCacheRestoreKeepsNewFlow: a pending flow admitted (the client's
// Binding request, forwarded to its transceiver) after restore's lookup
// found none and before it inserts is kept: not overwritten with the
// cached destination and confirmed, so the transceiver's answer to the
// request still gets through.
func TestFlowCacheRestoreKeepsNewFlow(t *testing.T) {
	f := newFixture(t, Config{FlowStore: nopCache{}})
	// restore's lookup finds no flow; then admit's lands before its insert.
	if _, ok := f.r.flows.get(keyOf(c1)); ok {
		t.Fatal("a flow before restore")
	}
	if to, _, drop := f.pub(c1, f.good(8)); drop != dropNone || to != t8 {
		t.Fatalf("admit: %v %v", to, drop)
	}
	uf := []byte(mint(t, f.keys, testCluster, 7, f.now))
	dst, drop := f.r.flows.insertRestored(c1, t7, netip.AddrPort{}, 7, uf, f.r.mono(f.now))
	if drop != dropNone || dst != t8 {
		t.Fatalf("restore: %v %v, want the admitted flow's %v", dst, drop, t8)
	}
	fl, _ := f.r.flows.get(keyOf(c1))
	if fl.dst != t8 || fl.tr != 8 || fl.confirmed {
		t.Fatalf("flow after restore: %+v, want admit's pending flow to %v", fl, t8)
	}
	if s := f.r.Stats(); s.FlowsRestored != 0 {
		t.Fatalf("%d flows restored", s.FlowsRestored)
	}
	if _, _, drop := f.internal(t8, c1, []byte{0x01, 0x01, 0, 0}); drop != dropNone {
		t.Fatalf("transceiver 8's answer to the Binding request admit forwarded: %v", drop)
	}
}

// TestFlowCacheRedisTimeout: a real Redis that does not answer within the
// Get timeout (paused with CLIENT PAUSE) costs the held datagrams as
// flow_cache_timeout, not flow_cache_down, though go-redis reports the
// timeout as its socket's "i/o timeout", not the context's error. (It
// still backs off: no answer within the Get timeout is a failure.)
func TestFlowCacheRedisTimeout(t *testing.T) {
	srv := redistest.Start(t)
	store := newCache(t, srv.Addr)
	p := defaultCacheParams
	p.getTimeout = 100 * time.Millisecond
	f := newTunedFixture(t, Config{FlowStore: store}, withCache(p))
	fc := f.r.fc
	// Connected before the pause.
	if err := store.Get(context.Background(), []netip.AddrPort{c1}, make([][]byte, 1)); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("CLIENT PAUSE 1000 ALL\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("CLIENT PAUSE: %q %v", line, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	f.r.wg.Add(1)
	wg.Go(func() { fc.resolveLoop(ctx) })
	defer func() { cancel(); wg.Wait() }()
	buf := make([]byte, hop.MaxHeaderLen+32)
	copy(buf[hop.MaxHeaderLen:], mediaPkt(1))
	if _, out, drop := f.r.handlePublic(c1, buf, time.Now()); !isHeld(out, drop) {
		t.Fatalf("held: %v", drop)
	}
	eventually(t, "the lookup failed", func() bool { return f.r.Stats().FlowCache.Errors == 1 })
	if s := f.r.Stats(); s.Drops[DropFlowCacheTimeout] != 1 || s.Drops[DropFlowCacheDown] != 0 || s.FlowCache.Up {
		t.Fatalf("a Get timing out: timeout %d, down %d drops, up %v", s.Drops[DropFlowCacheTimeout], s.Drops[DropFlowCacheDown], s.FlowCache.Up)
	}
}

// TestPoolDoubleReturn: returning a held datagram's buffer to the pool
// twice is a bug the pool refuses loudly, instead of handing the buffer
// to two datagrams.
func TestPoolDoubleReturn(t *testing.T) {
	f := newFixture(t, Config{FlowStore: nopCache{}})
	fc := f.r.fc
	var e holdEntry
	if !fc.park(&e, []byte{0x80, 1, 2, 3}) {
		t.Fatal("park refused with an empty pool")
	}
	fc.putBuf(e.bufs[0])
	defer func() {
		if recover() == nil {
			t.Error("a second return of the same buffer did not panic")
		}
		if len(fc.free) != cap(fc.free) {
			t.Errorf("%d of %d buffers free", len(fc.free), cap(fc.free))
		}
	}()
	fc.putBuf(e.bufs[0])
}
