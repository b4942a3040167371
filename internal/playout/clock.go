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
// the active queues. Time is cut into Slots slots per Tick
// (ClockConfig.Tick): every queue is played once per Tick, on its own
// slot, the one its current run started in. Create it with NewClock or
// NewClockConfig and Close it when done.
type Clock struct {
	// Set once (start before the workers start).
	start       time.Time
	period      time.Duration // the tick
	samples     int64         // the tick at 48 kHz
	slot        time.Duration // period / Slots
	slotSamples int64         // slot at 48 kHz
	workers     []*worker
	// owners[s] are the workers that play slot s: the workers i with
	// i ≡ s (mod gcd(len(workers), Slots)). Every worker owns the same
	// number of slots and every slot has the same number of owners, so
	// the steady-state sends spread evenly over all the workers whatever
	// their number (docs/bridge.md §6.1).
	owners  [Slots][]*worker
	batcher Batcher // nil: none
	// tickStarts, set by benchmarks before the start, makes runs start
	// at the first tick after their audio came, as before slots: the
	// baseline of BenchmarkFirstPacket.
	tickStarts bool
	stop       chan struct{}
	wg         sync.WaitGroup

	next      atomic.Uint32        // round-robin worker assignment
	rr        [Slots]atomic.Uint32 // round-robin among each slot's owners
	late      atomic.Uint64        // slots a worker missed because it was still busy
	caughtUp  atomic.Uint64        // audio played ahead of the timeline to shed backlog, 48 kHz samples
	closeOnce sync.Once
}

// Slots is how many slots a Clock cuts each Tick into (Tick/Slots long).
// A queue plays on one slot of each Tick, the one its run started in, so a
// run's later packets leave at most one slot ahead of the time their
// timestamps give, never behind it: with one slot, on the tick grid, up to
// a Tick early (early packets cost a receiver's jitter buffer nothing,
// docs/bridge.md §6.1). A run's first packet leaves at once whatever the
// count. A worker wakes at each of its slots (Clock) that has queues on
// it: with sessions on every slot, up to Slots wake-ups per worker per Tick
// (one with a multiple of Slots workers).
//
// Quarter-tick slots (4) kept later packets within 5 ms of their time, but
// in headless Chromium through the relay at 50 ms RTT the median from
// speech end to the reply heard was 140 ms with 4 slots against 130 with 1
// at ptime 20, and 130 against 150 at ptime 10 (32 replies a row): no gain
// the browser shows, for about 0.35 ms of CPU per 20 ms per clock and a
// third more pacing CPU per session (docs/benchmarks.md). More slots work:
// any count up to 8 (worker.owns) that divides TickShort's 480 samples.
const Slots = 1

// ClockStats are a clock's counters.
type ClockStats struct {
	// LateTicks counts slots (Tick/Slots) with queues on them that a
	// worker played late, together with a later one, because it was busy
	// or not scheduled in time.
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
	// Tick is the packet period, TickShort or Tick (0: Tick): a queue
	// sends what is due once per tick, on its run's slot, so packets
	// shorter than the tick would leave in pairs: sessions that send
	// 10 ms packets need the 10 ms tick (the transceiver's ptime
	// setting). Packets of 20 ms on a 10 ms clock leave every other tick.
	// A run's first packet does not wait for a tick (docs/bridge.md §6.1).
	Tick time.Duration
	// Batcher, if set, brackets every round of work of every worker (see
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

// Batcher brackets each round of a worker's work (a slot's queues, or
// the first packets of runs that just started), so that the packets its
// Sinks send in it can leave together: Hold before the round's first
// SendPacket, Flush after its last. Workers call them concurrently.
type Batcher interface {
	Hold()
	Flush()
}

// NewBatchedClock is NewClock with every round of every worker bracketed
// by b's Hold and Flush (nil: none).
func NewBatchedClock(workers int, b Batcher) *Clock {
	c := newClock(workers, Tick)
	c.batcher = b
	c.startWorkers()
	return c
}

func (c *Clock) startWorkers() {
	c.start = time.Now() // slot n starts at start + n×slot
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
	c := &Clock{stop: make(chan struct{}), period: tick, samples: durSamples(tick), slot: tick / Slots}
	c.slotSamples = c.samples / Slots
	for range workers {
		c.workers = append(c.workers, &worker{c: c, wake: make(chan struct{}, 1), buf: make([]byte, 0, 4096)})
	}
	g := int64(gcd(workers, Slots))
	for i, w := range c.workers {
		for s := range int64(Slots) {
			if int64(i)%g == s%g {
				c.owners[s] = append(c.owners[s], w)
				w.owns |= 1 << s
			}
		}
	}
	return c
}

// durSamples returns d in 48 kHz samples, rounded down: exact, with no
// overflow for any Duration.
func durSamples(d time.Duration) int64 {
	return int64(d/time.Second)*48000 + int64(d%time.Second)*48000/int64(time.Second)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
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
// (rounded down), on the grid the workers' timers use: slot k starts at
// k×slot and sample k×slotSamples, so a worker woken at slot k's time
// finds itself in slot k however long the clock has run. Exact (a slot is
// a whole number of nanoseconds and of samples), and without overflow
// for any Duration.
func (c *Clock) samplesAt(d time.Duration) int64 {
	return int64(d/c.slot)*c.slotSamples + int64(d%c.slot)*c.slotSamples/int64(c.slot)
}

// worker drains its share of the queues: each slot, the queues on it;
// when woken by a push into an idle queue, that queue's first packet.
type worker struct {
	c    *Clock
	wake chan struct{}
	owns uint8 // bit s: the worker owns slot s (set once)

	mu     sync.Mutex
	starts []*Queue // guarded by mu: queues that became active since the worker last looked
	moved  []*Queue // guarded by mu: queues another worker started, for this one's slots

	// Owned by the worker goroutine.
	slots [Slots][]*Queue // the queues playing on each slot
	spare []*Queue        // swapped with starts
	hand  []handOff       // runs started here for another worker's slot, handed over after the round
	last  int64           // last slot processed
	batch []Packet        // one queue's due packets
	buf   []byte          // their payloads
}

// add hands the worker a queue that became active, and wakes it: its
// first packet leaves now, not at the next slot.
func (w *worker) add(q *Queue) {
	w.mu.Lock()
	w.starts = append(w.starts, q)
	w.mu.Unlock()
	w.kick()
}

// kick wakes the worker without blocking.
func (w *worker) kick() {
	select {
	case w.wake <- struct{}{}:
	default: // already woken
	}
}

// run plays each slot that has queues on it, at its time, and the runs
// that start when woken: a worker with no queue sleeps.
func (w *worker) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		var fire <-chan time.Time
		if k := w.nextSlot(); k > 0 {
			t.Reset(time.Until(w.c.start.Add(time.Duration(k) * w.c.slot)))
			fire = t.C
		}
		select {
		case <-w.c.stop:
			return
		case <-w.wake:
		case <-fire:
		}
		at := w.c.now()
		n := at / w.c.slotSamples
		if b := w.c.batcher; b != nil {
			b.Hold()
			w.serve(n, at)
			b.Flush()
		} else {
			w.serve(n, at)
		}
		w.handOver()
	}
}

// handOff is a run started by one worker on a slot it does not own, for
// the owner to play on.
type handOff struct {
	q *Queue
	o *worker
}

// handOver gives the runs started in the round just played to the owners
// of their slots. It runs after the round's Flush: the run's first packet
// has left before its owner can send the second, however late the owner's
// first turn comes against this worker's Flush (a worker stalled for more
// than a tick between the two would otherwise let the second packet
// overtake the first held in its Batcher).
func (w *worker) handOver() {
	for i, h := range w.hand {
		h.o.mu.Lock()
		h.o.moved = append(h.o.moved, h.q)
		h.o.mu.Unlock()
		h.o.kick()
		w.hand[i] = handOff{}
	}
	w.hand = w.hand[:0]
}

// owner returns the worker that is to play a run started by w on slot s:
// w itself if it owns s (no hand-off), otherwise one of the slot's owners
// in turn. Runs start on every slot alike and queues are spread over the
// workers in turn, so each worker ends up with the same share.
func (w *worker) owner(s int64) *worker {
	if w.owns&(1<<s) != 0 {
		return w
	}
	o := w.c.owners[s]
	return o[int(w.c.rr[s].Add(1)-1)%len(o)]
}

// serve starts the queues that became active, at timeline position at
// (48 kHz samples since the clock's start, now), then plays the slots up
// to slot n.
func (w *worker) serve(n, at int64) {
	if w.c.tickStarts {
		if n/Slots <= w.last/Slots {
			w.runSlots(n)
			return
		}
		at = n / Slots * w.c.samples
	}
	w.runStarts(at)
	w.runSlots(n)
}

// runStarts plays the queues that became active since the last call: a
// new run's first packet starts at at (or where the queue's timeline
// already is, if later), and the queue joins the slot that time falls in.
//
// A slot belongs to some of the workers (Clock.owners): a queue started
// here on a slot this worker does not own is handed to one of the slot's
// owners (after the round, by handOver), so that a slot wakes only its
// owners, not every worker.
func (w *worker) runStarts(at int64) {
	w.mu.Lock()
	starts, moved := w.starts, w.moved
	w.starts, w.moved = w.spare[:0], nil
	w.mu.Unlock()
	for i, q := range moved {
		moved[i] = nil
		s := q.next % Slots
		w.slots[s] = append(w.slots[s], q)
	}
	for i, q := range starts {
		starts[i] = nil
		pos := q.position(at)
		n := pos / w.c.slotSamples
		q.next = n + Slots
		if !q.tick(n*w.c.slotSamples, pos, pos, w) {
			continue
		}
		s := n % Slots
		if o := w.owner(s); o != w {
			w.hand = append(w.hand, handOff{q, o})
			continue
		}
		w.slots[s] = append(w.slots[s], q)
	}
	w.mu.Lock()
	if w.moved == nil {
		w.moved = moved[:0] // keep the buffer
	}
	w.mu.Unlock()
	w.spare = starts[:0]
}

// nextSlot returns the next slot after the last one played that has
// queues on it, or is a tick's first slot for tickStarts (0: none).
func (w *worker) nextSlot() int64 {
	for k := w.last + 1; k <= w.last+Slots; k++ {
		if len(w.slots[k%Slots]) > 0 || (w.c.tickStarts && k%Slots == 0) {
			return k
		}
	}
	return 0
}

// active returns how many queues are on the worker's slots.
func (w *worker) active() int {
	n := 0
	for _, l := range w.slots {
		n += len(l)
	}
	return n
}

// runSlots plays the slots after the last one played up to slot n. When
// the worker was too busy to play them in time, each slot is played once,
// at its latest time, and its queues send what was due in the missed
// ones at once, without a timestamp jump.
func (w *worker) runSlots(n int64) {
	if n <= w.last {
		return
	}
	for k := max(w.last+1, n-Slots+1); k <= n; k++ {
		w.runSlot(k, n)
	}
	w.last = n
}

// runSlot plays slot k's queues; n is the latest slot: a slot before it
// is played late.
func (w *worker) runSlot(k, n int64) {
	list := w.slots[k%Slots]
	keep := list[:0]
	now := k * w.c.slotSamples
	var missed int64 // whole ticks of this slot the worker missed
	played := false
	for _, q := range list {
		if q.next > k {
			keep = append(keep, q) // started after this slot's time
			continue
		}
		missed = max(missed, (k-q.next)/Slots)
		played = true
		first := q.next * w.c.slotSamples
		q.next = k + Slots
		if q.tick(now, first, now, w) {
			keep = append(keep, q)
		}
	}
	if played && k < n {
		missed++
	}
	if missed > 0 {
		w.c.late.Add(uint64(missed))
	}
	clear(list[len(keep):])
	w.slots[k%Slots] = keep
}
