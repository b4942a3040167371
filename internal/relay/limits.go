package relay

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
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
//   - NewFlowsPerIP, NewFlowBurstPerIP: the rate at which a source IP may
//     create flows, and how many it may create at once (a token bucket);
//   - NewFlowsPerSecond: flows all sources together may create per second.
//
// A "source IP" is an IPv4 address or an IPv6 /64 (one subscriber usually
// holds a whole /64, so a per-/128 cap would be no cap). The caps apply to
// Binding requests that carry a valid token for a member and would create a
// flow: garbage never consumes a source's budget, and datagrams on an
// existing flow (consent checks, retransmissions, media) never count.
// Reaching a cap drops the datagram and counts it; it never evicts or
// changes a flow.
//
// Delayed, not refused. Many clients share one IP (an office, a
// carrier-grade NAT) and start together; an ICE agent retransmits an
// unanswered check (RFC 8489 §6.2.1) but gives up after a second or two
// (Pion after about 1.6 s). A fixed budget per window would leave it to luck
// whose retransmission finds room, and turn some clients away for good. So
// the per-source rate is a token bucket (GCRA, ITU-T I.371) with a queue: a
// request over its source's bucket is given a turn, the next free one of
// its source, if that turn is at most maxFlowDelay away, and dropped as
// source_rate_delayed; the client's first retransmission at or after its
// turn creates the flow without spending more of the budget. Turns are
// handed out in arrival order, so a client waits for the clients before it,
// not for luck. A request whose turn would be further away than
// maxFlowDelay (the source is creating flows faster than its rate for
// longer than a second), or that finds the waiting table full, is refused
// (source_rate_limit); the client's retransmission tries again.
//
// State. Per source, a fixed array of limitSlots words, allocated once; a
// source IP hashes (seeded, so a client cannot choose its slot) to one word:
//
//	bits 20-63  the bucket's theoretical arrival time (GCRA's TAT), in ticks
//	            of 1.024 µs of the relay's monotonic clock, mod 2^44
//	bits  0-19  pending flows
//
// updated with compare-and-swap, so the first-packet path takes no lock and
// allocates nothing while no client waits for a turn. Turns live in a fixed
// table of waitSlots entries (client address hash, turn), under a mutex,
// consulted only while some turn is outstanding. Two source IPs that share
// a slot share its budget: collisions only ever make the limits stricter,
// never looser. With 2^16 slots and a few thousand sources creating flows in
// the same second, a source shares its slot with another with probability
// of a few percent; the overall cap is one word of its own, a fixed
// one-second window.

const (
	// DefaultMaxPendingPerIP is the default Config.MaxPendingPerIP.
	DefaultMaxPendingPerIP = 16
	// DefaultNewFlowsPerIP is the default Config.NewFlowsPerIP (per second).
	DefaultNewFlowsPerIP = 20
	// DefaultNewFlowBurstPerIP is the default Config.NewFlowBurstPerIP: as
	// many flows at once as a transceiver admits sessions not yet
	// connected from one client address (its MaxPendingPerClient, 64), so
	// that the relay never turns away, for want of burst, a start that
	// signaling admitted (fifty clients of one office starting together,
	// docs/security.md "Caps").
	DefaultNewFlowBurstPerIP = 64
	// DefaultNewFlowsPerSecond is the default Config.NewFlowsPerSecond.
	DefaultNewFlowsPerSecond = 20_000
	// maxLimit bounds the per-source limits: they are 20-bit fields.
	maxLimit = 1<<20 - 1
	// maxFlowDelay is the longest a source's client is made to wait for its
	// turn: below a Pion client's patience (about 1.6 s from its first
	// check), so that a delayed client is still retransmitting at its turn.
	maxFlowDelay = time.Second
	// turnTTL is how long after its turn a client may still take it.
	turnTTL = 2 * time.Second

	limitSlots = 1 << 16 // power of two
	// waitSlots bounds the outstanding turns, all sources together; a
	// turn's hash picks a bucket of waitWays entries.
	waitSlots = 1 << 12
	waitWays  = 8

	limTickSft = 10 // a tick is 2^10 ns
	limTATSft  = 20
	limTATBits = 44
	limField   = 1<<20 - 1
)

// limiter holds the per-source and overall flow-creation state. Every field
// after the configuration is an atomic word, updated lock-free, but for the
// turns, which mu guards.
type limiter struct {
	// Set once by newLimiter, never mutated.
	maxPending, total uint64
	interval          int64 // ticks between flows of one source: 1 s / NewFlowsPerIP, at least one
	burst             int64 // ticks of credit: NewFlowBurstPerIP × interval
	maxDelay          int64 // ticks: maxFlowDelay
	seed              [2]uint64

	overall atomic.Uint64 // window<<32 | flows created in it
	slots   [limitSlots]atomic.Uint64

	// waiting counts outstanding turns; acquire takes mu only when it is
	// not zero, or to hand out a turn.
	waiting atomic.Int64
	mu      sync.Mutex
	turns   [waitSlots]turn // guarded by mu
}

// turn is a client's place in its source's queue: the client's address
// hash (0: free) and when it may create its flow (relay-monotonic ns).
type turn struct {
	client uint64
	at     int64
}

func newLimiter(maxPending, perIP, burst, total int) *limiter {
	second := int64(time.Second) >> limTickSft
	interval := max(second/int64(perIP), 1)
	return &limiter{
		maxPending: uint64(maxPending),
		total:      uint64(total),
		interval:   interval,
		burst:      int64(burst) * interval,
		maxDelay:   int64(maxFlowDelay) >> limTickSft,
		seed:       newSourceSeed(),
	}
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

// signed44 sign-extends a 44-bit tick difference.
func signed44(x uint64) int64 { return int64(x<<(64-limTATBits)) >> (64 - limTATBits) }

// acquire admits one new pending flow for client k at relay-monotonic time
// now (nanoseconds), or says which cap stops it. On success the caller owns
// one pending unit of k's source and must give it back with release when
// the flow is confirmed or removed. A nil limiter admits everything.
func (l *limiter) acquire(k *addrKey, now int64) DropReason {
	if l == nil {
		return dropNone
	}
	s := l.slotOf(k)
	if l.waiting.Load() > 0 {
		switch l.claim(k, now) {
		case turnNotYet:
			return DropSourceRateDelayed
		case turnTaken:
			// The budget was spent when the turn was given: only the
			// pending and overall caps are left.
			for {
				old := s.Load()
				if old&limField >= l.maxPending {
					return DropSourcePendingLimit
				}
				if s.CompareAndSwap(old, old+1) {
					return l.acquireOverall(k, now)
				}
			}
		}
	}
	const mask = 1<<limTATBits - 1
	t := uint64(now>>limTickSft) & mask
	for {
		old := s.Load()
		tat, pending := old>>limTATSft, old&limField
		if pending >= l.maxPending {
			return DropSourcePendingLimit
		}
		d := signed44(tat - t) // how far the bucket's TAT is ahead of now
		if d < 0 || d > l.burst+l.maxDelay {
			d = 0 // the bucket is full (or the word is older than the clock's wrap)
		}
		next := d + l.interval
		if wait := next - l.burst; wait > 0 {
			// Over the bucket: give the client the source's next turn.
			if wait > l.maxDelay {
				return DropSourceRateLimit
			}
			if !s.CompareAndSwap(old, (t+uint64(next))&mask<<limTATSft|pending) {
				continue
			}
			if !l.reserve(k, now+wait<<limTickSft, now) {
				return DropSourceRateLimit // the turn's budget is lost: stricter, never looser
			}
			return DropSourceRateDelayed
		}
		if s.CompareAndSwap(old, (t+uint64(next))&mask<<limTATSft|(pending+1)) {
			break
		}
	}
	return l.acquireOverall(k, now)
}

// acquireOverall checks the overall cap for a flow of k that already holds
// a pending unit of its source. The overall cap is checked after the
// source's, so that one source over its own cap never spends the budget of
// everybody else.
func (l *limiter) acquireOverall(k *addrKey, now int64) DropReason {
	win := uint64(now/int64(time.Second)) & (1<<32 - 1)
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

// clientHash is the seeded hash of client k's whole address (port
// included), never 0: a turn's owner.
func (l *limiter) clientHash(k *addrKey) uint64 {
	return mum(k[0]^l.seed[0], k[1]^l.seed[1]) ^ mum(k[2]^l.seed[1], l.seed[0]) | 1
}

// bucket returns the turns a client with hash h may occupy.
func (l *limiter) bucket(h uint64) []turn {
	i := (h >> 1) & (waitSlots/waitWays - 1) * waitWays
	return l.turns[i : i+waitWays]
}

// Results of claim.
const (
	turnNone   = iota // the client has no turn
	turnNotYet        // the client's turn has not come
	turnTaken         // the client's turn came and is now used
)

// claim looks up client k's turn at now. A turn that came is used up.
func (l *limiter) claim(k *addrKey, now int64) int {
	h := l.clientHash(k)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.bucket(h) {
		tn := &l.bucket(h)[i]
		switch {
		case tn.client != h:
		case now > tn.at+int64(turnTTL):
			l.free(tn)
		case now < tn.at:
			return turnNotYet
		default:
			l.free(tn)
			return turnTaken
		}
	}
	return turnNone
}

// reserve records client k's turn at (relay-monotonic ns), or reports that
// its bucket of the table is full of turns that have not expired.
func (l *limiter) reserve(k *addrKey, at, now int64) bool {
	h := l.clientHash(k)
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(h)
	for i := range b {
		tn := &b[i]
		if tn.client != 0 && now > tn.at+int64(turnTTL) {
			l.free(tn)
		}
		if tn.client == 0 {
			*tn = turn{client: h, at: at}
			l.waiting.Add(1)
			return true
		}
	}
	return false
}

// free empties turn tn; the caller holds mu.
func (l *limiter) free(tn *turn) {
	*tn = turn{}
	l.waiting.Add(-1)
}

// expire frees the turns nobody took by their deadline, so that acquire
// stops taking the mutex once no client waits. The sweeper calls it.
func (l *limiter) expire(now int64) {
	if l == nil || l.waiting.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.turns {
		if tn := &l.turns[i]; tn.client != 0 && now > tn.at+int64(turnTTL) {
			l.free(tn)
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
