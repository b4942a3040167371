package relay

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/flowcache"
	"github.com/switchboard-rtc/switchboard/internal/flowcache/redistest"
	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

func init() { flowcache.LogRedisTo(slog.New(slog.DiscardHandler)) }

// lockedBuffer is a log sink safe for the relay's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// newCache returns a flow cache for testCluster in the Redis at addr.
func newCache(t *testing.T, addr string) *flowcache.Redis {
	t.Helper()
	c, err := flowcache.New(addr, testCluster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// gatedCache holds every lookup until its gate is closed.
type gatedCache struct {
	FlowCache
	gate chan struct{}
}

func (g *gatedCache) Get(ctx context.Context, clients []netip.AddrPort, values [][]byte) error {
	if len(clients) == 1 && !clients[0].IsValid() { // the writer's start-up probe
		return g.FlowCache.Get(ctx, clients, values)
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.FlowCache.Get(ctx, clients, values)
}

// newCacheRelay starts a relay with cache store for the members of e (the
// env's transceiver 7), logging to log (nil: nowhere).
func newCacheRelay(t *testing.T, e *env, store FlowCache, p *cacheParams, log *slog.Logger) *Relay {
	t.Helper()
	if p == nil {
		p = &cacheParams{}
		*p = defaultCacheParams
	}
	r, err := New(Config{
		PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: testCluster, Workers: 2,
		FlowCache: store, cacheParams: p,
	}, e.keys, e.members, prometheus.NewRegistry(), log)
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

	first := newCacheRelay(t, e, newCache(t, srv.Addr), nil, nil)
	start := time.Now()
	confirm(t, e, first, client)
	eventually(t, "the confirmed flow written", func() bool { return first.Stats().FlowCache.WritesOK >= 1 })
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Errorf("confirmed flow written %v after the first request; bound 250 ms", d)
	}
	first.Close()

	p := defaultCacheParams
	p.hold = 5 * time.Second // the gate below decides when the lookup answers
	gated := &gatedCache{FlowCache: newCache(t, srv.Addr), gate: make(chan struct{})}
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
				addr = fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
			}
			e := newEnv(t, Config{}, nil)
			e.r.Close()
			logs := &lockedBuffer{}
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
			if got := logs.count("flow cache unreachable"); got != 1 {
				t.Fatalf("%d 'unreachable' log lines in a second of failures, want 1:\n%s", got, logs.b.String())
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
	gated := &gatedCache{FlowCache: newCache(t, srv.Addr), gate: make(chan struct{})}
	f := newFixture(t, Config{FlowCache: gated, cacheParams: &p})
	fc := f.r.fc
	rtp := mediaPkt(1)
	const clients, each = 2000, 10
	held := 0
	drops := map[DropReason]int{}
	for i := range clients {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 40000)
		for range each {
			_, _, drop := f.pub(c, rtp)
			if drop == heldForCache {
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
	buf := make([]byte, hop.MaxHeaderLen+len(rtp))
	copy(buf[hop.MaxHeaderLen:], rtp)
	if n := testing.AllocsPerRun(1000, func() { f.r.handlePublic(c1, buf, f.now) }); n != 0 {
		t.Errorf("miss path: %v allocations, want 0", n)
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
		{"garbage", []byte("1 not-an-address 7 -"), DropFlowCacheStale},
		{"other version", []byte("2 " + trAddr.String() + " 7 -"), DropFlowCacheStale},
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
				return s.FlowCache.Hits + s.FlowCache.Misses + s.FlowCache.Stale + s.FlowCache.Errors
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
	send(t, client, mediaPkt(1), r.PublicAddr())
	eventually(t, "stale after a member moved", func() bool { return r.Stats().FlowCache.Stale == 6 })
}

// TestCachedFlowEncoding round-trips values and rejects malformed ones.
func TestCachedFlowEncoding(t *testing.T) {
	uf, _ := ufragWords(bytes.Repeat([]byte("A"), token.Len))
	for _, f := range []flowInfo{
		{dst: netip.MustParseAddrPort("10.0.0.5:4000"), tr: 7, ufrag: uf},
		{dst: netip.MustParseAddrPort("[2001:db8::5]:4000"), tr: 1<<32 - 1},
	} {
		v := appendCachedFlow(nil, &f)
		cf, ok := parseCachedFlow(v)
		if !ok || cf.dst != f.dst || cf.transceiver != f.tr || len(v) > maxCachedValue {
			t.Fatalf("%q → %+v %v", v, cf, ok)
		}
		if got, _ := ufragWords(cf.ufrag); got != f.ufrag {
			t.Fatalf("ufrag %q", cf.ufrag)
		}
	}
	for _, v := range []string{"", "1", "1 10.0.0.5:4000 7", "1 10.0.0.5:0 7 -", "1 10.0.0.5:4000 -1 -", "1 10.0.0.5:4000 7 short", "1  10.0.0.5:4000 7 -", strings.Repeat("x", 200)} {
		if _, ok := parseCachedFlow([]byte(v)); ok {
			t.Errorf("%q parsed", v)
		}
	}
}

// BenchmarkFlowCacheMiss is the read loop's cost of a miss with the cache
// on: hold (copy into a pooled buffer, enqueue the lookup). Each iteration
// also frees the entry, as the resolver would.
func BenchmarkFlowCacheMiss(b *testing.B) {
	f := newFixture(b, Config{FlowCache: nopCache{}})
	fc := f.r.fc
	buf := make([]byte, hop.MaxHeaderLen+160)
	buf[hop.MaxHeaderLen] = 0x80
	k := keyOf(c1)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, drop := f.r.handlePublic(c1, buf, f.now); drop != heldForCache {
			b.Fatal(drop)
		}
		<-fc.lookups
		fc.finish(k, DropFlowCacheMiss, 0)
	}
}

// BenchmarkFlowCacheNegative is a miss the cache already answered (a
// client's stream after its lookup missed): dropped in the read loop.
func BenchmarkFlowCacheNegative(b *testing.B) {
	f := newFixture(b, Config{FlowCache: nopCache{}})
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
	f := newFixture(b, Config{FlowCache: nopCache{}})
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
	f := newFixture(b, Config{FlowCache: nopCache{}})
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
