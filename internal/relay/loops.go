package relay

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// worker is one pair of sockets bound with SO_REUSEPORT, with a read loop on
// each. The public loop reads clients' datagrams and writes to transceivers
// through internal; the internal loop reads transceivers' datagrams and
// writes to clients through public. So each socket has one reader
// goroutine and one writer goroutine, except worker 0's internal socket,
// which the flow cache's resolver also writes to (the datagrams it held,
// flowcache.go); concurrent sends on a UDP socket are safe.
type worker struct {
	// Set once by New, never mutated.
	id               int
	public, internal *net.UDPConn
	// The loops' receive batches, over their slots, and send batches.
	pubIn, pubOut, intIn, intOut *udpio.Batch
	pubSlots, intSlots           [][]byte

	c counters
	// sockDrops are the kernel drops of public and internal at the last
	// Stats (udpio.Drops), kept for when the sockets are closed.
	sockDrops [2]atomic.Uint64
}

// newWorker makes worker id over its two sockets, with the batches of its
// loops, so that a socket a batch cannot use fails New.
func newWorker(id int, public, internal *net.UDPConn, batch int) (*worker, error) {
	w := &worker{id: id, public: public, internal: internal}
	w.pubSlots, w.intSlots = newSlots(batch), newSlots(batch)
	reads := make([][]byte, batch)
	for i, s := range w.pubSlots {
		reads[i] = s[hop.MaxHeaderLen:] // headroom for the hop header
	}
	var err error
	if w.pubIn, err = udpio.NewBatch(public, batch, reads); err != nil {
		return nil, fmt.Errorf("relay: public socket %d: %w", id, err)
	}
	if w.pubOut, err = udpio.NewBatch(internal, batch, nil); err != nil {
		return nil, fmt.Errorf("relay: internal socket %d: %w", id, err)
	}
	if w.intIn, err = udpio.NewBatch(internal, batch, w.intSlots); err != nil {
		return nil, fmt.Errorf("relay: internal socket %d: %w", id, err)
	}
	if w.intOut, err = udpio.NewBatch(public, batch, nil); err != nil {
		return nil, fmt.Errorf("relay: public socket %d: %w", id, err)
	}
	return w, nil
}

// newSlots returns n message buffers of batchSlot bytes cut from one slab.
func newSlots(n int) [][]byte {
	slab := make([]byte, n*batchSlot)
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = slab[i*batchSlot : (i+1)*batchSlot : (i+1)*batchSlot]
	}
	return bufs
}

// Read errors. A read that fails for another reason than a closed socket
// is counted (DropReadError) and the loop waits before the next one: 1 ms
// after the first error of a run, doubling up to maxReadBackoff, so a
// persistent error costs a few system calls a second, not a spinning
// core. A run of errors that lasts defaultReadErrorLimit with no read in
// between stops the loop and makes the relay not ready (Relay.Ready), as
// a socket that cannot be read is lost to the clients the kernel hashes
// to it.
const (
	firstReadBackoff      = time.Millisecond
	maxReadBackoff        = time.Second
	defaultReadErrorLimit = 5 * time.Second
)

// readBackoff is one loop's state of its current run of read errors.
type readBackoff struct {
	first time.Time     // when the run began; zero when there is none
	wait  time.Duration // the last wait
}

// failed records a read error at now and returns how long to wait before
// the next read, or giveUp once the run has lasted limit.
func (b *readBackoff) failed(now time.Time, limit time.Duration) (wait time.Duration, giveUp bool) {
	if b.first.IsZero() {
		b.first, b.wait = now, firstReadBackoff
	} else {
		b.wait = min(2*b.wait, maxReadBackoff)
	}
	if now.Sub(b.first) >= limit {
		return 0, true
	}
	return b.wait, false
}

// ok ends a run of errors: a read worked.
func (b *readBackoff) ok() { b.first = time.Time{} }

// readFailed handles read error err of worker w's loop on socket: it counts
// it and waits, and reports whether the loop must stop (the relay is
// closing, or the error persisted; then the relay is not ready).
func (r *Relay) readFailed(w *worker, socket string, b *readBackoff, err error) (stop bool) {
	if udpio.IsClosed(err) {
		return true
	}
	w.c.drops[DropReadError].Add(1)
	wait, giveUp := b.failed(time.Now(), r.tune.readErrorLimit)
	if giveUp {
		err = fmt.Errorf("relay: worker %d's %s read loop stopped: reads failed for %v: %w", w.id, socket, r.tune.readErrorLimit, err)
		if r.failed.CompareAndSwap(nil, &err) {
			r.log.Error("relay: a read loop stopped after persistent errors; the relay is not ready", "err", err)
		}
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-r.done:
		return true
	case <-t.C:
		return false
	}
}

// publicBatchLoop reads up to Config.Batch client datagrams per recvmmsg,
// each into its own slot after hop.MaxHeaderLen bytes of headroom, decides
// each one, and sends the forwards to transceivers with one sendmmsg.
// Counters are updated once per batch.
func (r *Relay) publicBatchLoop(w *worker) {
	defer r.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r.forwardBatches(w, "public", w.pubIn, w.pubOut, w.pubSlots, hop.MaxHeaderLen, toTransceiver, r.handlePublic)
}

// internalBatchLoop is publicBatchLoop for the internal socket.
func (r *Relay) internalBatchLoop(w *worker) {
	defer r.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r.forwardBatches(w, "internal", w.intIn, w.intOut, w.intSlots, 0, toClient, r.handleInternal)
}

// forwardBatches is the body of both batched loops: datagram i of a read
// sits at slots[i][headroom:]; handle decides it given the whole slot up to
// the datagram's end.
func (r *Relay) forwardBatches(w *worker, socket string, in, out *udpio.Batch, slots [][]byte, headroom int, dir direction,
	handle func(from netip.AddrPort, buf []byte, now time.Time) (netip.AddrPort, []byte, DropReason)) {
	var backoff readBackoff
	for {
		n, err := in.Read()
		if err != nil {
			if r.readFailed(w, socket, &backoff, err) {
				return
			}
			continue
		}
		backoff.ok()
		now := time.Now()
		for i := range n {
			if in.Truncated(i) {
				w.c.drops[DropTooBig].Add(1)
				continue
			}
			to, pkt, drop := handle(in.Addr(i), slots[i][:headroom+in.Len(i)], now)
			if drop != dropNone {
				w.c.drops[drop].Add(1)
				continue
			}
			if pkt == nil {
				continue // held for the flow cache, or taken by a TCP connection
			}
			counted := len(pkt)
			if dir == toTransceiver {
				counted = in.Len(i) // the payload, not the hop header
			}
			if !out.Queue(pkt, to, counted) {
				w.c.drops[DropWriteError].Add(1)
			}
		}
		if out.Queued() == 0 {
			continue
		}
		sent, bytes, failed, err := out.Flush()
		if failed > 0 {
			w.c.drops[DropWriteError].Add(uint64(failed))
		}
		w.c.packets[dir].Add(uint64(sent))
		w.c.bytes[dir].Add(uint64(bytes))
		if err != nil && udpio.IsClosed(err) {
			return
		}
	}
}
