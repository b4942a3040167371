package relay

import (
	"crypto/rand"
	"encoding/binary"
	"sync/atomic"
	"time"
)

// Per-source and overall caps on flow creation (docs/security.md).
//
// The flow table's own cap (Config.MaxFlows) bounds memory; the limiter
// below keeps one source from taking that whole budget, or the whole
// first-packet CPU budget, with tokens it obtained through signaling:
//
//   - MaxPendingPerIP: pending (unconfirmed) flows per source IP;
//   - NewFlowsPerIP: flows a source IP may create per second;
//   - NewFlowsPerSecond: flows all sources together may create per second.
//
// A "source IP" is an IPv4 address or an IPv6 /64 (one subscriber usually
// holds a whole /64, so a per-/128 cap would be no cap). The caps apply to
// Binding requests that carry a valid token for a member and would create a
// flow: garbage never consumes a source's budget, and datagrams on an
// existing flow (consent checks, retransmissions, media) never count.
// Reaching a cap drops the datagram and counts it (source_rate_limit,
// source_pending_limit, new_flow_rate_limit); it never evicts or changes a
// flow. The client's ICE agent retransmits the check (RFC 8489 §6.2.1), so a
// legitimate client over a cap is delayed, not refused.
//
// State is a fixed array of limitSlots words, allocated once; a source IP
// hashes (seeded, so a client cannot choose its slot) to one word:
//
//	bits 40-63  rate window: the second of the relay's monotonic clock, mod 2^24
//	bits 20-39  flows created in that window
//	bits  0-19  pending flows
//
// updated with compare-and-swap, so the first-packet path takes no lock and
// allocates nothing. Two source IPs that share a slot share its budget:
// collisions only ever make the limits stricter, never looser. With 2^16
// slots and a few thousand sources creating flows in the same second, a
// source shares its slot with another with probability of a few percent;
// the overall cap is one word of its own.
//
// The windows are fixed one-second windows, so a source can create up to
// twice its rate across a window boundary; that is the price of one word
// per source and is well inside what the table tolerates.

const (
	// DefaultMaxPendingPerIP is the default Config.MaxPendingPerIP.
	DefaultMaxPendingPerIP = 16
	// DefaultNewFlowsPerIP is the default Config.NewFlowsPerIP (per second).
	DefaultNewFlowsPerIP = 20
	// DefaultNewFlowsPerSecond is the default Config.NewFlowsPerSecond.
	DefaultNewFlowsPerSecond = 20_000
	// maxLimit bounds the per-source limits: they are 20-bit fields.
	maxLimit = 1<<20 - 1

	limitSlots = 1 << 16 // power of two

	limCountSft = 20
	limWinSft   = 40
	limField    = 1<<20 - 1
)

// limiter holds the per-source and overall flow-creation state. Every field
// after the configuration is an atomic word, updated lock-free.
type limiter struct {
	// Set once by newLimiter, never mutated.
	maxPending, perIP, total uint64
	seed                     [2]uint64

	overall atomic.Uint64 // window<<32 | flows created in it
	slots   [limitSlots]atomic.Uint64
}

func newLimiter(maxPending, perIP, total int) *limiter {
	return &limiter{maxPending: uint64(maxPending), perIP: uint64(perIP), total: uint64(total), seed: newSourceSeed()}
}

// sourceHash is the seeded hash of client key k's source IP: an IPv4
// address, or an IPv6 /64. The limiter's slots and the flow cache's
// per-source hold counts (flowcache.go) are both indexed by it.
func sourceHash(k *addrKey, seed *[2]uint64) uint64 {
	lo := k[1] // IPv4 sits in the low word (as IPv4-mapped); IPv6 uses the /64 only
	if k[2]&keyIs4 == 0 {
		lo = 0
	}
	return mum(k[0]^seed[0], lo^seed[1])
}

// newSourceSeed returns a random seed for sourceHash.
func newSourceSeed() (seed [2]uint64) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	seed[0] = binary.LittleEndian.Uint64(b[0:]) | 1
	seed[1] = binary.LittleEndian.Uint64(b[8:]) | 1
	return seed
}

// slotOf returns the slot of client key k's source IP (IPv4 address or IPv6 /64).
func (l *limiter) slotOf(k *addrKey) *atomic.Uint64 {
	return &l.slots[sourceHash(k, &l.seed)&(limitSlots-1)]
}

// acquire admits one new pending flow for client k at relay-monotonic time
// now (nanoseconds), or says which cap stops it. On success the caller owns
// one pending unit of k's source and must give it back with release when
// the flow is confirmed or removed. A nil limiter admits everything.
func (l *limiter) acquire(k *addrKey, now int64) DropReason {
	if l == nil {
		return dropNone
	}
	win := uint64(now/int64(time.Second)) & (1<<24 - 1)
	s := l.slotOf(k)
	for {
		old := s.Load()
		count, pending := old>>limCountSft&limField, old&limField
		if old>>limWinSft != win {
			count = 0
		}
		switch {
		case count >= l.perIP:
			return DropSourceRateLimit
		case pending >= l.maxPending:
			return DropSourcePendingLimit
		}
		if s.CompareAndSwap(old, win<<limWinSft|(count+1)<<limCountSft|(pending+1)) {
			break
		}
	}
	// The overall cap is checked second, so that one source over its own
	// cap never spends the budget of everybody else.
	for {
		old := l.overall.Load()
		count := old & (1<<32 - 1)
		if old>>32 != win {
			count = 0
		}
		if count >= l.total {
			l.release(k)
			return DropNewFlowRateLimit
		}
		if l.overall.CompareAndSwap(old, win<<32|(count+1)) {
			return dropNone
		}
	}
}

// release gives back one pending unit of client k's source: its flow was
// confirmed or removed while pending.
func (l *limiter) release(k *addrKey) {
	if l == nil {
		return
	}
	s := l.slotOf(k)
	for {
		old := s.Load()
		if old&limField == 0 {
			return // cannot happen: every release follows an acquire
		}
		if s.CompareAndSwap(old, old-1) {
			return
		}
	}
}

// pendingOf returns the pending count of client k's source slot (tests).
func (l *limiter) pendingOf(k addrKey) int { return int(l.slotOf(&k).Load() & limField) }
