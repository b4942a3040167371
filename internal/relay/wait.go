package relay

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// Held first packets: delayed, not refused (docs/security.md, "Caps").
//
// A Binding request with a valid token that a per-source cap turns away
// for the moment (its source is over its rate: source_rate_delayed,
// source_rate_limit; or holds MaxPendingPerIP unanswered flows:
// source_pending_limit) is not only dropped for its client's ICE agent to
// retransmit: the relay keeps the client's latest such request and tries
// its flow again every waitRetry, for up to waitHold, and forwards it the
// moment a cap lets it through. So the many clients of one NAT that start
// at once (an office, a carrier-grade NAT) are delayed by at most the
// time their turns take, whatever their agents' retransmission schedules:
// Pion gives a pair up after about 1.6 s of unanswered checks, but keeps
// a request's transaction for 4 s, and browsers longer, so a held request
// answered within waitHold still connects the client.
//
// Bounds: a fixed table of heldSlots requests of at most heldDatagram
// bytes (allocated by New: 1 MiB), at most heldPerSource of one source IP
// (IPv6: /64; by the limiter's seeded source hash), one per client
// address (a retransmission replaces its request: the older is dropped
// and counted under its cap's reason), each held at most waitHold (then
// dropped, counted under the cap that held it last). A request the table
// has no room for is dropped as before. The route of a held request (its
// token's transceiver) is kept from when it was first read, so a retry
// opens no token; it is checked against the membership table again.
// Requests over TCP are not held here: their connection's goroutine waits
// (tcp.go).
const (
	heldSlots     = 1024
	heldPerSource = 64
	heldDatagram  = 1024
	waitRetry     = 10 * time.Millisecond
	waitHold      = 2 * time.Second
)

// Results of a request the waiting room saw, the values of
// switchboard_relay_held_requests_total{result}.
const (
	waitHeld     = iota // held (or, for a client already held, its request replaced)
	waitAdmitted        // a held request made its flow and was forwarded
	waitExpired         // held waitHold without a cap letting it through; dropped
	waitFull            // not held: the table or the source's share was full; dropped
	numWaitResults
)

var waitResultNames = [numWaitResults]string{"held", "admitted", "expired", "full"}

// holdable reports whether drop is a cap a held request may get past later.
func holdable(drop DropReason) bool {
	return drop == DropSourceRateDelayed || drop == DropSourceRateLimit || drop == DropSourcePendingLimit
}

// waiting is one held request.
type waiting struct {
	client, via, dst netip.AddrPort
	tr               uint32
	ufrag            [token.Len]byte
	n                int    // datagram length
	since            int64  // relay-monotonic ns when first held
	gen              uint64 // bumped by every change, so a retry knows it saw the latest
	last             DropReason
}

// waitRoom holds the requests; mu guards everything but the counters.
type waitRoom struct {
	// Set once.
	r    *Relay
	sock *net.UDPConn // worker 0's internal socket, which sends what it admits
	kick chan struct{}

	mu       sync.Mutex
	slots    [heldSlots]waiting
	used     [heldSlots]bool
	bufs     []byte // heldSlots × (hop.MaxHeaderLen + heldDatagram): each request after its headroom
	byClient map[netip.AddrPort]int
	bySource [limitSlots / 16]uint8 // held requests per source hash bucket
	n        int

	held    atomic.Int64
	results [numWaitResults]atomic.Uint64
	c       counters // forwards and drops, summed into Stats
}

const heldBuf = hop.MaxHeaderLen + heldDatagram

func newWaitRoom(r *Relay) *waitRoom {
	return &waitRoom{r: r, kick: make(chan struct{}, 1), bufs: make([]byte, heldSlots*heldBuf), byClient: make(map[netip.AddrPort]int, heldSlots)}
}

func (w *waitRoom) buf(i int) []byte { return w.bufs[i*heldBuf : (i+1)*heldBuf] }

func (w *waitRoom) sourceBucket(client netip.AddrPort) *uint8 {
	k := keyOf(client)
	return &w.bySource[sourceHash(&k, &w.r.flows.lim.seed)%uint64(len(w.bySource))]
}

// hold keeps pkt, client's Binding request (through via; invalid: direct)
// whose token routed to dst, transceiver tr, under ufrag, which cap drop
// turned away at t, and reports whether it did. A request it holds is
// the waiting room's to forward or drop; one it does not is the caller's
// to drop under drop.
func (w *waitRoom) hold(client, via, dst netip.AddrPort, tr uint32, ufrag []byte, pkt []byte, drop DropReason, t int64) bool {
	if w == nil || len(pkt) > heldDatagram || len(ufrag) != token.Len || hop.IsTCP(client) {
		return false
	}
	w.mu.Lock()
	i, ok := w.byClient[client]
	switch {
	case ok:
		// A retransmission: keep the newest (the client's agent matches
		// its answer), drop the one it replaces.
		w.c.drops[w.slots[i].last].Add(1)
	case w.n == heldSlots:
		w.mu.Unlock()
		w.results[waitFull].Add(1)
		return false
	default:
		src := w.sourceBucket(client)
		if *src >= heldPerSource {
			w.mu.Unlock()
			w.results[waitFull].Add(1)
			return false
		}
		for i = 0; w.used[i]; i++ {
		}
		*src++
		w.used[i] = true
		w.byClient[client] = i
		w.n++
		w.slots[i].since = t
		w.held.Add(1)
	}
	s := &w.slots[i]
	s.client, s.via, s.dst, s.tr, s.last = client, via, dst, tr, drop
	s.gen++
	copy(s.ufrag[:], ufrag)
	s.n = copy(w.buf(i)[hop.MaxHeaderLen:], pkt)
	w.mu.Unlock()
	w.results[waitHeld].Add(1)
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return true
}

// free empties slot i; w.mu is held.
func (w *waitRoom) free(i int) {
	*w.sourceBucket(w.slots[i].client)--
	delete(w.byClient, w.slots[i].client)
	w.used[i] = false
	w.slots[i] = waiting{gen: w.slots[i].gen + 1}
	w.n--
	w.held.Add(-1)
}

// loop retries the held requests every waitRetry while there are any.
func (w *waitRoom) loop(ctx context.Context) {
	defer w.r.wg.Done()
	tick := time.NewTicker(waitRetry)
	defer tick.Stop()
	for {
		if w.held.Load() == 0 {
			select {
			case <-ctx.Done():
				return
			case <-w.kick:
			}
		}
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			w.retry(now)
		}
	}
}

// retry tries every held request's flow again at now: a request a cap
// lets through now is forwarded, as admit would have, with its hop header;
// one still turned away waits, up to waitHold. Each request is copied out
// under the mutex and tried outside it, so that a read loop holding a
// request never waits for a whole pass; a request changed meanwhile (a
// retransmission replaced it) is left for the next pass.
func (w *waitRoom) retry(now time.Time) {
	r := w.r
	t := r.mono(now)
	var s waiting
	var b [heldBuf]byte
	for i := range w.slots {
		w.mu.Lock()
		if !w.used[i] {
			w.mu.Unlock()
			continue
		}
		s = w.slots[i]
		copy(b[hop.MaxHeaderLen:], w.buf(i)[hop.MaxHeaderLen:hop.MaxHeaderLen+s.n])
		w.mu.Unlock()

		to, hit := r.flows.touch(s.client, t) // a retransmission may have made it meanwhile
		drop := dropNone
		switch {
		case hit:
		case !r.members.Contains(s.dst):
			drop = DropTransceiverGone
		default:
			drop = r.flows.upsertVia(s.client, s.dst, s.via, s.tr, s.ufrag[:], t)
			to = s.dst
		}
		wait := holdable(drop) && t-s.since < int64(waitHold)
		if !wait && drop == dropNone {
			start := hop.MaxHeaderLen - hop.HeaderLen(s.client.Addr())
			hop.PutHeader(b[start:], hop.TypeFor(s.client), s.client)
			if _, err := w.sock.WriteToUDPAddrPort(b[start:hop.MaxHeaderLen+s.n], to); err != nil {
				w.c.drops[DropWriteError].Add(1)
			} else {
				w.c.packets[toTransceiver].Add(1)
				w.c.bytes[toTransceiver].Add(uint64(s.n))
			}
		}

		w.mu.Lock()
		cur := &w.slots[i]
		switch {
		case !w.used[i] || cur.gen != s.gen:
			// Replaced meanwhile (its flow, if made, carries the newer).
		case wait:
			cur.last = drop
		case drop != dropNone:
			w.c.drops[drop].Add(1)
			w.results[waitExpired].Add(1)
			w.free(i)
		default:
			w.results[waitAdmitted].Add(1)
			w.free(i)
		}
		w.mu.Unlock()
	}
}

// heldTCP counts a TCP connection's first frame that starts (d 1) or ends
// (d -1) waiting on its own goroutine (tcp.go), with the held requests.
func (w *waitRoom) heldTCP(d int64) {
	w.held.Add(d)
	if d > 0 {
		w.results[waitHeld].Add(1)
	}
}
