package relay

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
)

// The flow cache (docs/design.md §2.2, §5.7; docs/relay.md, "Flow cache").
// Its parts, one file each: this file, the hold table (where datagrams
// from clients without a flow wait) and the cache's state;
// flowcache_resolve.go, the resolver (lookups, restores, sending what was
// held); flowcache_write.go, the writer (confirmed flows into the store);
// flowcache_value.go, the value encoding. Names: the flow cache is this
// feature of the relay; its FlowStore is where the flows are kept.
//
// A relay with Config.FlowStore writes every confirmed flow to a store
// shared by the cluster's relays, and asks it, instead of dropping the
// datagram as not_stun_on_miss, when DTLS, RTP or RTCP comes from a client
// it has no flow for. docs/relay.md, "Flow cache", says how writes,
// lookups and back-off work, with their bounds and timings. Its
// invariants:
//
//   - Nothing of this runs on the forwarding path of a flow the relay has;
//     the miss path only copies into a preallocated buffer and enqueues
//     (no I/O, no allocation, no waiting for the store).
//   - Every held datagram ends forwarded or counted under a DropReason.
//   - A restored flow's transceiver is a member now, with the same id and
//     address: the relay never sends to an address outside the membership
//     table.
//   - A remembered answer applies only to datagrams that come the way the
//     looked-up one did (the same Global Relay, or direct): anyone can send
//     one with the client's address, and one sent another way must not
//     keep the client's own from a lookup.
//   - Flows the relay expires are not deleted from the store: with several
//     relays behind the VIP, a flow idle here may be live on another; the
//     entries' TTL removes dead ones.

// FlowStore is the flow cache's store: flows shared by a cluster's relays,
// keyed by client address; internal/flowstore is the Redis one. The values are
// opaque to it: the relay encodes them (appendCachedFlow). The relay calls
// it from two background goroutines, never per datagram, with batches.
type FlowStore interface {
	// Put stores values[i] under clients[i], each for ttl.
	Put(ctx context.Context, clients []netip.AddrPort, values [][]byte, ttl time.Duration) error
	// Get fills values[i] (len(values) == len(clients)) with clients[i]'s
	// value, or nil if it has none.
	Get(ctx context.Context, clients []netip.AddrPort, values [][]byte) error
}

// Bounds of the flow cache machinery; cacheParams holds the tunable ones.
const (
	// maxHeldPerClient bounds the datagrams held for one client.
	maxHeldPerClient = 8
	// holdWays is the associativity of the hold table.
	holdWays = 8
	// holdStripes is the number of locks over the hold table's buckets.
	holdStripes = 64
	// lookupBatch and writeBatch bound one Get and one Put.
	lookupBatch = 256
	writeBatch  = 512
	// maxCachedValue bounds a value the relay decodes.
	maxCachedValue = 192
	// cacheValueVersion is the first field of every value. Version 1 had
	// no via field: its entries are stale (a v1 entry cannot say whether
	// the flow came through a Global Relay).
	cacheValueVersion = "2"
	// holdSourceSlots is the size of the per-source hold counts (a power of two).
	holdSourceSlots = 1 << 12
)

// cacheParams are the flow cache's tunables. Defaults: defaultCacheParams.
type cacheParams struct {
	ttl        time.Duration // lifetime of a written entry; 0: 2×IdleTimeout
	refresh    time.Duration // refresh pass interval; 0: IdleTimeout/2
	hold       time.Duration // a datagram is dropped past it; one whose Get is out waits for it: at most hold+getTimeout
	negative   time.Duration // how long a miss (or a stale entry) is remembered
	capped     time.Duration // how long a restore refused by a cap is remembered
	minBackoff time.Duration // first back-off after a failure; doubles
	maxBackoff time.Duration
	logEvery   time.Duration // at most one "cache down" log line per interval
	getTimeout time.Duration // one Get; past it the store counts as down
	putTimeout time.Duration
	perClient  int // held datagrams per client, at most maxHeldPerClient
	perSource  int // clients of one source IP (IPv6: /64) waiting for a lookup
	sourceBufs int // held datagrams of one source IP
	bufs       int // held datagrams in total (buffers of batchSlot bytes)
	buckets    int // hold table buckets (power of two), holdWays entries each
	queue      int // confirmations waiting for the writer
}

var defaultCacheParams = cacheParams{
	hold:       200 * time.Millisecond,
	negative:   time.Second,
	capped:     150 * time.Millisecond,
	minBackoff: 100 * time.Millisecond,
	maxBackoff: 5 * time.Second,
	logEvery:   30 * time.Second,
	getTimeout: 500 * time.Millisecond,
	putTimeout: time.Second,
	perClient:  maxHeldPerClient,
	perSource:  32,
	sourceBufs: 64,
	bufs:       1024, // 2 MiB
	buckets:    512,  // 4096 clients
	queue:      4096,
}

// Hold entry states.
const (
	holdFree     = iota
	holdLookup   // datagrams held; the client is on the lookup channel or in a Get
	holdNegative // the store had nothing: until is when that is forgotten
)

type holdEntry struct {
	key   addrKey
	via   addrKey // the first held datagram's Global Relay (zero: direct); a negative entry applies only to datagrams that came the same way
	until int64   // holdLookup: mono ns the first datagram was held; holdNegative: expiry
	state uint8
	why   DropReason // holdNegative: the reason its datagrams are dropped
	n     uint8
	bufs  [maxHeldPerClient]uint16
	lens  [maxHeldPerClient]uint16
}

type holdStripe struct {
	mu sync.Mutex
	_  [64 - 8]byte
}

// Lookup results, indexing flowCache.lookedUp.
const (
	lookupHit     = iota // restored, or the client had a flow meanwhile
	lookupMiss           // no entry
	lookupStale          // an entry that does not decode or names a non-member
	lookupError          // the Get failed or timed out
	lookupRefused        // a good entry whose restore a cap refused (flow_table_full, source_rate_limit, …)
	numLookupResults
)

var lookupNames = [numLookupResults]string{"hit", "miss", "stale", "error", "refused"}

// Write results, indexing flowCache.writes.
const (
	writeOK      = iota
	writeError   // in a failed Put
	writeSkipped // the store was backing off, or the confirmation queue was full
	numWriteResults
)

var writeNames = [numWriteResults]string{"ok", "error", "skipped"}

// flowCache is a relay's flow cache machinery; see the comment above.
type flowCache struct {
	// Set once by newFlowCache (sock by New), never mutated.
	r     *Relay
	store FlowStore
	p     cacheParams
	sock  *net.UDPConn // the internal socket held datagrams go out from
	slab  []byte       // p.bufs buffers of batchSlot bytes
	// Each bucket of holdWays entries is guarded by stripes[bucket%holdStripes].
	stripes [holdStripes]holdStripe
	entries []holdEntry
	mask    uint64 // buckets - 1
	// sources[sourceHash(k)&(holdSourceSlots-1)] counts the holdLookup
	// entries (low 32 bits) and held datagrams (high 32 bits) of client k's
	// source IP. Sources sharing a slot share its budget: collisions only
	// make the caps stricter.
	srcSeed [2]uint64
	sources []atomic.Uint64

	free     chan uint16   // free buffers of slab
	inPool   []atomic.Bool // inPool[i]: buffer i is in free (the double-return guard)
	lookups  chan addrKey  // clients whose first datagram is held
	confirms chan addrKey  // confirmed flows to write

	downUntil atomic.Int64 // relay-mono ns: lookups and writes are skipped before it
	backoff   atomic.Int64 // ns; 0 while the store works
	up        atomic.Bool
	lastLog   atomic.Int64 // relay-mono ns of the last down/up log line; 0: never
	refreshed atomic.Bool  // set on recovery: the writer runs a refresh pass

	c        counters // drops and forwards of held datagrams
	held     atomic.Uint64
	lookedUp [numLookupResults]atomic.Uint64
	writes   [numWriteResults]atomic.Uint64
	batches  *prometheus.HistogramVec // label op: get, put
}

func newFlowCache(r *Relay, store FlowStore, p cacheParams) *flowCache {
	if p.ttl == 0 {
		p.ttl = 2 * r.cfg.IdleTimeout
	}
	if p.refresh == 0 {
		p.refresh = r.cfg.IdleTimeout / 2
	}
	p.perClient = min(max(p.perClient, 1), maxHeldPerClient)
	d := defaultCacheParams
	for _, v := range []struct{ p, def *time.Duration }{{&p.getTimeout, &d.getTimeout}, {&p.capped, &d.capped}} {
		if *v.p <= 0 {
			*v.p = *v.def
		}
	}
	if p.perSource <= 0 {
		p.perSource = d.perSource
	}
	if p.sourceBufs <= 0 {
		p.sourceBufs = d.sourceBufs
	}
	fc := &flowCache{
		r:        r,
		store:    store,
		p:        p,
		slab:     make([]byte, p.bufs*batchSlot),
		entries:  make([]holdEntry, p.buckets*holdWays),
		mask:     uint64(p.buckets - 1),
		srcSeed:  newSourceSeed(),
		sources:  make([]atomic.Uint64, holdSourceSlots),
		free:     make(chan uint16, p.bufs),
		lookups:  make(chan addrKey, p.buckets*holdWays),
		confirms: make(chan addrKey, p.queue),
		batches: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchboard_relay_flow_cache_batch_size",
			Help:    "Clients per flow cache round trip, by operation (get: one MGET; put: one pipeline of SETs).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}, []string{"op"}),
	}
	fc.inPool = make([]atomic.Bool, p.bufs)
	for i := range p.bufs {
		fc.inPool[i].Store(true)
		fc.free <- uint16(i)
	}
	fc.up.Store(true)
	return fc
}

func (fc *flowCache) buf(i uint16) []byte {
	return fc.slab[int(i)*batchSlot : (int(i)+1)*batchSlot]
}

// bucket returns the entries of k's bucket and its stripe.
func (fc *flowCache) bucket(k *addrKey) ([]holdEntry, *holdStripe) {
	h := fc.r.flows.hash(k)
	b := h & fc.mask
	return fc.entries[b*holdWays : (b+1)*holdWays], &fc.stripes[b%holdStripes]
}

// find returns k's entry in bucket, or nil.
func find(bucket []holdEntry, k addrKey) *holdEntry {
	for i := range bucket {
		if e := &bucket[i]; e.state != holdFree && e.key == k {
			return e
		}
	}
	return nil
}

// hold is the miss path of DTLS/RTP/RTCP datagram pkt from client (via its
// Global Relay, or invalid), called by a read loop. It returns one of:
// why it drops pkt; no drop and no destination when it parked a copy of
// pkt for the resolver (held); or, if the resolver restored client's flow
// meanwhile, the flow's destination. It never blocks on I/O and allocates
// nothing.
func (fc *flowCache) hold(client, via netip.AddrPort, pkt []byte, t int64) (netip.AddrPort, DropReason) {
	if t < fc.downUntil.Load() {
		return netip.AddrPort{}, DropFlowCacheDown
	}
	if len(pkt) > hop.MaxPayload {
		return netip.AddrPort{}, DropTooBig
	}
	k := keyOf(client)
	vk := viaKey(via)
	src := fc.source(&k)
	bucket, st := fc.bucket(&k)
	st.mu.Lock()
	defer st.mu.Unlock()
	e := find(bucket, k)
	switch {
	case e == nil:
	case e.state == holdNegative && t < e.until && e.via == vk:
		// Only for datagrams that came the way the remembered one did:
		// anyone can send one with the client's address, and one sent
		// another way (direct for a client behind a Global Relay, say)
		// must not keep the real client's datagrams from a lookup.
		return netip.AddrPort{}, e.why
	case e.state == holdLookup:
		if e.via != vk {
			// Not the way the first held datagram came: the restored
			// flow (if any) could not be this one's (resolve checks the
			// first one's way against the entry's).
			return netip.AddrPort{}, DropFlowCacheStale
		}
		if t-e.until >= int64(fc.p.hold) {
			// Its lookup is late (a slow store): this one would only wait
			// to be dropped, pinning a buffer.
			return netip.AddrPort{}, DropFlowCacheTimeout
		}
		if int(e.n) >= fc.p.perClient || !fc.take(src, 0, 1) {
			return netip.AddrPort{}, DropFlowCacheHoldFull
		}
		if !fc.park(e, pkt) {
			fc.give(src, 0, 1)
			return netip.AddrPort{}, DropFlowCacheHoldFull
		}
		return netip.AddrPort{}, dropNone // held
	default: // a negative entry expired, or for another way: reuse it
		e.state = holdFree
	}
	// No lookup under way. The resolver restores a flow and removes its
	// entry under this stripe's lock: look again now that we hold it.
	if dst, ok := fc.r.flows.touch(client, t); ok {
		return dst, dropNone
	}
	if !fc.take(src, 1, 1) {
		return netip.AddrPort{}, DropFlowCacheHoldFull // the source's share
	}
	if e == nil {
		if e = vacancy(bucket, t); e == nil {
			fc.give(src, 1, 1)
			return netip.AddrPort{}, DropFlowCacheHoldFull
		}
	}
	*e = holdEntry{key: k, via: vk, until: t, state: holdLookup}
	if !fc.park(e, pkt) {
		e.state = holdFree
		fc.give(src, 1, 1)
		return netip.AddrPort{}, DropFlowCacheHoldFull
	}
	select {
	case fc.lookups <- k:
	default: // cannot happen: the channel holds as many clients as the table
		fc.putBuf(e.bufs[0])
		e.state, e.n = holdFree, 0
		fc.give(src, 1, 1)
		return netip.AddrPort{}, DropFlowCacheHoldFull
	}
	return netip.AddrPort{}, dropNone // held
}

// vacancy returns the entry of bucket a new lookup may take at t: a free
// one, an expired negative one, or else the negative entry expiring first
// (a remembered answer costs only a lookup to forget, and a bucket full
// of them must not lock clients out). nil: every entry waits for a lookup.
func vacancy(bucket []holdEntry, t int64) *holdEntry {
	var oldest *holdEntry
	for i := range bucket {
		c := &bucket[i]
		switch {
		case c.state == holdFree, c.state == holdNegative && t >= c.until:
			return c
		case c.state == holdNegative && (oldest == nil || c.until < oldest.until):
			oldest = c
		}
	}
	return oldest
}

// source returns the hold counts of client k's source IP.
func (fc *flowCache) source(k *addrKey) *atomic.Uint64 {
	return &fc.sources[sourceHash(k, &fc.srcSeed)&(holdSourceSlots-1)]
}

// take adds entries lookups and bufs held datagrams to source s, unless
// that would exceed perSource or sourceBufs.
func (fc *flowCache) take(s *atomic.Uint64, entries, bufs uint64) bool {
	for {
		old := s.Load()
		if old&(1<<32-1)+entries > uint64(fc.p.perSource) || old>>32+bufs > uint64(fc.p.sourceBufs) {
			return false
		}
		if s.CompareAndSwap(old, old+entries+bufs<<32) {
			return true
		}
	}
}

// give returns what take took.
func (fc *flowCache) give(s *atomic.Uint64, entries, bufs uint64) {
	s.Add(-(entries + bufs<<32))
}

// park copies pkt into a free buffer and appends it to e. The stripe is held.
func (fc *flowCache) park(e *holdEntry, pkt []byte) bool {
	var i uint16
	select {
	case i = <-fc.free:
	default:
		return false
	}
	if !fc.inPool[i].CompareAndSwap(true, false) {
		panic(fmt.Sprintf("relay: flow cache buffer %d taken from the pool while out of it", i))
	}
	copy(fc.buf(i)[hop.MaxHeaderLen:], pkt)
	e.bufs[e.n], e.lens[e.n] = i, uint16(len(pkt))
	e.n++
	fc.held.Add(1)
	return true
}

// putBuf returns buffer i to the pool. A buffer returned twice would be
// handed to two held datagrams at once (one overwriting the other): that
// is a bug in the relay, never the network's doing, so it panics, as a
// double release does in quic-go's packet buffers.
func (fc *flowCache) putBuf(i uint16) {
	if !fc.inPool[i].CompareAndSwap(false, true) {
		panic(fmt.Sprintf("relay: flow cache buffer %d returned to the pool twice", i))
	}
	fc.free <- i // never blocks: the channel holds every buffer
}

func (fc *flowCache) failed(op string, err error) {
	now := time.Now()
	t := fc.r.mono(now)
	b := min(max(2*fc.backoff.Load(), int64(fc.p.minBackoff)), int64(fc.p.maxBackoff))
	fc.backoff.Store(b)
	fc.downUntil.Store(t + b)
	fc.up.Store(false)
	if fc.mayLog(t) {
		fc.r.log.Warn("relay: flow cache unreachable; forwarding without it (misses are dropped as flow_cache_down) until it answers",
			"op", op, "err", err, "retry_in", time.Duration(b).String(), "next_log_within", fc.p.logEvery.String())
	}
}

// worked records a successful Get or Put.
func (fc *flowCache) worked() {
	fc.backoff.Store(0)
	if !fc.up.Swap(true) {
		fc.refreshed.Store(true)
		if fc.mayLog(fc.r.mono(time.Now())) {
			fc.r.log.Info("relay: flow cache reachable again")
		}
	}
}

// mayLog reports whether a down/up line may be logged at t (once per logEvery).
func (fc *flowCache) mayLog(t int64) bool {
	last := fc.lastLog.Load()
	if last != 0 && t-last < int64(fc.p.logEvery) {
		return false
	}
	return fc.lastLog.CompareAndSwap(last, max(t, 1))
}
