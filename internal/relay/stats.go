package relay

import (
	"net"
	"sync/atomic"

	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// direction indexes the packet and byte counters.
type direction uint8

const (
	toTransceiver direction = iota // client → transceiver
	toClient                       // transceiver → client
	numDirections
)

var directionNames = [numDirections]string{"to_transceiver", "to_client"}

// counters are one worker's hot counters: each is written by one read loop
// (uncontended atomic adds) and read by Stats and the metrics collector.
type counters struct {
	drops   [NumDropReasons]atomic.Uint64
	packets [numDirections]atomic.Uint64 // forwarded datagrams
	bytes   [numDirections]atomic.Uint64 // forwarded payload bytes, hop header excluded
	_       [64]byte
}

// Stats is a snapshot of the relay's counters.
type Stats struct {
	Flows        int // flows in the table, pending and confirmed
	PendingFlows int // flows whose transceiver has not answered yet
	FlowsCreated uint64
	// FlowsRelearned counts flows rebuilt from a member's traffic (Config.Relearn).
	FlowsRelearned uint64
	// FlowsRestored counts flows recreated from the flow cache (Config.FlowStore).
	FlowsRestored uint64
	// FlowsExpired counts flows removed by the sweeper, by the state they were in.
	FlowsExpiredPending, FlowsExpiredConfirmed uint64

	// Forwarded datagrams and their payload bytes (hop header excluded).
	ToTransceiverPackets, ToTransceiverBytes uint64
	ToClientPackets, ToClientBytes           uint64

	// Drops counts dropped datagrams by reason; Drops[0] is unused.
	Drops [NumDropReasons]uint64
	// PublicSocketDrops and InternalSocketDrops count datagrams the
	// kernel dropped at the public and the internal sockets, all workers
	// together, because their receive buffers were full (udpio.Drops;
	// 0 where the OS does not tell): the relay never read them, so they
	// are in no Drops reason.
	PublicSocketDrops, InternalSocketDrops uint64

	// FlowCache is zero without the flow cache (Config.FlowStore).
	FlowCache FlowCacheStats
	// TCP is zero without ICE-TCP (Config.TCPAddr). Frames it dropped are
	// in Drops too.
	TCP TCPStats
	// Waiting are the first packets a per-source cap delayed (wait.go):
	// held now, and counted by what became of them. Those it forwarded
	// are in ToTransceiverPackets, those it dropped in Drops.
	Waiting  int
	Held     uint64 // requests held (a client's retransmission replacing its held one counts again)
	Admitted uint64 // held requests forwarded once a cap let them through
	Expired  uint64 // held requests dropped after waitHold (2 s)
	NotHeld  uint64 // requests the waiting room had no room for (dropped)
}

// TCPStats are the ICE-TCP side's counters (tcp.go).
type TCPStats struct {
	// Open is the number of open connections, Established those whose
	// first frame was admitted.
	Open, Established int
	// Accepted counts connections accepted (refused ones included).
	Accepted uint64
	// Closed counts connections closed or refused, by reason.
	Closed [NumTCPCloseReasons]uint64
	// Frames forwarded and their packets' bytes (framing and hop header
	// excluded): client → transceiver, and transceiver → client as
	// written to the connections.
	ToTransceiverFrames, ToTransceiverBytes uint64
	ToClientFrames, ToClientBytes           uint64
}

// FlowCacheStats are the flow cache's counters (flowcache.go). Held
// datagrams the cache forwards are in ToTransceiverPackets too, and those
// it drops in Drops.
type FlowCacheStats struct {
	Up bool // the last call to the cache worked (or none failed yet)
	// Held counts datagrams held for a lookup.
	Held uint64
	// Forwarded counts held datagrams sent to a transceiver.
	Forwarded uint64
	// Lookups are clients looked up, by result.
	Hits, Misses, Stale, Errors, Refused uint64
	// Writes are flows written (OK), in a failed write (Failed), or not
	// written because the cache was backing off or the queue was full (Skipped).
	WritesOK, WritesFailed, WritesSkipped uint64
}

// Dropped returns the total of all drops.
func (s Stats) Dropped() uint64 {
	var n uint64
	for _, d := range s.Drops {
		n += d
	}
	return n
}

// Stats returns a snapshot of the counters. Counters are read one by one,
// so a snapshot taken under load is not exactly consistent across fields.
func (r *Relay) Stats() Stats {
	var s Stats
	s.Flows = int(r.flows.n.Load())
	s.PendingFlows = int(r.flows.pending.Load())
	s.FlowsCreated = r.flows.created.Load()
	s.FlowsRelearned = r.flows.relearned.Load()
	s.FlowsRestored = r.flows.restored.Load()
	s.FlowsExpiredPending = r.flows.expired[0].Load()
	s.FlowsExpiredConfirmed = r.flows.expired[1].Load()
	cs := make([]*counters, 0, len(r.workers)+1)
	for _, w := range r.workers {
		cs = append(cs, &w.c)
		for i, c := range [2]*net.UDPConn{w.public, w.internal} {
			if d, err := udpio.Drops(c); err == nil { // a closed socket keeps its last count
				w.sockDrops[i].Store(d)
			}
		}
		s.PublicSocketDrops += w.sockDrops[0].Load()
		s.InternalSocketDrops += w.sockDrops[1].Load()
	}
	if fc := r.fc; fc != nil {
		cs = append(cs, &fc.c)
		s.FlowCache = FlowCacheStats{
			Up:            fc.up.Load(),
			Held:          fc.held.Load(),
			Forwarded:     fc.c.packets[toTransceiver].Load(),
			Hits:          fc.lookedUp[lookupHit].Load(),
			Misses:        fc.lookedUp[lookupMiss].Load(),
			Stale:         fc.lookedUp[lookupStale].Load(),
			Errors:        fc.lookedUp[lookupError].Load(),
			Refused:       fc.lookedUp[lookupRefused].Load(),
			WritesOK:      fc.writes[writeOK].Load(),
			WritesFailed:  fc.writes[writeError].Load(),
			WritesSkipped: fc.writes[writeSkipped].Load(),
		}
	}
	if w := r.wait; w != nil {
		cs = append(cs, &w.c)
		s.Waiting = int(w.held.Load())
		s.Held, s.Admitted = w.results[waitHeld].Load(), w.results[waitAdmitted].Load()
		s.Expired, s.NotHeld = w.results[waitExpired].Load(), w.results[waitFull].Load()
	}
	if t := r.tcp; t != nil {
		s.TCP = TCPStats{
			Open:                int(t.open.Load()),
			Established:         int(t.established.Load()),
			Accepted:            t.accepted.Load(),
			ToTransceiverFrames: t.frames[toTransceiver].Load(),
			ToTransceiverBytes:  t.bytes[toTransceiver].Load(),
			ToClientFrames:      t.frames[toClient].Load(),
			ToClientBytes:       t.bytes[toClient].Load(),
		}
		for i := range s.TCP.Closed {
			s.TCP.Closed[i] = t.closes[i].Load()
		}
		for i := range s.Drops {
			s.Drops[i] += t.drops[i].Load()
		}
	}
	for _, c := range cs {
		for i := range s.Drops {
			s.Drops[i] += c.drops[i].Load()
		}
		s.ToTransceiverPackets += c.packets[toTransceiver].Load()
		s.ToTransceiverBytes += c.bytes[toTransceiver].Load()
		s.ToClientPackets += c.packets[toClient].Load()
		s.ToClientBytes += c.bytes[toClient].Load()
	}
	return s
}
