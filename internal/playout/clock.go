package playout

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the shared media clock: one ticking goroutine and Workers
// worker goroutines that drain the active queues every Tick. Create it
// with NewClock and Close it when done.
type Clock struct {
	// Set once (start by run, before the first tick).
	start   time.Time
	workers []*worker
	batcher Batcher // nil: none
	stop    chan struct{}
	wg      sync.WaitGroup

	next      atomic.Uint32 // round-robin worker assignment
	tick      atomic.Int64  // latest tick number
	late      atomic.Uint64 // ticks a worker missed because it was still busy
	caughtUp  atomic.Uint64 // audio played ahead of the timeline to shed backlog, 48 kHz samples
	closeOnce sync.Once
}

// ClockStats are a clock's counters.
type ClockStats struct {
	// LateTicks counts ticks a worker played late, together with a later
	// one, because it was busy or not scheduled in time.
	LateTicks uint64
	// CaughtUp is the audio, in 48 kHz samples, that queues played in a
	// tick beyond its own to shed the backlog of a backend streaming at
	// about real time (docs/bridge.md §6.1).
	CaughtUp uint64
}

// NewClock starts a clock with the given number of workers (0: one per
// CPU, runtime.GOMAXPROCS).
func NewClock(workers int) *Clock { return NewBatchedClock(workers, nil) }

// Batcher brackets each worker's tick, so that the packets its Sinks send
// in the tick can leave together: Hold before the tick's first SendPacket,
// Flush after its last. Workers call them concurrently.
type Batcher interface {
	Hold()
	Flush()
}

// NewBatchedClock is NewClock with every tick of every worker bracketed
// by b's Hold and Flush (nil: none).
func NewBatchedClock(workers int, b Batcher) *Clock {
	c := newClock(workers)
	c.batcher = b
	for _, w := range c.workers {
		c.wg.Go(w.run)
	}
	c.wg.Go(c.run)
	return c
}

// newClock builds a clock without starting it: tests drive its workers'
// runTick by hand.
func newClock(workers int) *Clock {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	c := &Clock{stop: make(chan struct{})}
	for range workers {
		c.workers = append(c.workers, &worker{c: c, wake: make(chan struct{}, 1), buf: make([]byte, 0, 4096)})
	}
	return c
}

// Stats returns the clock's counters.
func (c *Clock) Stats() ClockStats {
	return ClockStats{LateTicks: c.late.Load(), CaughtUp: c.caughtUp.Load()}
}

// Close stops the clock and waits for its goroutines. Queues stop playing;
// their methods keep working. Idempotent.
func (c *Clock) Close() {
	c.closeOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
}

func (c *Clock) run() {
	c.start = time.Now() // tick n fires at about start + n×Tick
	t := time.NewTicker(Tick)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.tick.Store(int64(now.Sub(c.start) / Tick))
			for _, w := range c.workers {
				select {
				case w.wake <- struct{}{}:
				default: // still busy with an earlier tick
				}
			}
		}
	}
}

// worker drains its share of the queues each tick.
type worker struct {
	c    *Clock
	wake chan struct{}

	mu      sync.Mutex
	pending []*Queue // guarded by mu: queues that became active since the last tick

	// Owned by the worker goroutine.
	active []*Queue
	last   int64    // last tick processed
	batch  []Packet // one queue's due packets
	buf    []byte   // their payloads
}

func (w *worker) add(q *Queue) {
	w.mu.Lock()
	w.pending = append(w.pending, q)
	w.mu.Unlock()
}

func (w *worker) run() {
	for {
		select {
		case <-w.c.stop:
			return
		case <-w.wake:
		}
		if b := w.c.batcher; b != nil {
			b.Hold()
			w.runTick(w.c.tick.Load())
			b.Flush()
			continue
		}
		w.runTick(w.c.tick.Load())
	}
}

// runTick plays tick n for every active queue. When the worker was too
// busy to play the ticks since the last one, it plays them now: the
// packets due in them leave at once, without a timestamp jump.
func (w *worker) runTick(n int64) {
	if n <= w.last {
		return
	}
	from := n
	if w.last != 0 {
		from = w.last + 1
		if from < n {
			w.c.late.Add(uint64(n - from))
		}
	}
	w.last = n
	w.mu.Lock()
	w.active = append(w.active, w.pending...)
	clear(w.pending)
	w.pending = w.pending[:0]
	w.mu.Unlock()
	keep := w.active[:0]
	for _, q := range w.active {
		if q.tick(n, from, w) {
			keep = append(keep, q)
		}
	}
	clear(w.active[len(keep):])
	w.active = keep
}
