package relay

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// MisconfigLogInterval is the least time between two log lines of one
// misconfiguration drop reason (misconfigHints): the first drop of a
// reason is logged at the next sweep (within a second), later ones at
// most once per interval, with how many there were since the last line.
const MisconfigLogInterval = 30 * time.Second

// misconfigHints are the drop reasons that on a relay's own fleet mean,
// more often than an attack, that the relay and its transceivers are set
// up differently, with the likely cause, worded for the log. A call
// through a relay that drops its checks times out with nothing else in
// any log, so these are logged (rate-limited) and not only counted.
var misconfigHints = map[DropReason]string{
	DropTokenForged: "tokens do not verify with this relay's key: is -token-key the same on every relay and transceiver? " +
		"(a few now and then are strangers probing the port)",
	DropTokenUnknownKey: "tokens are sealed with a key id this relay does not hold: is -token-key-id the same on every relay and transceiver, " +
		"or was a key rotation step skipped (docs/token.md, Rotation)?",
	DropWrongCluster:       "tokens name another cluster: is -cluster the same on this relay and its transceivers?",
	DropUnknownTransceiver: "tokens name a transceiver id that is not in this relay's membership: is every transceiver's -id in the relay's -members (id=ip:port)?",
	DropInternalUnknownPeer: "internal-hop datagrams come from an address outside the membership: " +
		"is each transceiver's -listen address the one the relay's -members gives for its id?",
}

// misconfigReasons are misconfigHints' keys in a fixed order.
var misconfigReasons = slices.Sorted(maps.Keys(misconfigHints))

// misconfigLog is the state of the misconfiguration log (Relay.watchDrops).
// The handlers write only the samples; the sweeper owns the rest.
type misconfigLog struct {
	// sample[reason] is a detail of the last such drop, written by the
	// handlers (atomic, no allocation): the token's transceiver id for
	// unknown_transceiver, its cluster for wrong_cluster, plus one, 0
	// for none.
	sample [NumDropReasons]atomic.Uint64

	// Owned by the sweeper goroutine.
	seen   [NumDropReasons]uint64    // the counters at the last line of each reason
	logged [NumDropReasons]time.Time // when the last line of each reason was written
	first  [NumDropReasons]bool      // whether a line was written yet
}

// watchDrops logs the misconfiguration drops counted since the last line
// of their reason, at most once per interval per reason. It runs in the
// sweeper.
func (r *Relay) watchDrops(now time.Time) {
	m := &r.misconfig
	every := r.tune.misconfigEvery
	for _, reason := range misconfigReasons {
		var n uint64
		for _, w := range r.workers {
			n += w.c.drops[reason].Load()
		}
		if n == m.seen[reason] || (m.first[reason] && now.Sub(m.logged[reason]) < every) {
			continue
		}
		attrs := []any{"reason", reason.String(), "dropped", n - m.seen[reason]}
		if m.first[reason] {
			attrs = append(attrs, "since", now.Sub(m.logged[reason]).Round(time.Second))
		}
		if s := m.sample[reason].Load(); s != 0 {
			switch reason {
			case DropUnknownTransceiver:
				attrs = append(attrs, "token_transceiver", s-1, "members", r.membersString())
			case DropWrongCluster:
				attrs = append(attrs, "token_cluster", s-1, "cluster", r.cfg.Cluster)
			}
		} else if reason == DropInternalUnknownPeer {
			attrs = append(attrs, "members", r.membersString())
		}
		attrs = append(attrs, "likely_cause", misconfigHints[reason])
		r.log.Warn("relay: dropping datagrams", attrs...)
		m.seen[reason], m.logged[reason], m.first[reason] = n, now, true
	}
}

// noteDrop records a detail of a misconfiguration drop for watchDrops:
// v is the token's transceiver id or cluster.
func (r *Relay) noteDrop(reason DropReason, v uint32) {
	r.misconfig.sample[reason].Store(uint64(v) + 1)
}

// membersString is the membership table as -members writes it, at most 8
// entries ("1=127.0.0.1:4000,2=…").
func (r *Relay) membersString() string {
	e := r.members.Entries()
	if len(e) == 0 {
		return "(none)"
	}
	ids := slices.Sorted(maps.Keys(e))
	var b strings.Builder
	for i, id := range ids {
		if i == 8 {
			b.WriteString(",…")
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(id), 10) + "=" + e[id].String())
	}
	return b.String()
}
