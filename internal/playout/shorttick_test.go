package playout

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// TestShortTickPacesTenMs: on a 10 ms clock a burst of 10 ms packets
// leaves one packet per tick, numbered and timestamped on (+1, +480), the
// run's first packet at the first tick after the push, and the run stops
// RunGrace after its audio ended.
func TestShortTickPacesTenMs(t *testing.T) {
	h := newHarnessTick(t, TickShort, QueueConfig{})
	const n = 50 // 500 ms
	for i := range n {
		h.push(fmt.Sprint(i), 480)
	}
	start := h.n
	h.run(n)
	if len(h.rec.pkts) != n {
		t.Fatalf("%d packets in %d ticks, want one per tick", len(h.rec.pkts), n)
	}
	for i, p := range h.rec.pkts {
		if p.data != fmt.Sprint(i) || p.at != start+int64(i) || p.marker != (i == 0) {
			t.Fatalf("packet %d: %+v, want %d in tick %d, marker only on the first", i, p, i, start+int64(i))
		}
		if i > 0 {
			prev := h.rec.pkts[i-1]
			if p.seq != prev.seq+1 || p.ts != prev.ts+480 {
				t.Fatalf("packet %d %+v after %+v: want seq +1, timestamp +480", i, p, prev)
			}
		}
	}
	h.run(int(DefaultRunGrace / TickShort)) // the last packet's audio ends: the grace
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventStarted}}) {
		t.Fatalf("within the grace: events %+v, want the start only", ev)
	}
	h.run(1)
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventStopped, PlayedMs: 500}}) {
		t.Fatalf("after the grace: events %+v, want stopped after 500 ms", ev)
	}
}

// TestShortTickTwentyMsPackets: 20 ms packets on a 10 ms clock (an Opus
// backend's own packets) leave every other tick, at their real-time pace.
func TestShortTickTwentyMsPackets(t *testing.T) {
	h := newHarnessTick(t, TickShort, QueueConfig{})
	for i := range 10 {
		h.push(fmt.Sprint(i), 960)
	}
	h.run(20)
	if len(h.rec.pkts) != 10 {
		t.Fatalf("%d packets in 20 ticks of 10 ms, want 10", len(h.rec.pkts))
	}
	for i, p := range h.rec.pkts[1:] {
		prev := h.rec.pkts[i]
		if p.at != prev.at+2 || p.ts != prev.ts+960 || p.seq != prev.seq+1 {
			t.Fatalf("packet %d %+v after %+v: want every other tick, timestamp +960", i+1, p, prev)
		}
	}
}

// TestShortTickClearTail: the clear tail's 20 ms silence packets follow
// each other every 20 ms on a 10 ms clock too, right after the cut audio.
func TestShortTickClearTail(t *testing.T) {
	h := newHarnessTick(t, TickShort, QueueConfig{ClearTail: []byte("quiet"), ClearTailTicks: 3})
	for i := range 100 {
		h.push(fmt.Sprint(i), 480)
	}
	h.run(10)
	if played := h.q.Clear(); played != 100 {
		t.Fatalf("Clear = %d ms, want 100", played)
	}
	h.run(10)
	tail := h.rec.pkts[10:]
	if len(tail) != 3 {
		t.Fatalf("%d packets after the clear, want 3 of silence", len(tail))
	}
	for i, p := range tail {
		prev := h.rec.pkts[9+i]
		step, ticks := uint32(960), int64(2)
		if i == 0 {
			step, ticks = 480, 1 // after the reply's last 10 ms packet
		}
		if p.data != "quiet" || p.seq != prev.seq+1 || p.ts != prev.ts+step || p.at != prev.at+ticks {
			t.Fatalf("tail packet %d %+v after %+v: want silence every 20 ms on the reply's timeline", i, p, prev)
		}
	}
}

// TestShortTickLateWorker: a worker that missed ticks of a 10 ms clock
// sends what was due in them at once, without a timestamp jump.
func TestShortTickLateWorker(t *testing.T) {
	h := newHarnessTick(t, TickShort, QueueConfig{})
	for i := range 10 {
		h.push(fmt.Sprint(i), 480)
	}
	h.run(2)
	h.n += 3 // three ticks missed
	h.run(1)
	if len(h.rec.pkts) != 6 {
		t.Fatalf("%d packets, want 2, then the 4 due by the late tick's end", len(h.rec.pkts))
	}
	for i, p := range h.rec.pkts[1:] {
		if prev := h.rec.pkts[i]; p.ts != prev.ts+480 || p.marker {
			t.Fatalf("packet %d %+v after %+v: want timestamps on, no marker", i+1, p, prev)
		}
	}
}

func TestNewClockTick(t *testing.T) {
	for _, tc := range []struct {
		tick, want time.Duration
		err        error
	}{
		{0, Tick, nil},
		{TickShort, TickShort, nil},
		{Tick, Tick, nil},
		{15 * time.Millisecond, 0, ErrTick},
		{40 * time.Millisecond, 0, ErrTick},
	} {
		t.Run(tc.tick.String(), func(t *testing.T) {
			c, err := NewClock(ClockConfig{Workers: 1, Tick: tc.tick})
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if c == nil {
				return
			}
			defer c.Close()
			if c.Tick() != tc.want {
				t.Errorf("Tick() = %v, want %v", c.Tick(), tc.want)
			}
		})
	}
}
