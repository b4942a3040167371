package relay

import (
	"context"
	"net/netip"
	"time"
)

// onConfirm queues client k's confirmed flow for the writer. Called by the
// flow table with a shard lock held, from the internal read loop: it
// never blocks and allocates nothing.
func (fc *flowCache) onConfirm(k addrKey) {
	select {
	case fc.confirms <- k:
	default:
		fc.writes[writeSkipped].Add(1) // the next refresh pass writes it
	}
}

// failed records a failed Get or Put: back off, count, log at most once per logEvery.

// writeLoop is the writer goroutine: confirmations in batches as they
// come, and a refresh pass over the table every p.refresh.
func (fc *flowCache) writeLoop(ctx context.Context) {
	defer fc.r.wg.Done()
	w := &cacheWriter{fc: fc}
	// Probe the store at once, so that one missing from the start shows
	// in the gauge and the log without waiting for traffic.
	pctx, cancel := context.WithTimeout(ctx, fc.p.putTimeout)
	if err := fc.store.Get(pctx, []netip.AddrPort{{}}, make([][]byte, 1)); err != nil && ctx.Err() == nil {
		fc.failed("probe", err)
	}
	cancel()
	tick := time.NewTicker(fc.p.refresh)
	defer tick.Stop()
	// Each pass rewrites the flows with traffic since the previous one
	// began; the first covers everything.
	since := int64(-1 << 62)
	check := time.NewTicker(fc.p.minBackoff)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case k := <-fc.confirms:
			w.add(ctx, k)
		drain:
			for {
				select {
				case k := <-fc.confirms:
					w.add(ctx, k)
				default:
					break drain
				}
			}
			w.flush(ctx)
		case <-tick.C:
			since = w.refresh(ctx, since)
		case <-check.C:
			// Back from down: rewrite everything confirmed meanwhile.
			if fc.refreshed.Swap(false) {
				since = w.refresh(ctx, -1<<62)
			}
		}
	}
}

// cacheWriter batches entries for Put.
type cacheWriter struct {
	fc      *flowCache
	clients []netip.AddrPort
	values  [][]byte
	arena   []byte
}

// add queues client k's flow if it is confirmed.
func (w *cacheWriter) add(ctx context.Context, k addrKey) {
	if f, ok := w.fc.r.flows.get(k); ok && f.confirmed {
		w.put(ctx, k.addrPort(), &f)
	}
}

// put queues client's flow f. A flow without a transceiver id (0) is
// never written: its entry would be stale, and would overwrite a good one.
func (w *cacheWriter) put(ctx context.Context, client netip.AddrPort, f *flowInfo) {
	if f.tr == 0 {
		return
	}
	start := len(w.arena)
	w.arena = appendCachedFlow(w.arena, f)
	w.clients = append(w.clients, client)
	w.values = append(w.values, w.arena[start:len(w.arena):len(w.arena)])
	if len(w.clients) >= writeBatch {
		w.flush(ctx)
	}
}

func (w *cacheWriter) flush(ctx context.Context) {
	fc := w.fc
	n := len(w.clients)
	if n == 0 {
		return
	}
	defer func() {
		clear(w.values)
		w.clients, w.values, w.arena = w.clients[:0], w.values[:0], w.arena[:0]
	}()
	if fc.r.mono(time.Now()) < fc.downUntil.Load() {
		fc.writes[writeSkipped].Add(uint64(n))
		return
	}
	fc.batches.WithLabelValues("put").Observe(float64(n))
	pctx, cancel := context.WithTimeout(ctx, fc.p.putTimeout)
	err := fc.store.Put(pctx, w.clients, w.values, fc.p.ttl)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		fc.writes[writeError].Add(uint64(n))
		fc.failed("put", err)
		return
	}
	fc.writes[writeOK].Add(uint64(n))
	fc.worked()
}

// refresh writes every confirmed flow with traffic at or after since, and
// returns when this pass began (the next one's since).
func (w *cacheWriter) refresh(ctx context.Context, since int64) int64 {
	began := w.fc.r.mono(time.Now())
	w.fc.r.flows.eachConfirmed(since, func(client netip.AddrPort, f *flowInfo) bool {
		w.put(ctx, client, f)
		return ctx.Err() == nil
	})
	w.flush(ctx)
	return began
}
