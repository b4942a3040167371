package relay

import (
	"net/netip"
	"sync/atomic"

	"github.com/switchboard-rtc/switchboard/internal/token"
)

// ICE restart to another transceiver, confirmed before it takes effect.
//
// A Binding request on an existing flow whose server ufrag is a valid token
// for a *different* transceiver does not re-point the flow at once. It
// becomes the flow's candidate: that request, and later ones with the same
// ufrag, go to the candidate's transceiver, while everything else (media,
// DTLS, consent checks with the flow's own ufrag) keeps going to the
// flow's transceiver. The first datagram the candidate's transceiver sends
// for the client (its Binding success response, which it sends only if the
// request's MESSAGE-INTEGRITY checks with that session's pwd) promotes the
// candidate: the flow now points there, confirmed. A candidate nobody
// answers is cleared by the sweeper after PendingTimeout.
//
// So a Binding request spoofed from a victim's address with a sniffed,
// stale or otherwise unanswered token never moves the victim's media (see
// docs/security.md for what remains). A new token for the flow's own
// transceiver (the usual ICE restart) changes where nothing goes, so it is
// applied at once, as before.

// candidate is a re-point in waiting, in the cold part of a flow's slot,
// written under the slot's seqlock with the shard mutex held.
type candidate struct {
	dst   [3]atomic.Uint64 // transceiver addrKey; zero: no candidate
	via   [3]atomic.Uint64
	tr    atomic.Uint64
	at    atomic.Int64 // relay-monotonic nanoseconds it was proposed
	ufrag [token.Len / 8]atomic.Uint64
}

// clear removes the candidate. The caller holds the shard mutex and either
// holds the slot's seqlock or owns an unpublished table.
func (c *candidate) clear() {
	for j := range 3 {
		c.dst[j].Store(0)
	}
}

// copyFrom copies o into c, an entry of a table not yet published.
func (c *candidate) copyFrom(o *candidate) {
	for j := range 3 {
		c.dst[j].Store(o.dst[j].Load())
		c.via[j].Store(o.via[j].Load())
	}
	c.tr.Store(o.tr.Load())
	c.at.Store(o.at.Load())
	for j := range c.ufrag {
		c.ufrag[j].Store(o.ufrag[j].Load())
	}
}

// ufragMatch says how a server ufrag relates to a client's flow.
type ufragMatch uint8

const (
	ufragNew       ufragMatch = iota // neither (or no flow)
	ufragCurrent                     // the ufrag that created or last re-pointed the flow
	ufragCandidate                   // the flow's candidate's ufrag
)

// matchUfrag compares ufrag with client's flow, without locking; for
// ufragCandidate it also returns the candidate's destination.
func (t *flowTable) matchUfrag(client netip.AddrPort, ufrag []byte) (ufragMatch, netip.AddrPort) {
	want, ok := ufragWords(ufrag)
	if !ok {
		return ufragNew, netip.AddrPort{}
	}
	k := keyOf(client)
	h := t.hash(&k)
	tab := t.shardOf(h).tab.Load()
	for {
		i, seq, hit := probe(tab, k, h)
		if !hit {
			return ufragNew, netip.AddrPort{}
		}
		c := &tab.cold[i]
		var cur, cand [token.Len / 8]uint64
		for j := range cur {
			cur[j] = c.ufrag[j].Load()
			cand[j] = c.cand.ufrag[j].Load()
		}
		cd := keyWords(&c.cand.dst)
		if tab.slots[i].seq.Load() != seq {
			continue
		}
		switch {
		case cur == want:
			return ufragCurrent, netip.AddrPort{}
		case cd != (addrKey{}) && cand == want:
			return ufragCandidate, cd.addrPort()
		}
		return ufragNew, netip.AddrPort{}
	}
}

// propose makes (dst, via, transceiver, ufrag) client's flow's candidate,
// replacing any earlier one. It reports false if client has no flow.
func (t *flowTable) propose(client, dst, via netip.AddrPort, transceiver uint32, ufrag []byte, now int64) bool {
	k := keyOf(client)
	uw, _ := ufragWords(ufrag)
	dk, vk := keyOf(dst), viaKey(via)
	h := t.hash(&k)
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	tab := s.tab.Load()
	i, _, ok := probe(tab, k, h)
	if !ok {
		return false
	}
	sl, c := &tab.slots[i], &tab.cold[i].cand
	sl.seq.Add(1)
	for j := range 3 {
		c.dst[j].Store(dk[j])
		c.via[j].Store(vk[j])
	}
	c.tr.Store(uint64(transceiver))
	c.at.Store(now)
	for j := range uw {
		c.ufrag[j].Store(uw[j])
	}
	sl.seq.Add(1)
	return true
}

// promote re-points client k's flow to its candidate if the candidate's
// transceiver is from: the flow becomes confirmed, with the candidate's
// ufrag, transceiver id and via, which it returns.
func (t *flowTable) promote(k addrKey, h uint64, from addrKey, now int64) (via addrKey, ok bool) {
	// Lock-free check first: a member's mismatched replies must not take
	// the shard lock unless a candidate names it.
	tab := t.shardOf(h).tab.Load()
	if i, _, hit := probe(tab, k, h); !hit || keyWords(&tab.cold[i].cand.dst) != from {
		return via, false
	}
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	tab = s.tab.Load()
	i, _, hit := probe(tab, k, h)
	if !hit {
		return via, false
	}
	sl, c := &tab.slots[i], &tab.cold[i]
	if keyWords(&c.cand.dst) != from {
		return via, false
	}
	var uw [token.Len / 8]uint64
	for j := range uw {
		uw[j] = c.cand.ufrag[j].Load()
	}
	via = keyWords(&c.cand.via)
	wasPending := sl.dst[2].Load()&dstConfirmed == 0
	dst := from
	dst[2] |= dstConfirmed
	tab.write(i, keyWords(&sl.key), dst, via, c.cand.tr.Load(), c.created.Load(), now, uw) // clears the candidate
	if wasPending {
		t.pending.Add(-1)
		t.lim.release(&k)
	}
	t.created.Add(1)
	if t.onConfirm != nil && !k.isTCP() {
		t.onConfirm(k)
	}
	return via, true
}

// expireCandidate clears slot i's candidate if it was proposed more than
// pending ago. The shard mutex is held.
func (tab *table) expireCandidate(i int, now, pending int64) {
	c := &tab.cold[i].cand
	if keyWords(&c.dst) == (addrKey{}) || now-c.at.Load() <= pending {
		return
	}
	sl := &tab.slots[i]
	sl.seq.Add(1)
	c.clear()
	sl.seq.Add(1)
}
