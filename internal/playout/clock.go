package playout

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the shared media clock: one ticking goroutine and Workers
// worker goroutines that drain the active queues every tick (Tick, or
// ClockConfig.Tick). Create it with NewClock or NewClockConfig and Close
// it when done.
type Clock struct {
	// Set once (start by run, before the first tick).
	start   time.Time
	period  time.Duration // the tick
	samples int64         // the tick at 48 kHz
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
// CPU, runtime.GOMAXPROCS) and the default tick, Tick.
func NewClock(workers int) *Clock { return NewBatchedClock(workers, nil) }

// ClockConfig configures NewClockConfig.
type ClockConfig struct {
	// Workers is the number of worker goroutines (0: one per CPU,
	// runtime.GOMAXPROCS).
	Workers int
	// Tick is the clock period, TickShort or Tick (0: Tick). A queue
	// sends what is due once per tick, so a run starts, on average, half a
	// tick after its first audio is queued, and packets shorter than the
	// tick would leave in pairs: sessions that send 10 ms packets need the
	// 10 ms tick (the transceiver's ptime setting). Packets of 20 ms on a
	// 10 ms clock leave every other tick.
	Tick time.Duration
	// Batcher, if set, brackets every tick of every worker (see
	// NewBatchedClock).
	Batcher Batcher
}

// TickShort is the short clock period ClockConfig.Tick takes: one 10 ms
// packet per session per tick.
const TickShort = 10 * time.Millisecond

// ErrTick is returned by NewClockConfig for a Tick it does not take.
var ErrTick = errors.New("playout: clock tick must be 10ms or 20ms")

// NewClockConfig starts a clock configured by cfg. It returns ErrTick for
// a tick other than TickShort or Tick.
func NewClockConfig(cfg ClockConfig) (*Clock, error) {
	switch cfg.Tick {
	case 0:
		cfg.Tick = Tick
	case TickShort, Tick:
	default:
		return nil, fmt.Errorf("%w, not %v", ErrTick, cfg.Tick)
	}
	c := newClock(cfg.Workers, cfg.Tick)
	c.batcher = cfg.Batcher
	c.startWorkers()
	return c, nil
}

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
	c := newClock(workers, Tick)
	c.batcher = b
	c.startWorkers()
	return c
}

func (c *Clock) startWorkers() {
	for _, w := range c.workers {
		c.wg.Go(w.run)
	}
	c.wg.Go(c.run)
}

// newClock builds a clock ticking every tick (TickShort or Tick) without
// starting it: tests drive its workers' runTick by hand.
func newClock(workers int, tick time.Duration) *Clock {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	c := &Clock{stop: make(chan struct{}), period: tick, samples: int64(tick / (time.Second / 48000))}
	for range workers {
		c.workers = append(c.workers, &worker{c: c, wake: make(chan struct{}, 1), buf: make([]byte, 0, 4096)})
	}
	return c
}

// Tick returns the clock's period.
func (c *Clock) Tick() time.Duration { return c.period }

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
	c.start = time.Now() // tick n fires at about start + n×period
	t := time.NewTicker(c.period)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.tick.Store(int64(now.Sub(c.start) / c.period))
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
