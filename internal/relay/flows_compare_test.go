package relay

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
)

// The alternatives the flow table was measured against (docs/benchmarks.md):
// the previous 64-shard RWMutex map, and sync.Map (a HashTrieMap since Go
// 1.24, with lock-free reads; its values are pointers to mutable flows, so
// it would need the same free-list discipline as the old table).

type rwFlow struct {
	dst  netip.AddrPort
	last atomic.Int64
}

type rwShard struct {
	mu sync.RWMutex
	m  map[netip.AddrPort]*rwFlow
	_  [128 - 32]byte
}

type rwTable struct{ shards [numShards]rwShard }

func (t *rwTable) shard(a netip.AddrPort) *rwShard {
	k := keyOf(a)
	return &t.shards[mum(mum(k[0]^0x9E3779B97F4A7C15, k[1]^0xBF58476D1CE4E5B9), k[2]^0x94D049BB133111EB)>>58]
}

func (t *rwTable) touch(a netip.AddrPort, now int64) (netip.AddrPort, bool) {
	s := t.shard(a)
	s.mu.RLock()
	f := s.m[a]
	var dst netip.AddrPort
	if f != nil {
		dst = f.dst
		if f.last.Load() < now {
			f.last.Store(now)
		}
	}
	s.mu.RUnlock()
	return dst, f != nil
}

func benchClients(n int) []netip.AddrPort {
	clients := make([]netip.AddrPort, n)
	for i := range clients {
		clients[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(1024+i%50000))
	}
	return clients
}

// BenchmarkFlowLookupAlternatives looks up one of 100k flows, serially and
// from every P at once, in each candidate table.
func BenchmarkFlowLookupAlternatives(b *testing.B) {
	clients := benchClients(100_000)
	ours := newFlowTable(1 << 20)
	rw := &rwTable{}
	for i := range rw.shards {
		rw.shards[i].m = make(map[netip.AddrPort]*rwFlow)
	}
	var sm sync.Map
	for _, c := range clients {
		ours.upsert(c, t7, 7, nil, 1)
		rw.shard(c).m[c] = &rwFlow{dst: t7}
		sm.Store(c, &rwFlow{dst: t7})
	}
	impls := []struct {
		name  string
		touch func(netip.AddrPort) bool
	}{
		{"seqlock", func(c netip.AddrPort) bool { _, ok := ours.touch(c, 2); return ok }},
		{"rwmutex", func(c netip.AddrPort) bool { _, ok := rw.touch(c, 2); return ok }},
		{"syncmap", func(c netip.AddrPort) bool {
			v, ok := sm.Load(c)
			if ok {
				f := v.(*rwFlow)
				if f.last.Load() < 2 {
					f.last.Store(2)
				}
			}
			return ok
		}},
	}
	for _, im := range impls {
		b.Run(im.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if !im.touch(clients[i%len(clients)]) {
					b.Fatal("miss")
				}
				i += 7919
			}
		})
		b.Run(im.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					im.touch(clients[i%len(clients)])
					i += 7919
				}
			})
		})
	}
}
