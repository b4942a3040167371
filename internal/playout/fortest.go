package playout

import "time"

// NewManualClock returns a clock whose ticks are played only by RunTick:
// no goroutine, no timer. For tests and benchmarks that need a
// deterministic timeline. workers 0 means one per CPU; tick is TickShort
// or Tick (0: Tick), else ErrTick.
func NewManualClock(workers int, tick time.Duration) (*Clock, error) {
	tick, err := checkTick(tick)
	if err != nil {
		return nil, err
	}
	return newClock(workers, tick), nil
}

// RunTick plays tick n (n ticks after the clock's start) on every worker
// of a manual clock, in the caller's goroutine: the runs that start at
// its beginning (queues that became active since the last call), then
// the tick's turns. Do not call it on a clock made by NewClock.
func (c *Clock) RunTick(n int64) {
	for _, w := range c.workers {
		w.runTick(n)
	}
}

// runTick plays tick n: the runs that start at its beginning, then its
// turns.
func (w *worker) runTick(n int64) {
	w.runStarts(n * w.c.samples)
	w.playTick(n)
}
