package playout

import (
	"math"
	"math/big"
	"testing"
	"time"
)

// exactSamples is d at 48 kHz, rounded down, in big-integer arithmetic.
func exactSamples(d time.Duration) int64 {
	n := new(big.Int).Mul(big.NewInt(int64(d)), big.NewInt(48000))
	return n.Div(n, big.NewInt(int64(time.Second))).Int64()
}

// TestClockArithmetic: the sample timeline and the wake-up timer's tick
// grid stay in step however long the clock runs. After 1 h, 24 h and 30
// days, the position at any moment is that moment at 48 kHz exactly, and
// a worker woken at tick k's time (start + k×tick) finds itself in tick
// k, not in a later one (a timeline that gained 16 ppm on the timer, as
// with a 20833 ns sample, was 11 ticks ahead after an hour).
func TestClockArithmetic(t *testing.T) {
	for _, tick := range []time.Duration{Tick, TickShort} {
		c := newClock(1, tick)
		if want := exactSamples(tick); c.samples != want || c.period != tick {
			t.Fatalf("tick %v: %d samples, period %v", tick, c.samples, c.period)
		}
		for _, up := range []time.Duration{time.Hour, 24 * time.Hour, 30 * 24 * time.Hour} {
			for _, off := range []time.Duration{0, 1, 20832, 20833, 20834, c.period - 1, c.period, 7*c.period + 12345, time.Second - 1} {
				d := up + off
				if got, want := c.samplesAt(d), exactSamples(d); got != want {
					t.Errorf("tick %v: samplesAt(%v) = %d, want %d", tick, d, got, want)
				}
				if got, want := durSamples(d), exactSamples(d); got != want {
					t.Errorf("durSamples(%v) = %d, want %d", d, got, want)
				}
			}
			k := int64(up / c.period)
			for _, kk := range []int64{k, k + 1, k + 12345} {
				at := time.Duration(kk) * c.period
				if got := c.samplesAt(at) / c.samples; got != kk {
					t.Errorf("tick %v: woken at tick %d's time (%v), the timeline is in tick %d", tick, kk, at, got)
				}
				if got := c.samplesAt(at-1) / c.samples; got != kk-1 {
					t.Errorf("tick %v: 1 ns before tick %d's time, the timeline is in tick %d", tick, kk, got)
				}
			}
		}
		// No overflow at the end of Duration's range.
		if got, want := c.samplesAt(math.MaxInt64), exactSamples(math.MaxInt64); got != want {
			t.Errorf("tick %v: samplesAt(MaxInt64) = %d, want %d", tick, got, want)
		}
	}
	if got, want := durSamples(math.MaxInt64), exactSamples(math.MaxInt64); got != want {
		t.Errorf("durSamples(MaxInt64) = %d, want %d", got, want)
	}
}

// TestQueueDurations: a queue's cap and Queued convert between durations
// and 48 kHz samples exactly: a 30 ms cap takes 20 + 10 ms (not floored
// to whole ticks), and Queued is exact beyond the 53 h at which
// samples × 1e9 overflows.
func TestQueueDurations(t *testing.T) {
	c := newClock(1, Tick)
	q := c.NewQueue(nopSink{}, QueueConfig{MaxQueued: 30 * time.Millisecond, Paused: true})
	if err := q.PushAudio([]byte{1}, 960); err != nil {
		t.Fatal(err)
	}
	if err := q.PushAudio([]byte{2}, 480); err != nil {
		t.Fatalf("10 ms more under a 30 ms cap: %v", err)
	}
	if err := q.PushAudio([]byte{3}, 1); err == nil {
		t.Fatal("a sample past a 30 ms cap was queued")
	}
	if got := q.Queued(); got != 30*time.Millisecond {
		t.Fatalf("Queued() = %v, want 30ms", got)
	}
	for _, d := range []time.Duration{100 * time.Hour, 30*24*time.Hour + 20833*time.Nanosecond} {
		q.mu.Lock()
		q.queued = exactSamples(d)
		q.mu.Unlock()
		// Queued rounds the samples down to the nanosecond.
		n := new(big.Int).Mul(big.NewInt(exactSamples(d)), big.NewInt(int64(time.Second)))
		want := time.Duration(n.Div(n, big.NewInt(48000)).Int64())
		if got := q.Queued(); got != want {
			t.Errorf("Queued() of %d samples = %v, want %v", exactSamples(d), got, want)
		}
	}
}
