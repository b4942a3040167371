package relay

import (
	"crypto/rand"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

const (
	numShards = 64 // power of two
	// minSlots is the initial (and smallest) open-addressing table of a shard.
	minSlots = 64
)

// The flow table is a map from client address to flow, built so that the
// forwarding path never takes a lock:
//
//   - 64 shards, picked by the top bits of a seeded hash, so a
//     client choosing its source address and port cannot aim at one shard
//     or one probe chain.
//   - Each shard holds an atomic pointer to an open-addressing table
//     (linear probing, power-of-two size, at most 3/4 full counting
//     tombstones). Readers load the pointer and probe; they never lock.
//   - Every slot is a seqlock: a writer makes the slot's sequence odd, stores
//     the fields, and makes it even again; a reader reads the sequence, the
//     fields, and the sequence again, and retries if it changed or was odd.
//     Every field is an atomic word, so readers and writers never race in the
//     Go memory model sense (and `go test -race` agrees).
//   - Writers (flow create, re-point on ICE restart, first confirmation,
//     remove, sweep) take the shard's mutex: writers on different shards
//     never contend, and a flow is written a handful of times in its life.
//   - Growing or cleaning tombstones builds a new table and swaps the
//     pointer; a reader still probing the old one sees a consistent (if
//     momentarily stale) table, and the garbage collector frees it. Slots
//     are never recycled while readable except through the seqlock.
//
// A live key never moves within a table (an insert only lands on a slot
// after a miss along the whole chain), so a concurrent reader cannot skip
// over a flow that exists for the whole duration of its probe.
//
// The hot part of a slot (sequence, key, destination, last-seen) is one
// 64-byte cache line; the rest (created, transceiver id, confirmed flag,
// server ufrag) lives in a parallel array read only on the slow paths.

// Slot states, in bits 16-17 of the key's third word.
const (
	stateEmpty = 0
	stateLive  = 1
	stateTomb  = 2
)

// addrKey is a canonical client address as three words: the 16-byte
// address (IPv4 as IPv4-mapped) and the port, with bit 18 set for IPv4 so
// that an IPv4 address and its IPv4-mapped IPv6 form never collide (the
// relay unmaps every address at the edge, so the latter never occurs), and
// bit 19 set for a TCP client (hop.TCPAddr's form, keyed by its plain
// address and the bit): a TCP and a UDP client of one ip:port have two
// flows, and the per-source caps (limits.go), which hash the address
// words and the IPv4 bit only, count them as one source. Other zones are
// ignored.
type addrKey [3]uint64

const (
	keyIs4      = 1 << 18
	keyTCP      = 1 << 19
	keyStateSft = 16
	keyPortMask = 0xffff
)

func keyOf(a netip.AddrPort) addrKey {
	ip := a.Addr()
	var tcp uint64
	if !ip.Is4() && hop.IsTCP(a) {
		ip, tcp = ip.WithZone("").Unmap(), keyTCP
	}
	b := ip.As16()
	k := addrKey{binary.BigEndian.Uint64(b[0:8]), binary.BigEndian.Uint64(b[8:16]), uint64(a.Port()) | tcp}
	if ip.Is4() {
		k[2] |= keyIs4
	}
	return k
}

// isTCP reports whether k is a TCP client's key.
func (k addrKey) isTCP() bool { return k[2]&keyTCP != 0 }

func (k addrKey) addrPort() netip.AddrPort {
	var b [16]byte
	binary.BigEndian.PutUint64(b[0:8], k[0])
	binary.BigEndian.PutUint64(b[8:16], k[1])
	var a netip.Addr
	if k[2]&keyIs4 != 0 {
		a = netip.AddrFrom4([4]byte(b[12:16]))
	} else {
		a = netip.AddrFrom16(b)
	}
	ap := netip.AddrPortFrom(a, uint16(k[2]&keyPortMask))
	if k.isTCP() {
		return hop.TCPAddr(ap)
	}
	return ap
}

// slot is the hot part of one table entry: exactly one cache line.
type slot struct {
	seq  atomic.Uint64    // odd while a writer changes the slot
	key  [3]atomic.Uint64 // client addrKey, with the slot state in key[2]
	dst  [3]atomic.Uint64 // transceiver addrKey
	last atomic.Int64     // relay-monotonic nanoseconds of the last traffic either way
}

// coldSlot is the rest of the entry, read under the same seqlock.
type coldSlot struct {
	created atomic.Int64                 // relay-monotonic nanoseconds
	tr      atomic.Uint64                // transceiver id
	ufrag   [token.Len / 8]atomic.Uint64 // server ufrag that created the flow (ICE restart detection)
	via     [3]atomic.Uint64             // addrKey of the ingress relay the client's traffic arrives through; zero: direct
	cand    candidate                    // re-point in waiting (restart.go)
}

// dstConfirmed, in the destination's third word, marks a flow its
// transceiver has answered: the forwarding path reads it with the
// destination, from the same cache line.
const dstConfirmed = 1 << 20

type table struct {
	mask  uint64
	slots []slot
	cold  []coldSlot
	// Written under the shard mutex only.
	live, tombs int
}

func newTable(n int) *table {
	return &table{mask: uint64(n - 1), slots: make([]slot, n), cold: make([]coldSlot, n)}
}

type shard struct {
	mu  sync.Mutex // serializes writers of this shard
	tab atomic.Pointer[table]
	_   [64 - 16]byte // one cache line per shard header
}

// flowTable is the relay's flow table; see the comment above.
type flowTable struct {
	seed   [4]uint64 // random, for hash
	max    int64
	shards [numShards]shard

	n       atomic.Int64 // flows, pending and confirmed
	pending atomic.Int64 // flows not yet confirmed
	created atomic.Uint64
	// relearned counts flows created from a member's traffic (Config.Relearn).
	relearned atomic.Uint64
	expired   [2]atomic.Uint64 // by state: 0 pending, 1 confirmed

	// restored counts flows recreated from the flow cache (flowcache.go).
	restored atomic.Uint64

	// lim holds the per-source caps (limits.go): every pending flow holds
	// one unit of its source's pending count, taken where pending goes up
	// and given back where it goes down. nil: no caps but MaxFlows.
	lim *limiter
	// onConfirm, if set, is called with a shard lock held each time a flow
	// becomes confirmed or is re-pointed confirmed (the flow cache's
	// writer queue, flowcache.go). It must not block. Set before use.
	onConfirm func(addrKey)
}

func newFlowTable(max int) *flowTable {
	t := &flowTable{max: int64(max)}
	var b [32]byte
	_, _ = rand.Read(b[:])
	for i := range t.seed {
		t.seed[i] = binary.LittleEndian.Uint64(b[8*i:]) | 1 // odd: never a zero multiplier
	}
	for i := range t.shards {
		t.shards[i].tab.Store(newTable(minSlots))
	}
	return t
}

// hash is a seeded wyhash-style mix of the key: 128-bit multiplies of
// key words XORed with secret random words. A client that does not know the
// seed cannot pick addresses that collide on one shard or one probe chain.
// (maphash.Comparable is as strong but several times slower here.)
func (t *flowTable) hash(k *addrKey) uint64 {
	return mum(mum(k[0]^t.seed[0], k[1]^t.seed[1])^t.seed[3], k[2]^t.seed[2])
}

func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func (t *flowTable) shardOf(h uint64) *shard { return &t.shards[h>>(64-6)] }

// readSlot reads the key of sl under its seqlock: the key words, the state
// and the sequence they were read at. It spins while a writer holds the slot.
func readKey(sl *slot) (k addrKey, seq uint64) {
	for spins := 0; ; spins++ {
		seq = sl.seq.Load()
		if seq&1 == 0 {
			k = addrKey{sl.key[0].Load(), sl.key[1].Load(), sl.key[2].Load()}
			if sl.seq.Load() == seq {
				return k, seq
			}
		}
		if spins > 64 {
			runtime.Gosched()
		}
	}
}

func state(k addrKey) uint64 { return k[2] >> keyStateSft & 3 }

// probe looks k up in tab without locking. On a hit it returns the slot
// index and the sequence at which the slot held k; the caller reads more
// fields and validates them against that sequence.
func probe(tab *table, k addrKey, h uint64) (i uint64, seq uint64, ok bool) {
	want := k
	want[2] |= stateLive << keyStateSft
	for i = h & tab.mask; ; i = (i + 1) & tab.mask {
		got, seq := readKey(&tab.slots[i])
		switch {
		case got == want:
			return i, seq, true
		case state(got) == stateEmpty:
			return 0, 0, false
		}
	}
}

// view is what the lock-free readers need from one flow.
type view struct {
	dst       addrKey // without dstConfirmed
	confirmed bool
}

// lookup finds client's flow without locking. If now is non-zero it also
// refreshes last-seen (a late store after a concurrent re-use of the slot
// only makes another flow look a little more recent, which is harmless: a
// pending flow expires by its creation time, not by last-seen).
func (t *flowTable) lookup(k addrKey, h uint64, now int64) (v view, ok bool) {
	tab := t.shardOf(h).tab.Load()
	for {
		i, seq, hit := probe(tab, k, h)
		if !hit {
			return v, false
		}
		sl := &tab.slots[i]
		v.dst = addrKey{sl.dst[0].Load(), sl.dst[1].Load(), sl.dst[2].Load()}
		v.confirmed = v.dst[2]&dstConfirmed != 0
		v.dst[2] &^= dstConfirmed
		if sl.seq.Load() != seq {
			continue // changed under us: probe again
		}
		if now != 0 && sl.last.Load() < now {
			sl.last.Store(now)
		}
		return v, true
	}
}

// touch looks up the flow of client, refreshes it and returns where it goes.
func (t *flowTable) touch(client netip.AddrPort, now int64) (dst netip.AddrPort, ok bool) {
	k := keyOf(client)
	v, ok := t.lookup(k, t.hash(&k), now)
	if !ok {
		return dst, false
	}
	return v.dst.addrPort(), true
}

// ufragWords packs a token-length ufrag into words; ok is false for any
// other length (such a ufrag can never have created a flow).
func ufragWords(ufrag []byte) (w [token.Len / 8]uint64, ok bool) {
	if len(ufrag) != token.Len {
		return w, false
	}
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(ufrag[8*i:])
	}
	return w, true
}

// reply handles traffic from transceiver from for client: it refreshes the
// flow if the flow exists and points to from, and confirms it the first time.
// via is the ingress relay the reply must go back through, invalid when the
// client is directly attached.
func (t *flowTable) reply(client, from netip.AddrPort, now int64) (via netip.AddrPort, drop DropReason) {
	k := keyOf(client)
	h := t.hash(&k)
	tab := t.shardOf(h).tab.Load()
	var v view
	var vk addrKey
	for {
		i, seq, hit := probe(tab, k, h)
		if !hit {
			return via, DropInternalNoFlow
		}
		sl := &tab.slots[i]
		v.dst = keyWords(&sl.dst)
		v.confirmed = v.dst[2]&dstConfirmed != 0
		v.dst[2] &^= dstConfirmed
		vk = keyWords(&tab.cold[i].via)
		if sl.seq.Load() != seq {
			continue // changed under us: probe again
		}
		if sl.last.Load() < now {
			sl.last.Store(now)
		}
		break
	}
	switch {
	case v.dst != keyOf(from):
		// Only the transceiver of the flow's candidate may take it over (restart.go).
		var ok bool
		if vk, ok = t.promote(k, h, keyOf(from), now); !ok {
			return via, DropInternalFlowMismatch
		}
	case !v.confirmed:
		t.confirm(k, h, keyOf(from))
	}
	if vk != (addrKey{}) {
		via = vk.addrPort()
	}
	return via, dropNone
}

// setVia makes via (invalid: directly attached) the ingress relay of
// client's flow if it is not already. Reading costs one probe; writing,
// which only happens when a client's path moved, takes the shard lock.
func (t *flowTable) setVia(client, via netip.AddrPort) {
	k, vk := keyOf(client), viaKey(via)
	h := t.hash(&k)
	s := t.shardOf(h)
	tab := s.tab.Load()
	for {
		i, seq, hit := probe(tab, k, h)
		if !hit {
			return
		}
		cur := keyWords(&tab.cold[i].via)
		if tab.slots[i].seq.Load() != seq {
			continue
		}
		if cur == vk {
			return
		}
		break
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tab = s.tab.Load()
	i, _, hit := probe(tab, k, h)
	if !hit {
		return
	}
	sl := &tab.slots[i]
	sl.seq.Add(1)
	for j := range 3 {
		tab.cold[i].via[j].Store(vk[j])
	}
	sl.seq.Add(1)
}

// relearn creates a confirmed flow from client to member, transceiver
// id, whose traffic named a client the table does not know (a restarted
// relay). It is subject to the same caps as any new flow. id is the
// member's real id (membership.Table.ID), so that the flow cache records
// it: an entry with another id would be stale.
func (t *flowTable) relearn(client, member netip.AddrPort, id uint32, now int64) DropReason {
	if drop := t.upsert(client, member, id, nil, now); drop != dropNone {
		return drop
	}
	k := keyOf(client)
	t.confirm(k, t.hash(&k), keyOf(member))
	t.relearned.Add(1)
	return dropNone
}

// confirm marks client's flow confirmed (once per flow, so it may lock).
func (t *flowTable) confirm(k addrKey, h uint64, dst addrKey) {
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	tab := s.tab.Load()
	i, _, ok := probe(tab, k, h)
	if !ok {
		return
	}
	// One word changes, so readers see the flow before or after, both
	// consistent: no sequence bump needed.
	w := &tab.slots[i].dst[2]
	if keyWords(&tab.slots[i].dst) != dst {
		return // already confirmed (the bit is set) or re-pointed meanwhile
	}
	w.Store(dst[2] | dstConfirmed)
	t.pending.Add(-1)
	t.lim.release(&k)
	if t.onConfirm != nil && !k.isTCP() {
		t.onConfirm(k) // a TCP flow dies with its connection: nothing to cache
	}
}

// restore creates a confirmed flow for client from the flow cache, under
// the same caps as any new flow, unless client has a flow already (its
// Binding request got there first): dst is where client's datagrams go.
func (t *flowTable) restore(client, to, via netip.AddrPort, transceiver uint32, ufrag []byte, now int64) (dst netip.AddrPort, drop DropReason) {
	k := keyOf(client)
	if v, ok := t.lookup(k, t.hash(&k), now); ok {
		return v.dst.addrPort(), dropNone
	}
	return t.insertRestored(client, to, via, transceiver, ufrag, now)
}

// insertRestored is restore after its lock-free lookup found no flow:
// insert only, so that a flow made since (admit's pending one, whose
// Binding request went to its transceiver) is kept, not overwritten and
// confirmed to the cached destination.
func (t *flowTable) insertRestored(client, to, via netip.AddrPort, transceiver uint32, ufrag []byte, now int64) (dst netip.AddrPort, drop DropReason) {
	k := keyOf(client)
	h := t.hash(&k)
	cur, existed, drop := t.put(client, to, via, transceiver, ufrag, now, true)
	if drop != dropNone {
		return dst, drop
	}
	if existed {
		return cur.addrPort(), dropNone
	}
	t.confirm(k, h, keyOf(to))
	t.restored.Add(1)
	return to, dropNone
}

// flowInfo is what the flow cache writes of a flow.
type flowInfo struct {
	dst       netip.AddrPort
	via       netip.AddrPort // the Global Relay the client's traffic arrives through; invalid: direct
	tr        uint32
	ufrag     [token.Len / 8]uint64
	confirmed bool
}

// get reads client k's flow without locking.
func (t *flowTable) get(k addrKey) (f flowInfo, ok bool) {
	h := t.hash(&k)
	tab := t.shardOf(h).tab.Load()
	for {
		i, seq, hit := probe(tab, k, h)
		if !hit {
			return f, false
		}
		if tab.read(i, &f); tab.slots[i].seq.Load() == seq {
			return f, true
		}
	}
}

// read loads slot i's flowInfo; the caller validates it against the seqlock.
func (tab *table) read(i uint64, f *flowInfo) {
	sl, c := &tab.slots[i], &tab.cold[i]
	d := keyWords(&sl.dst)
	f.confirmed = d[2]&dstConfirmed != 0
	d[2] &^= dstConfirmed
	f.dst = d.addrPort()
	f.via = netip.AddrPort{}
	if v := keyWords(&c.via); v != (addrKey{}) {
		f.via = v.addrPort()
	}
	f.tr = uint32(c.tr.Load())
	for j := range f.ufrag {
		f.ufrag[j] = c.ufrag[j].Load()
	}
}

// eachConfirmed calls fn for every confirmed flow with traffic at or after
// since, without locking, until fn returns false. A flow created or
// removed during the walk may be missed or seen.
func (t *flowTable) eachConfirmed(since int64, fn func(client netip.AddrPort, f *flowInfo) bool) {
	var f flowInfo
	for si := range t.shards {
		tab := t.shards[si].tab.Load()
		for i := range tab.slots {
			sl := &tab.slots[i]
			k, seq := readKey(sl)
			if state(k) != stateLive {
				continue
			}
			last := sl.last.Load()
			tab.read(uint64(i), &f)
			if sl.seq.Load() != seq || !f.confirmed || last < since {
				continue
			}
			k[2] &^= 3 << keyStateSft
			if k.isTCP() {
				continue // a TCP flow lives as long as its connection: never cached
			}
			if !fn(k.addrPort(), &f) {
				return
			}
		}
	}
}

// ufragBytes unpacks ufragWords.
func ufragBytes(w *[token.Len / 8]uint64) []byte {
	b := make([]byte, token.Len)
	for i := range w {
		binary.LittleEndian.PutUint64(b[8*i:], w[i])
	}
	return b
}

func keyWords(w *[3]atomic.Uint64) addrKey { return addrKey{w[0].Load(), w[1].Load(), w[2].Load()} }

// write stores a flow into slot i of tab under the seqlock. The caller holds the shard mutex.
func (tab *table) write(i uint64, k, dst, via addrKey, tr uint64, created, last int64, ufrag [token.Len / 8]uint64) {
	sl, c := &tab.slots[i], &tab.cold[i]
	sl.seq.Add(1)
	for j := range 3 {
		sl.key[j].Store(k[j])
		sl.dst[j].Store(dst[j])
		c.via[j].Store(via[j])
	}
	sl.last.Store(last)
	c.cand.clear() // a new or re-pointed flow has no candidate (rehash copies it after)
	c.created.Store(created)
	c.tr.Store(tr)
	for j := range ufrag {
		c.ufrag[j].Store(ufrag[j])
	}
	sl.seq.Add(1)
}

// upsert creates a pending flow for client, or re-points an existing one
// (ICE restart, or two workers racing on the first packet). ufrag is the
// server ufrag of a token that opened (token.Len bytes), or nil in tests.
func (t *flowTable) upsert(client, dst netip.AddrPort, transceiver uint32, ufrag []byte, now int64) DropReason {
	return t.upsertVia(client, dst, netip.AddrPort{}, transceiver, ufrag, now)
}

// viaKey is the addrKey stored for via: zero when via is not valid (the
// client is directly attached).
func viaKey(via netip.AddrPort) addrKey {
	if !via.IsValid() {
		return addrKey{}
	}
	return keyOf(via)
}

// upsertVia is upsert for a client whose datagrams arrive through the
// ingress relay via (a Global Relay), where replies must go back; an
// invalid via means the client is directly attached.
func (t *flowTable) upsertVia(client, dst, via netip.AddrPort, transceiver uint32, ufrag []byte, now int64) DropReason {
	_, _, drop := t.put(client, dst, via, transceiver, ufrag, now, false)
	return drop
}

// put is upsertVia; with insertOnly, a flow client has already is left
// as it is (but for its last-seen time, as a lookup) and its destination
// returned with existed true.
func (t *flowTable) put(client, dst, via netip.AddrPort, transceiver uint32, ufrag []byte, now int64, insertOnly bool) (cur addrKey, existed bool, drop DropReason) {
	k, dk, vk := keyOf(client), keyOf(dst), viaKey(via)
	uw, _ := ufragWords(ufrag)
	h := t.hash(&k)
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	tab := s.tab.Load()
	want := k
	want[2] |= stateLive << keyStateSft
	free := int64(-1) // first tombstone on the chain
	i := h & tab.mask
	for ; ; i = (i + 1) & tab.mask {
		got := keyWords(&tab.slots[i].key) // the mutex excludes other writers
		if got == want {
			if insertOnly {
				if tab.slots[i].last.Load() < now {
					tab.slots[i].last.Store(now)
				}
				cur = keyWords(&tab.slots[i].dst)
				cur[2] &^= dstConfirmed
				return cur, true, dropNone
			}
			c := &tab.cold[i]
			var had [token.Len / 8]uint64
			for j := range had {
				had[j] = c.ufrag[j].Load()
			}
			d := keyWords(&tab.slots[i].dst)
			d[2] &^= dstConfirmed
			if d == dk && had == uw && keyWords(&c.via) == vk {
				tab.slots[i].last.Store(now)
				return cur, false, dropNone
			}
			// A new token: route to its transceiver, pending until it answers.
			if tab.slots[i].dst[2].Load()&dstConfirmed != 0 {
				if drop := t.lim.acquire(&k, now); drop != dropNone {
					return cur, false, drop
				}
				t.pending.Add(1)
			}
			tab.write(i, want, dk, vk, uint64(transceiver), now, now, uw)
			t.created.Add(1)
			return cur, false, dropNone
		}
		st := state(got)
		if st == stateTomb && free < 0 {
			free = int64(i)
		}
		if st == stateEmpty {
			break
		}
	}
	if t.n.Add(1) > t.max {
		t.n.Add(-1)
		return cur, false, DropFlowTableFull
	}
	if drop := t.lim.acquire(&k, now); drop != dropNone {
		t.n.Add(-1)
		return cur, false, drop
	}
	if free >= 0 {
		i = uint64(free)
		tab.tombs--
	} else if uint64(tab.live+tab.tombs+1) > (tab.mask+1)*3/4 {
		tab = t.rehash(s, tab, tab.live+1)
		for i = h & tab.mask; state(keyWords(&tab.slots[i].key)) != stateEmpty; i = (i + 1) & tab.mask {
		}
	}
	tab.write(i, want, dk, vk, uint64(transceiver), now, now, uw)
	tab.live++
	t.pending.Add(1)
	t.created.Add(1)
	return cur, false, dropNone
}

// rehash copies the live flows of old into a new table sized for need
// flows at most half full, publishes it and returns it. The shard mutex is held.
func (t *flowTable) rehash(s *shard, old *table, need int) *table {
	n := minSlots
	for n < 2*need {
		n *= 2
	}
	tab := newTable(n)
	for i := range old.slots {
		k := keyWords(&old.slots[i].key)
		if state(k) != stateLive {
			continue
		}
		sl, c := &old.slots[i], &old.cold[i]
		hk := k
		hk[2] &^= 3 << keyStateSft
		h := t.hash(&hk)
		j := h & tab.mask
		for state(keyWords(&tab.slots[j].key)) != stateEmpty {
			j = (j + 1) & tab.mask
		}
		var uw [token.Len / 8]uint64
		for x := range uw {
			uw[x] = c.ufrag[x].Load()
		}
		tab.write(j, k, keyWords(&sl.dst), keyWords(&c.via), c.tr.Load(), c.created.Load(), sl.last.Load(), uw)
		tab.cold[j].cand.copyFrom(&c.cand)
		tab.live++
	}
	s.tab.Store(tab)
	return tab
}

// remove deletes client's flow if there is one.
func (t *flowTable) remove(client netip.AddrPort) {
	k := keyOf(client)
	h := t.hash(&k)
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	tab := s.tab.Load()
	if i, _, ok := probe(tab, k, h); ok {
		t.removeLocked(tab, i)
	}
}

// removeLocked turns slot i of tab, a live flow, into a tombstone. The
// shard mutex is held.
func (t *flowTable) removeLocked(tab *table, i uint64) {
	sl := &tab.slots[i]
	k := keyWords(&sl.key)
	k[2] = k[2]&^(3<<keyStateSft) | stateTomb<<keyStateSft
	sl.seq.Add(1)
	sl.key[2].Store(k[2])
	sl.seq.Add(1)
	tab.live--
	tab.tombs++
	t.n.Add(-1)
	if sl.dst[2].Load()&dstConfirmed != 0 {
		t.expired[1].Add(1)
	} else {
		t.pending.Add(-1)
		t.lim.release(&k)
		t.expired[0].Add(1)
	}
}

// sweep expires pending flows created more than pending ago (client
// retransmissions do not extend them: a transceiver that never answers must
// not pin the flow), confirmed flows idle for more than idle, and flows whose
// transceiver has left the membership table (isMember false). A shard whose
// table is more than a quarter tombstones is rebuilt.
func (t *flowTable) sweep(now int64, pending, idle int64, isMember func(netip.AddrPort) bool) {
	for si := range t.shards {
		s := &t.shards[si]
		s.mu.Lock()
		tab := s.tab.Load()
		for i := range tab.slots {
			sl := &tab.slots[i]
			if state(keyWords(&sl.key)) != stateLive {
				continue
			}
			var dead bool
			if sl.dst[2].Load()&dstConfirmed != 0 {
				dead = now-sl.last.Load() > idle
			} else {
				dead = now-tab.cold[i].created.Load() > pending
			}
			if dead || !isMember(keyWords(&sl.dst).addrPort()) {
				t.removeLocked(tab, uint64(i))
				continue
			}
			tab.expireCandidate(i, now, pending)
		}
		if uint64(tab.tombs) > (tab.mask+1)/4 {
			t.rehash(s, tab, tab.live)
		}
		s.mu.Unlock()
	}
}
