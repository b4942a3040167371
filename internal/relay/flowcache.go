package relay

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// The flow cache (docs/design.md §2.2, §5.7; docs/relay.md, "Flow cache").
//
// A relay with Config.FlowCache writes every confirmed flow (client →
// transceiver address, transceiver id, server ufrag) to a store shared by
// the cluster's relays, and when DTLS, RTP or RTCP arrives from a client
// it has no flow for (a restarted relay, or one the load balancer just
// moved the client to), it asks the store instead of dropping the datagram
// as not_stun_on_miss. Nothing of this runs on the forwarding path of a
// flow the relay has; the miss path only enqueues.
//
// Writes: the flow table calls onConfirm when a flow is confirmed (first
// answer, ICE restart promotion, relearn, restore); that puts the client on
// a bounded channel (non-blocking; when full the flow waits for the next
// refresh pass). The writer goroutine drains it, reads each flow back from
// the table and writes the batch with one Put (a Redis pipeline), so a
// confirmed flow is in the store within one Redis round trip of its
// confirmation. Every refresh interval (IdleTimeout/2) it rewrites, in
// batches, every confirmed flow with traffic since the previous pass; each
// entry lives ttl (2×IdleTimeout). Flows the relay expires are not deleted:
// with several relays behind the VIP, a flow idle here may be live on
// another relay, and the TTL removes dead ones.
//
// Lookups: on a miss the read loop copies the datagram into a buffer of a
// preallocated pool and parks it in the hold table under the client
// (holdTable: set-associative, fixed size, no allocation). The first
// datagram of a client also puts the client on the lookup channel
// (bounded, non-blocking). One source IP (IPv6: /64) has at most
// perSource clients waiting for a lookup and perSourceBufs held datagrams
// (sourceHash, as the limiter), so one source cannot fill the table or the
// pool. The resolver goroutine drains that channel and reads the batch with
// one Get (MGET), bounded by its own getTimeout: clients whose hold time
// has passed are not sent (flow_cache_timeout), nor those with less time
// left than a Get has been taking. A hit whose transceiver is still a
// member with the same id and address, and whose held datagram arrived the
// way the cached flow did (through the same Global Relay, or both direct),
// becomes a confirmed flow (the same caps as any new flow apply) and the
// held datagrams go to the transceiver with the hop header, in arrival
// order, from an internal socket. A miss is remembered (negative entry)
// for a short time, so a client's stream costs one lookup, not one per
// datagram; so is a restore a cap refused, for less time. Both apply
// only to datagrams that come the way the looked-up one did (the same
// Global Relay, or direct): anyone can send one with the client's
// address, and one sent another way must not keep the client's own from
// a lookup; while a lookup is out, datagrams that come another way than
// the first are dropped (stale), not held. A client whose
// bucket is full takes the slot of the negative entry expiring first.
// Datagrams whose answer comes after hold are dropped
// (flow_cache_timeout); every held datagram ends forwarded or counted
// under a DropReason.
//
// Down: a failed Get or Put (an error from the store, or no answer within
// getTimeout or putTimeout) backs every lookup and write off (100 ms
// doubling to 5 s); meanwhile misses are dropped at once as
// flow_cache_down. The state is a gauge and a log line at most once per
// logEvery. The relay forwards everything else as without a cache.

// FlowCache is a store of flows shared by a cluster's relays, keyed by
// client address; internal/flowcache is the Redis one. The values are
// opaque to it: the relay encodes them (appendCachedFlow). The relay calls
// it from two background goroutines, never per datagram, with batches.
type FlowCache interface {
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
	store FlowCache
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

	free     chan uint16  // free buffers of slab
	lookups  chan addrKey // clients whose first datagram is held
	confirms chan addrKey // confirmed flows to write

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

func newFlowCache(r *Relay, store FlowCache, p cacheParams) *flowCache {
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
	for i := range p.bufs {
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
	copy(fc.buf(i)[hop.MaxHeaderLen:], pkt)
	e.bufs[e.n], e.lens[e.n] = i, uint16(len(pkt))
	e.n++
	fc.held.Add(1)
	return true
}

func (fc *flowCache) putBuf(i uint16) {
	select {
	case fc.free <- i:
	default:
	}
}

// onConfirm queues client k's confirmed flow for the writer. Called by the
// flow table with a shard lock held, from the internal read loop: it
// never blocks and allocates nothing.
func (fc *flowCache) onConfirm(k addrKey) {
	select {
	case fc.confirms <- k:
	default:
		fc.writes[writeSkipped].Add(1) // the next refresh pass writes it
	}
}

// failed records a failed Get or Put: back off, count, log at most once per logEvery.
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

// resolveLoop is the resolver goroutine: it batches held clients into Gets.
func (fc *flowCache) resolveLoop(ctx context.Context) {
	defer fc.r.wg.Done()
	keys := make([]addrKey, 0, lookupBatch)
	live := make([]addrKey, 0, lookupBatch)
	clients := make([]netip.AddrPort, 0, lookupBatch)
	values := make([][]byte, lookupBatch)
	hold := int64(fc.p.hold)
	var took int64 // smoothed duration of a Get, ns
	for {
		keys = keys[:0]
		select {
		case <-ctx.Done():
			return
		case k := <-fc.lookups:
			keys = append(keys, k)
		}
	drain:
		for len(keys) < lookupBatch {
			select {
			case k := <-fc.lookups:
				keys = append(keys, k)
			default:
				break drain
			}
		}
		start := time.Now()
		t := fc.r.mono(start)
		live, clients = live[:0], clients[:0]
		down := t < fc.downUntil.Load()
		// A client with less time left than a Get has been taking would
		// only have its datagrams dropped when the answer comes: do not
		// ask. Capped at half the hold time, so fresh clients are always
		// asked (and took keeps measuring).
		short := min(took, hold/2)
		for _, k := range keys {
			at, ok := fc.heldSince(k)
			switch {
			case !ok:
			case hold-(t-at) <= short:
				fc.finish(k, DropFlowCacheTimeout, 0)
			case down:
				fc.finish(k, DropFlowCacheDown, 0)
			default:
				live = append(live, k)
				clients = append(clients, k.addrPort())
			}
		}
		if len(live) == 0 {
			continue
		}
		fc.batches.WithLabelValues("get").Observe(float64(len(live)))
		// The Get's own timeout, not the held datagrams' deadline: a
		// store slower than the hold time costs those datagrams
		// (flow_cache_timeout below), but is not down.
		lctx, cancel := context.WithTimeout(ctx, fc.p.getTimeout)
		err := fc.store.Get(lctx, clients, values[:len(live)])
		// Before cancel, which would make lctx's error Canceled. A store
		// need not return the context's error on a timeout: go-redis
		// returns the socket's "i/o timeout" (its read deadline is lctx's).
		// (Its deadline, too: the socket's timer may fire before lctx's.)
		dl, _ := lctx.Deadline()
		timedOut := lctx.Err() == context.DeadlineExceeded || !time.Now().Before(dl)
		cancel()
		if ctx.Err() != nil {
			return
		}
		end := time.Now()
		if d := int64(end.Sub(start)); took == 0 {
			took = d
		} else {
			took += (d - took) / 8
		}
		if err != nil {
			fc.lookedUp[lookupError].Add(uint64(len(live)))
			fc.failed("get", err)
			reason := DropFlowCacheDown
			if timedOut || errors.Is(err, context.DeadlineExceeded) {
				reason = DropFlowCacheTimeout
			}
			for _, k := range live {
				fc.finish(k, reason, 0)
			}
			continue
		}
		fc.worked()
		t = fc.r.mono(end)
		for i, k := range live {
			fc.resolve(k, values[i], t)
			values[i] = nil
		}
	}
}

// heldSince returns when k's first held datagram arrived, if k is waiting for a lookup.
func (fc *flowCache) heldSince(k addrKey) (int64, bool) {
	bucket, st := fc.bucket(&k)
	st.mu.Lock()
	defer st.mu.Unlock()
	if e := find(bucket, k); e != nil && e.state == holdLookup {
		return e.until, true
	}
	return 0, false
}

// finish drops k's held datagrams under reason and frees its entry, or,
// with negUntil non-zero, makes it a negative entry until then: the
// client's datagrams are dropped under reason without a lookup.
func (fc *flowCache) finish(k addrKey, reason DropReason, negUntil int64) {
	bucket, st := fc.bucket(&k)
	st.mu.Lock()
	defer st.mu.Unlock()
	e := find(bucket, k)
	if e == nil || e.state != holdLookup {
		return
	}
	for _, b := range e.bufs[:e.n] {
		fc.putBuf(b)
	}
	fc.give(fc.source(&k), 1, uint64(e.n))
	fc.c.drops[reason].Add(uint64(e.n))
	e.n = 0
	if negUntil != 0 {
		e.state, e.until, e.why = holdNegative, negUntil, reason
	} else {
		e.state = holdFree
	}
}

// resolve acts on the store's answer for k at t: restore the flow and send
// the held datagrams, or drop them and remember why.
func (fc *flowCache) resolve(k addrKey, val []byte, t int64) {
	why := dropNone
	var cf cachedFlow
	if val == nil {
		why = DropFlowCacheMiss
	} else if c, ok := parseCachedFlow(val); !ok || c.transceiver == 0 {
		why = DropFlowCacheStale
	} else if m, isMember := fc.r.members.Lookup(c.transceiver); !isMember || m != c.dst {
		// Membership, not the store, has the last word: the entry's
		// transceiver must still be a member, with the same id and address.
		why = DropFlowCacheStale
	} else {
		cf = c
	}
	client := k.addrPort()
	bucket, st := fc.bucket(&k)
	var bufs, lens [maxHeldPerClient]uint16
	st.mu.Lock()
	e := find(bucket, k)
	if e == nil || e.state != holdLookup {
		st.mu.Unlock()
		return
	}
	if why == dropNone && viaKey(cf.via) != e.via {
		// The held datagram did not come the way the flow did (another
		// Global Relay, or direct for a flow through one, or the reverse):
		// anyone can send a datagram with the client's address, and the
		// restored flow's replies would follow it.
		why = DropFlowCacheStale
	}
	late := t-e.until >= int64(fc.p.hold)
	n := int(e.n)
	copy(bufs[:], e.bufs[:n])
	copy(lens[:], e.lens[:n])
	fc.give(fc.source(&k), 1, uint64(n))
	e.n = 0
	var dst netip.AddrPort
	negUntil := t + int64(fc.p.negative)
	if why == dropNone {
		// Under the stripe lock: a read loop that missed the flow and now
		// waits for the lock finds it in the table (hold looks again).
		dst, why = fc.r.flows.restore(client, cf.dst, cf.via, cf.transceiver, cf.ufrag, t)
		switch why {
		case dropNone:
			negUntil = 0
		case DropFlowTableFull, DropSourceRateLimit, DropSourcePendingLimit, DropNewFlowRateLimit:
			// Remembered briefly: without it every datagram of the
			// client would cost a lookup for as long as the cap holds.
			negUntil = t + int64(fc.p.capped)
		}
	}
	// Counted once restore has said: a restore a cap refused is no hit.
	switch why {
	case dropNone:
		fc.lookedUp[lookupHit].Add(1)
	case DropFlowCacheMiss:
		fc.lookedUp[lookupMiss].Add(1)
	case DropFlowCacheStale:
		fc.lookedUp[lookupStale].Add(1)
	default:
		fc.lookedUp[lookupRefused].Add(1)
	}
	if negUntil != 0 {
		e.state, e.until, e.why = holdNegative, negUntil, why
	} else {
		e.state = holdFree
	}
	st.mu.Unlock()
	if why == dropNone && !fc.r.members.Contains(dst) {
		why = DropTransceiverGone
	}
	if late {
		why = DropFlowCacheTimeout // the answer, not its datagrams, is still good
	}
	for i := range n {
		b := fc.buf(bufs[i])
		if why == dropNone {
			start := hop.MaxHeaderLen - hop.HeaderLen(client.Addr())
			hop.PutHeader(b[start:], hop.TypeData, client)
			if _, err := fc.sock.WriteToUDPAddrPort(b[start:hop.MaxHeaderLen+int(lens[i])], dst); err != nil {
				fc.c.drops[DropWriteError].Add(1)
			} else {
				fc.c.packets[toTransceiver].Add(1)
				fc.c.bytes[toTransceiver].Add(uint64(lens[i]))
			}
		} else {
			fc.c.drops[why].Add(1)
		}
		fc.putBuf(bufs[i])
	}
}

// writeLoop is the writer goroutine: confirmations in batches as they
// come, and a refresh pass over the table every p.refresh.
func (fc *flowCache) writeLoop(ctx context.Context) {
	defer fc.r.wg.Done()
	w := &cacheWriter{fc: fc}
	// Probe the store at once, so that one missing from the start shows
	// in the gauge and the log without waiting for traffic.
	pctx, cancel := context.WithTimeout(ctx, fc.p.putTimeout)
	if err := fc.store.Get(pctx, []netip.AddrPort{{}}, make([][]byte, 1)); err != nil && ctx.Err() == nil {
		fc.failed("probe", err)
	}
	cancel()
	tick := time.NewTicker(fc.p.refresh)
	defer tick.Stop()
	// Each pass rewrites the flows with traffic since the previous one
	// began; the first covers everything.
	since := int64(-1 << 62)
	check := time.NewTicker(fc.p.minBackoff)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case k := <-fc.confirms:
			w.add(ctx, k)
		drain:
			for {
				select {
				case k := <-fc.confirms:
					w.add(ctx, k)
				default:
					break drain
				}
			}
			w.flush(ctx)
		case <-tick.C:
			since = w.refresh(ctx, since)
		case <-check.C:
			// Back from down: rewrite everything confirmed meanwhile.
			if fc.refreshed.Swap(false) {
				since = w.refresh(ctx, -1<<62)
			}
		}
	}
}

// cacheWriter batches entries for Put.
type cacheWriter struct {
	fc      *flowCache
	clients []netip.AddrPort
	values  [][]byte
	arena   []byte
}

// add queues client k's flow if it is confirmed.
func (w *cacheWriter) add(ctx context.Context, k addrKey) {
	if f, ok := w.fc.r.flows.get(k); ok && f.confirmed {
		w.put(ctx, k.addrPort(), &f)
	}
}

// put queues client's flow f. A flow without a transceiver id (0) is
// never written: its entry would be stale, and would overwrite a good one.
func (w *cacheWriter) put(ctx context.Context, client netip.AddrPort, f *flowInfo) {
	if f.tr == 0 {
		return
	}
	start := len(w.arena)
	w.arena = appendCachedFlow(w.arena, f)
	w.clients = append(w.clients, client)
	w.values = append(w.values, w.arena[start:len(w.arena):len(w.arena)])
	if len(w.clients) >= writeBatch {
		w.flush(ctx)
	}
}

func (w *cacheWriter) flush(ctx context.Context) {
	fc := w.fc
	n := len(w.clients)
	if n == 0 {
		return
	}
	defer func() {
		clear(w.values)
		w.clients, w.values, w.arena = w.clients[:0], w.values[:0], w.arena[:0]
	}()
	if fc.r.mono(time.Now()) < fc.downUntil.Load() {
		fc.writes[writeSkipped].Add(uint64(n))
		return
	}
	fc.batches.WithLabelValues("put").Observe(float64(n))
	pctx, cancel := context.WithTimeout(ctx, fc.p.putTimeout)
	err := fc.store.Put(pctx, w.clients, w.values, fc.p.ttl)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		fc.writes[writeError].Add(uint64(n))
		fc.failed("put", err)
		return
	}
	fc.writes[writeOK].Add(uint64(n))
	fc.worked()
}

// refresh writes every confirmed flow with traffic at or after since, and
// returns when this pass began (the next one's since).
func (w *cacheWriter) refresh(ctx context.Context, since int64) int64 {
	began := w.fc.r.mono(time.Now())
	w.fc.r.flows.eachConfirmed(since, func(client netip.AddrPort, f *flowInfo) bool {
		w.put(ctx, client, f)
		return ctx.Err() == nil
	})
	w.flush(ctx)
	return began
}

// Cached values (docs/relay.md, "Flow cache"), ASCII, fields separated by
// one space:
//
//	2 <transceiver ip:port> <transceiver id> <server ufrag or -> <via ip:port or ->
//
// e.g. "2 10.0.0.5:4000 7 AbCd… -" (the ufrag is token.Len characters of
// the ICE alphabet; "-" for a flow relearned from a transceiver's traffic,
// which has none; via is the Global Relay the client's traffic arrives
// through, "-" for a client sending directly).

// appendCachedFlow appends f's encoding to b.
func appendCachedFlow(b []byte, f *flowInfo) []byte {
	b = append(b, cacheValueVersion...)
	b = append(b, ' ')
	b = f.dst.AppendTo(b)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(f.tr), 10)
	b = append(b, ' ')
	if f.ufrag == ([token.Len / 8]uint64{}) {
		b = append(b, '-')
	} else {
		b = append(b, ufragBytes(&f.ufrag)...)
	}
	b = append(b, ' ')
	if !f.via.IsValid() {
		return append(b, '-')
	}
	return f.via.AppendTo(b)
}

// cachedFlow is a decoded value.
type cachedFlow struct {
	dst         netip.AddrPort
	via         netip.AddrPort // invalid: direct
	transceiver uint32
	ufrag       []byte // nil or token.Len bytes
}

// parseCachedFlow decodes a value; ok is false for anything malformed.
func parseCachedFlow(v []byte) (cf cachedFlow, ok bool) {
	if len(v) > maxCachedValue {
		return cf, false
	}
	f := bytes.Split(v, []byte{' '})
	if len(f) != 5 || string(f[0]) != cacheValueVersion {
		return cf, false
	}
	dst, ok := parseAddrPort(f[1])
	if !ok {
		return cf, false
	}
	tr, err := strconv.ParseUint(string(f[2]), 10, 32)
	if err != nil {
		return cf, false
	}
	switch {
	case string(f[3]) == "-":
	case len(f[3]) == token.Len:
		cf.ufrag = f[3]
	default:
		return cf, false
	}
	if string(f[4]) != "-" {
		if cf.via, ok = parseAddrPort(f[4]); !ok {
			return cf, false
		}
	}
	cf.dst, cf.transceiver = dst, uint32(tr)
	return cf, true
}

// parseAddrPort parses a canonical ip:port with a non-zero port.
func parseAddrPort(b []byte) (netip.AddrPort, bool) {
	ap, err := netip.ParseAddrPort(string(b))
	if err != nil || !ap.Addr().IsValid() || ap.Port() == 0 {
		return netip.AddrPort{}, false
	}
	return canonical(ap), true
}
