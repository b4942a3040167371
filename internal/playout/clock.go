package playout

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the shared media clock: Workers worker goroutines that drain
// the active queues, each queue once per Tick (ClockConfig.Tick), on the
// shared tick grid. Create it with NewClock and Close it when done.
//
// A run's first packet leaves at once (a push into an idle queue wakes
// its worker); its later packets leave at the tick at or before their
// time, so up to a tick early and never late: early packets cost a
// receiver's jitter buffer nothing, late ones raise its delay
// (docs/bridge.md §6.1). Runs share the tick grid rather than each
// keeping its own phase: docs/benchmarks.md (turn-taking, the
// quarter-tick ablation) says what that would cost.
type Clock struct {
	// Set once (start before the workers start).
	start   time.Time
	period  time.Duration // the tick
	samples int64         // the tick at 48 kHz
	workers []*worker
	batcher Batcher // nil: none
	stop    chan struct{}
	wg      sync.WaitGroup

	next      atomic.Uint32 // round-robin worker assignment
	late      atomic.Uint64 // ticks a worker missed because it was still busy
	caughtUp  atomic.Uint64 // audio played ahead of the timeline to shed backlog, 48 kHz samples
	closeOnce sync.Once
}

// ClockStats are a clock's counters.
type ClockStats struct {
	// LateTicks counts the ticks with queues on them that a worker
	// played late, together with a later one, because it was busy or not
	// scheduled in time.
	LateTicks uint64
	// CaughtUp is the audio, in 48 kHz samples, that queues played in a
	// tick beyond its own to shed the backlog of a backend streaming at
	// about real time (docs/bridge.md §6.1).
	CaughtUp uint64
}

// ClockConfig configures NewClock.
type ClockConfig struct {
	// Workers is the number of worker goroutines (0: one per CPU,
	// runtime.GOMAXPROCS).
	Workers int
	// Tick is the packet period, TickShort or Tick (0: Tick): a queue
	// sends what is due once per tick, so packets shorter than the tick
	// would leave in pairs: sessions that send 10 ms packets need the
	// 10 ms tick (the transceiver's ptime setting). Packets of 20 ms on a
	// 10 ms clock leave every other tick.
	// A run's first packet does not wait for a tick (docs/bridge.md §6.1).
	Tick time.Duration
	// Batcher, if set, brackets every round of work of every worker:
	// see Batcher.
	Batcher Batcher
}

// TickShort is the short clock period ClockConfig.Tick takes: one 10 ms
// packet per session per tick.
const TickShort = 10 * time.Millisecond

// ErrTick is returned by NewClock for a Tick it does not take.
var ErrTick = errors.New("playout: clock tick must be 10ms or 20ms")

// NewClock starts a clock configured by cfg. It returns ErrTick for a
// tick other than TickShort or Tick.
func NewClock(cfg ClockConfig) (*Clock, error) {
	tick, err := checkTick(cfg.Tick)
	if err != nil {
		return nil, err
	}
	c := newClock(cfg.Workers, tick)
	c.batcher = cfg.Batcher
	c.startWorkers()
	return c, nil
}

// checkTick returns tick, or Tick for 0, or ErrTick for one the clock
// does not take.
func checkTick(tick time.Duration) (time.Duration, error) {
	switch tick {
	case 0:
		return Tick, nil
	case TickShort, Tick:
		return tick, nil
	}
	return 0, fmt.Errorf("%w, not %v", ErrTick, tick)
}

// Batcher brackets each round of a worker's work (a tick's queues, and
// the first packets of runs that just started), so that the packets its
// Sinks send in it can leave together: Hold before the round's first
// SendPacket, Flush after its last. Workers call them concurrently.
type Batcher interface {
	Hold()
	Flush()
}

func (c *Clock) startWorkers() {
	c.start = time.Now() // tick n starts at start + n×period
	for _, w := range c.workers {
		c.wg.Go(w.run)
	}
}

// newClock builds a clock ticking every tick (TickShort or Tick) without
// starting it: tests drive its workers by hand.
func newClock(workers int, tick time.Duration) *Clock {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	c := &Clock{stop: make(chan struct{}), period: tick, samples: durSamples(tick)}
	for range workers {
		c.workers = append(c.workers, &worker{c: c, wake: make(chan struct{}, 1), buf: make([]byte, 0, 4096)})
	}
	return c
}

// durSamples returns d in 48 kHz samples, rounded down: exact, with no
// overflow for any Duration.
func durSamples(d time.Duration) int64 {
	return int64(d/time.Second)*48000 + int64(d%time.Second)*48000/int64(time.Second)
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

// now returns the time since the clock started, in 48 kHz samples.
func (c *Clock) now() int64 { return c.samplesAt(time.Since(c.start)) }

// samplesAt returns d, a time since the clock's start, in 48 kHz samples
// (rounded down), on the grid the workers' timers use: tick k starts at
// k×period and sample k×samples, so a worker woken at tick k's time
// finds itself in tick k however long the clock has run. Exact (a tick is
// a whole number of nanoseconds and of samples), and without overflow
// for any Duration.
func (c *Clock) samplesAt(d time.Duration) int64 {
	return int64(d/c.period)*c.samples + int64(d%c.period)*c.samples/int64(c.period)
}

// worker drains its share of the queues: each tick, the queues playing on
// it; when woken by a push into an idle queue, that queue's first packet.
type worker struct {
	c    *Clock
	wake chan struct{}

	mu     sync.Mutex
	starts []*Queue // guarded by mu: queues that became active since the worker last looked

	// Owned by the worker goroutine.
	queues []*Queue // the queues playing, one turn each per tick
	spare  []*Queue // swapped with starts
	last   int64    // last tick played
	batch  []Packet // one queue's due packets
	buf    []byte   // their payloads
}

// add hands the worker a queue that became active, and wakes it: its
// first packet leaves now, not at the next tick.
func (w *worker) add(q *Queue) {
	w.mu.Lock()
	w.starts = append(w.starts, q)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default: // already woken
	}
}

// run plays each tick while queues are playing, at its time, and the
// runs that start when woken: a worker with no queue sleeps.
func (w *worker) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		var fire <-chan time.Time
		if len(w.queues) > 0 {
			t.Reset(time.Until(w.c.start.Add(time.Duration(w.last+1) * w.c.period)))
			fire = t.C
		}
		select {
		case <-w.c.stop:
			return
		case <-w.wake:
		case <-fire:
		}
		at := w.c.now()
		n := at / w.c.samples
		if b := w.c.batcher; b != nil {
			b.Hold()
			w.serve(n, at)
			b.Flush()
		} else {
			w.serve(n, at)
		}
	}
}

// serve starts the queues that became active, at timeline position at
// (48 kHz samples since the clock's start, now), then plays tick n.
func (w *worker) serve(n, at int64) {
	w.runStarts(at)
	w.playTick(n)
}

// runStarts plays the queues that became active since the last call: a
// new run's first packet starts at at (or where the queue's timeline
// already is, if later), and the queue has its later turns at the ticks
// after the one that time falls in.
func (w *worker) runStarts(at int64) {
	w.mu.Lock()
	starts := w.starts
	w.starts = w.spare[:0]
	w.mu.Unlock()
	for i, q := range starts {
		starts[i] = nil
		pos := q.position(at)
		n := pos / w.c.samples
		q.next = n + 1
		if q.tick(n*w.c.samples, pos, pos, w) {
			w.queues = append(w.queues, q)
		}
	}
	w.spare = starts[:0]
}

// playTick plays tick n, if it is after the last one played. A queue
// whose turns the worker missed (it was too busy to play them in time)
// sends what was due in them at once, at n, without a timestamp jump.
func (w *worker) playTick(n int64) {
	if n <= w.last {
		return
	}
	w.last = n
	keep := w.queues[:0]
	now := n * w.c.samples
	var missed int64 // the most turns a queue missed
	for _, q := range w.queues {
		if q.next > n {
			keep = append(keep, q) // its run starts after this tick's time
			continue
		}
		missed = max(missed, n-q.next)
		first := q.next * w.c.samples
		q.next = n + 1
		if q.tick(now, first, now, w) {
			keep = append(keep, q)
		}
	}
	if missed > 0 {
		w.c.late.Add(uint64(missed))
	}
	clear(w.queues[len(keep):])
	w.queues = keep
}
