package relay

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
)

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
