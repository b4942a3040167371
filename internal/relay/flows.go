package relay

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/switchboard-rtc/switchboard/internal/token"
)

const (
	numShards = 64 // power of two
	// maxFreePerShard bounds the flow structs kept for reuse after expiry.
	maxFreePerShard = 1024
)

// flow is one client's route: client address → transceiver.
//
// Locking rule: a *flow is touched only while its shard's lock is held,
// read-locked by the packet handlers or write-locked by create, replace and
// the sweeper. No pointer to a flow is used after the lock is released, so
// the sweeper may put expired flows on a free list and reuse them without a
// reader ever seeing a recycled struct.
type flow struct {
	// Written only under the shard's write lock.
	dst         netip.AddrPort  // the transceiver's internal address
	transceiver uint32          // the transceiver's id, from the token
	created     int64           // relay-monotonic nanoseconds
	ufrag       [token.Len]byte // server ufrag that created the flow (ICE restart detection)

	// Written under the read lock by concurrent handlers, hence atomic.
	lastSeen  atomic.Int64 // relay-monotonic nanoseconds, traffic either way
	confirmed atomic.Bool  // the transceiver has answered through this relay
}

type shard struct {
	mu   sync.RWMutex
	m    map[netip.AddrPort]*flow // mu guards m and free
	free []*flow
	_    [128 - 56]byte // one shard per two cache lines: no false sharing between locks
}

// flowTable is a sharded map from client address to flow. Reads take one
// shard read lock; the lock-free read path (an RCU-style snapshot like
// membership.Table, or a concurrent hash map) is a later step.
type flowTable struct {
	seed   uint64
	max    int64
	shards [numShards]shard

	n       atomic.Int64 // flows, pending and confirmed
	pending atomic.Int64 // flows not yet confirmed
	created atomic.Uint64
	expired [2]atomic.Uint64 // by state: 0 pending, 1 confirmed
}

func newFlowTable(max int) *flowTable {
	t := &flowTable{max: int64(max)}
	var s [8]byte
	_, _ = rand.Read(s[:])
	t.seed = binary.LittleEndian.Uint64(s[:])
	for i := range t.shards {
		t.shards[i].m = make(map[netip.AddrPort]*flow, 64)
	}
	return t
}

// shardOf spreads addresses over shards with a seeded mix, so that a client
// choosing its source ports cannot aim at one shard's lock.
func (t *flowTable) shardOf(a netip.AddrPort) *shard {
	b := a.Addr().As16()
	x := binary.LittleEndian.Uint64(b[0:8]) ^ t.seed
	x ^= binary.LittleEndian.Uint64(b[8:16])*0x9E3779B97F4A7C15 + uint64(a.Port())
	x ^= x >> 31
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 29
	return &t.shards[x&(numShards-1)]
}

// touch looks up the flow of client, refreshes it and returns where it goes.
func (t *flowTable) touch(client netip.AddrPort, now int64) (dst netip.AddrPort, ok bool) {
	s := t.shardOf(client)
	s.mu.RLock()
	f := s.m[client]
	if f != nil {
		dst = f.dst
		if f.lastSeen.Load() < now {
			f.lastSeen.Store(now)
		}
	}
	s.mu.RUnlock()
	return dst, f != nil
}

// sameUfrag reports whether client's flow exists and was created by ufrag.
func (t *flowTable) sameUfrag(client netip.AddrPort, ufrag []byte) bool {
	s := t.shardOf(client)
	s.mu.RLock()
	f := s.m[client]
	same := f != nil && string(f.ufrag[:]) == string(ufrag)
	s.mu.RUnlock()
	return same
}

// reply handles traffic from transceiver from for client: it refreshes and
// confirms the flow if the flow exists and points to from.
func (t *flowTable) reply(client, from netip.AddrPort, now int64) DropReason {
	s := t.shardOf(client)
	s.mu.RLock()
	defer s.mu.RUnlock()
	f := s.m[client]
	switch {
	case f == nil:
		return DropInternalNoFlow
	case f.dst != from:
		return DropInternalFlowMismatch
	}
	if f.lastSeen.Load() < now {
		f.lastSeen.Store(now)
	}
	if !f.confirmed.Load() && f.confirmed.CompareAndSwap(false, true) {
		t.pending.Add(-1)
	}
	return dropNone
}

// upsert creates a pending flow for client, or re-points an existing one
// (ICE restart, or two workers racing on the first packet). ufrag is at most
// token.Len bytes (the caller has opened it as a token).
func (t *flowTable) upsert(client, dst netip.AddrPort, transceiver uint32, ufrag []byte, now int64) DropReason {
	s := t.shardOf(client)
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.m[client]; f != nil {
		if f.dst == dst && string(f.ufrag[:]) == string(ufrag) {
			f.lastSeen.Store(now)
			return dropNone
		}
		// A new token: route to its transceiver, pending until it answers.
		f.dst, f.transceiver, f.created = dst, transceiver, now
		copy(f.ufrag[:], ufrag)
		f.lastSeen.Store(now)
		if f.confirmed.Swap(false) {
			t.pending.Add(1)
		}
		t.created.Add(1)
		return dropNone
	}
	if t.n.Add(1) > t.max {
		t.n.Add(-1)
		return DropFlowTableFull
	}
	var f *flow
	if n := len(s.free); n > 0 {
		f, s.free[n-1] = s.free[n-1], nil
		s.free = s.free[:n-1]
	} else {
		f = new(flow)
	}
	f.dst, f.transceiver, f.created = dst, transceiver, now
	f.ufrag = [token.Len]byte{}
	copy(f.ufrag[:], ufrag)
	f.lastSeen.Store(now)
	f.confirmed.Store(false)
	s.m[client] = f
	t.pending.Add(1)
	t.created.Add(1)
	return dropNone
}

// removeLocked deletes client's flow f from s, whose write lock is held.
func (t *flowTable) removeLocked(s *shard, client netip.AddrPort, f *flow) {
	delete(s.m, client)
	t.n.Add(-1)
	if f.confirmed.Load() {
		t.expired[1].Add(1)
	} else {
		t.pending.Add(-1)
		t.expired[0].Add(1)
	}
	if len(s.free) < maxFreePerShard {
		s.free = append(s.free, f)
	}
}

// remove deletes client's flow if there is one.
func (t *flowTable) remove(client netip.AddrPort) {
	s := t.shardOf(client)
	s.mu.Lock()
	if f := s.m[client]; f != nil {
		t.removeLocked(s, client, f)
	}
	s.mu.Unlock()
}

// sweep expires pending flows created more than pending ago (client
// retransmissions do not extend them: a transceiver that never answers must
// not pin the flow), confirmed flows idle for more than idle, and flows whose
// transceiver has left the membership table (isMember false).
func (t *flowTable) sweep(now int64, pending, idle int64, isMember func(netip.AddrPort) bool) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for client, f := range s.m {
			var dead bool
			if f.confirmed.Load() {
				dead = now-f.lastSeen.Load() > idle
			} else {
				dead = now-f.created > pending
			}
			if dead || !isMember(f.dst) {
				t.removeLocked(s, client, f)
			}
		}
		s.mu.Unlock()
	}
}
