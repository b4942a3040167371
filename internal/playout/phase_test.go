package playout

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// slotHarness drives one queue on a one-worker clock slot by slot, and
// wakes the worker at moments the test chooses, as a push does.
type slotHarness struct {
	t    *testing.T
	w    *worker
	q    *Queue
	sink *recorder
	slot int64 // the last slot played
}

func newSlotHarness(t *testing.T, tick time.Duration, cfg QueueConfig) *slotHarness {
	c := newClock(1, tick)
	h := &slotHarness{t: t, w: c.workers[0], sink: &recorder{}, slot: 1000 * Slots}
	h.q = c.NewQueue(h.sink, cfg)
	h.w.runSlots(h.slot)
	return h
}

// wake plays what a worker woken at timeline position at plays: the runs
// that start then. at lies within the slot after the last one played.
func (h *slotHarness) wake(at int64) {
	h.sink.at = at
	h.w.runStarts(at)
}

// slots plays the next k slots, each at its time.
func (h *slotHarness) slots(k int) {
	for range k {
		h.slot++
		h.sink.at = h.slot * h.w.c.slotSamples
		h.w.runSlots(h.slot)
	}
}

// mid returns a position within the next slot, off its start.
func (h *slotHarness) mid(off int64) int64 { return (h.slot+1)*h.w.c.slotSamples + off }

func (h *slotHarness) push(data string, dur int) {
	h.t.Helper()
	if err := h.q.PushAudio([]byte(data), dur); err != nil {
		h.t.Fatalf("PushAudio(%s): %v", data, err)
	}
}

// checkPhase checks the packets of one run, pkts, sent from a first
// packet that left at its own time: each later packet left no later than
// its timestamp says (the first packet's send time plus the timestamp
// difference) and at most one slot earlier, seq +1, no marker.
func (h *slotHarness) checkPhase(pkts []sent) {
	h.t.Helper()
	first := pkts[0]
	if !first.marker {
		h.t.Fatalf("a run's first packet %+v has no marker", first)
	}
	for i, p := range pkts[1:] {
		due := first.at + int64(p.ts-first.ts) // when its timestamp says it plays
		if p.at > due || p.at <= due-h.w.c.slotSamples || p.marker || p.seq != first.seq+uint16(i+1) {
			h.t.Fatalf("packet %d %+v of the run from %+v: want it sent in (%d, %d], seq +%d, no marker", i+1, p, first, due-h.w.c.slotSamples, due, i+1)
		}
	}
}

// TestRunStartsAtOnce: a reply queued into an idle queue sends its first
// packet as soon as the worker is woken, in the middle of a slot, with the
// marker bit and EventStarted; the rest of the reply leaves one packet per
// tick on that moment's phase (never later than its timestamp, at most a
// slot earlier), with the 20 ms and the 10 ms tick, whatever the moment.
func TestRunStartsAtOnce(t *testing.T) {
	for _, tick := range []time.Duration{Tick, TickShort} {
		for _, off := range []int64{0, 1, 37, 119} {
			t.Run(fmt.Sprintf("%v/%d", tick, off), func(t *testing.T) {
				h := newSlotHarness(t, tick, QueueConfig{})
				dur := int(h.w.c.samples)
				const n = 20
				for i := range n {
					h.push(fmt.Sprint(i), dur)
				}
				if len(h.sink.pkts) != 0 {
					t.Fatal("a push sent a packet: only the worker sends")
				}
				at := h.mid(off)
				h.wake(at)
				if len(h.sink.pkts) != 1 || h.sink.pkts[0].at != at || h.sink.pkts[0].data != "0" {
					t.Fatalf("woken at %d: sent %+v, want packet 0 at once", at, h.sink.pkts)
				}
				if ev := h.q.Events(nil); !reflect.DeepEqual(ev, []Event{{Type: EventStarted}}) {
					t.Fatalf("events at the start %+v", ev)
				}
				h.slots(Slots * (n + 2))
				if len(h.sink.pkts) != n {
					t.Fatalf("%d packets sent of %d", len(h.sink.pkts), n)
				}
				h.checkPhase(h.sink.pkts)
				for i, p := range h.sink.pkts {
					if p.data != fmt.Sprint(i) || p.ts != h.sink.pkts[0].ts+uint32(i*dur) {
						t.Fatalf("packet %d %+v: want timestamp +%d a packet", i, p, dur)
					}
				}
			})
		}
	}
}

// TestRunKeepsPhaseWithinGrace: audio that comes within the run's grace
// is not a new run: it waits for the run's own slot (its timestamp
// following the time that passed, the marker bit on), and stays on the
// run's phase; after the grace, the next run starts at once on its own.
func TestRunKeepsPhaseWithinGrace(t *testing.T) {
	h := newSlotHarness(t, Tick, QueueConfig{})
	h.push("a0", 960)
	h.push("a1", 960)
	h.wake(h.mid(50))
	h.slots(3 * Slots) // a0, a1, then a tick of nothing
	h.push("b0", 960)
	h.push("b1", 960)
	h.wake(h.mid(10)) // a running queue: nothing starts
	if len(h.sink.pkts) != 2 {
		t.Fatalf("%d packets: audio within the grace started on the wake-up", len(h.sink.pkts))
	}
	h.slots(3 * Slots)
	if len(h.sink.pkts) != 4 {
		t.Fatalf("%d packets, want 4", len(h.sink.pkts))
	}
	a0, b0 := h.sink.pkts[0], h.sink.pkts[2]
	if sl, tk := h.w.c.slotSamples, h.w.c.samples; b0.at%tk != a0.at/sl*sl%tk || !b0.marker || b0.ts != a0.ts+uint32(b0.at-a0.at) {
		t.Fatalf("b0 %+v after a0 %+v: want it on a0's slot, marker, timestamp by the time that passed", b0, a0)
	}
	h.checkPhase(h.sink.pkts[2:])
	if ev := eventTypes(h.q.Events(nil)); !reflect.DeepEqual(ev, []EventType{EventStarted}) {
		t.Fatalf("events %v, want one run", ev)
	}
	// The grace runs out: a new run, at once, on its own phase.
	h.slots(graceTicks*Slots + Slots)
	if ev := eventTypes(h.q.Events(nil)); !reflect.DeepEqual(ev, []EventType{EventStopped}) {
		t.Fatalf("events %v, want the run stopped", ev)
	}
	h.push("c0", 960)
	h.push("c1", 960)
	at := h.mid(203)
	h.wake(at)
	last, c0 := h.sink.pkts[3], h.sink.pkts[4]
	if c0.at != at || !c0.marker || c0.seq != last.seq+1 || c0.ts != last.ts+960+uint32(at-(last.at+960)) {
		t.Fatalf("next run's first packet %+v after %+v: want at %d, marker, seq +1, timestamp by the time since the last audio ended", c0, last, at)
	}
	h.slots(2 * Slots)
	h.checkPhase(h.sink.pkts[4:])
}

// TestClearStopsAtOnce: after Clear no packet of the cleared audio is
// sent, whether the run was playing or its first packet was still to be
// sent; the clear tail keeps the run's phase; the next reply starts at
// once, numbered on.
func TestClearStopsAtOnce(t *testing.T) {
	h := newSlotHarness(t, Tick, QueueConfig{ClearTail: []byte("quiet"), ClearTailTicks: 2})
	for i := range 50 {
		h.push(fmt.Sprint(i), 960)
	}
	h.wake(h.mid(77))
	h.slots(3*Slots + 1) // through the run's slot in its fourth tick
	if played := h.q.Clear(); played != 80 {
		t.Fatalf("Clear = %d ms, want 80", played)
	}
	h.slots(4 * Slots)
	run := h.sink.pkts[:4]
	tail := h.sink.pkts[4:]
	if len(tail) != 2 || tail[0].data != "quiet" || tail[1].data != "quiet" {
		t.Fatalf("after the clear: %+v, want 2 packets of silence and nothing else", tail)
	}
	h.checkPhase(append(run, tail[0]))
	// Cleared before the worker woke: nothing is sent.
	h.slots(Slots)
	n := len(h.sink.pkts)
	h.push("x", 960)
	h.q.Clear()
	h.wake(h.mid(5))
	h.slots(2 * Slots)
	if len(h.sink.pkts) != n {
		t.Fatalf("audio cleared before its first packet left was sent: %+v", h.sink.pkts[n:])
	}
	// The next reply.
	h.q.Events(nil)
	h.push("y", 960)
	at := h.mid(100)
	h.wake(at)
	if y := h.sink.pkts[n]; y.data != "y" || y.at != at || !y.marker || y.seq != h.sink.pkts[n-1].seq+1 {
		t.Fatalf("next reply %+v after %+v", y, h.sink.pkts[n-1])
	}
}

// TestResumeStartsAtOnce: audio queued while paused starts when Resume
// wakes the worker, not at a later tick.
func TestResumeStartsAtOnce(t *testing.T) {
	h := newSlotHarness(t, Tick, QueueConfig{Paused: true})
	h.push("greeting", 960)
	h.wake(h.mid(1))
	h.slots(2 * Slots)
	if len(h.sink.pkts) != 0 {
		t.Fatal("a paused queue sent")
	}
	h.q.Resume()
	at := h.mid(3)
	h.wake(at)
	if len(h.sink.pkts) != 1 || h.sink.pkts[0].at != at {
		t.Fatalf("after Resume: %+v, want the greeting at %d", h.sink.pkts, at)
	}
}

// TestSlotsRandomLateness plays replies and pauses of random lengths on a
// worker that is woken late by random amounts (up to several ticks) and
// pushes at random moments: every packet is sent once, in order, seq +1,
// each timestamp at least the previous packet's duration on, and no
// packet leaves more than a slot before the time its timestamp gives.
func TestSlotsRandomLateness(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	h := newSlotHarness(t, Tick, QueueConfig{})
	pushed := 0
	for range 2000 {
		switch r := rng.IntN(10); {
		case r < 2 && h.q.Queued() == 0:
			// A reply of 1–4 packets into an empty queue: never more
			// than CatchUpTarget plus a tick queued, so no catch-up
			// (which sends ahead on purpose; TestCatchUpAfterStall).
			for range 1 + rng.IntN(4) {
				h.push(fmt.Sprint(pushed), 960)
				pushed++
			}
			h.wake(h.mid(rng.Int64N(h.w.c.slotSamples)))
		case r < 5: // the worker is late
			h.slot += rng.Int64N(3 * Slots)
			h.slots(1)
		default:
			h.slots(1 + rng.IntN(2*Slots))
		}
	}
	h.slots(40 * Slots)
	if c := h.w.c.Stats().CaughtUp; c != 0 {
		t.Fatalf("caught up %d samples: the test's backend must stay under real time", c)
	}
	if len(h.sink.pkts) != pushed {
		t.Fatalf("%d packets sent of %d", len(h.sink.pkts), pushed)
	}
	// Without catch-up, timestamp minus timeline position is the same for
	// every packet; the first packet was sent at its position.
	offset := h.sink.pkts[0].ts - uint32(h.sink.pkts[0].at)
	for i, p := range h.sink.pkts {
		if p.data != fmt.Sprint(i) {
			t.Fatalf("packet %d is %q", i, p.data)
		}
		// A late worker sends after the position (the harness records
		// the time it played the slot at); never more than a slot early.
		if pos := int64(uint32(p.ts - offset)); p.at < pos-h.w.c.slotSamples {
			t.Fatalf("packet %d %+v left more than a slot before its time %d", i, p, pos)
		}
		if i == 0 {
			continue
		}
		prev := h.sink.pkts[i-1]
		if p.seq != prev.seq+1 || int32(p.ts-prev.ts) < 960 {
			t.Fatalf("packet %d %+v after %+v", i, p, prev)
		}
	}
}

// TestSlotOwners: at any number of workers, every worker owns the same
// number of slots and every slot has the same number of owners (with two
// workers, slot number modulo the workers); a run started by its queue's
// worker on a slot it does not own is handed to one of the slot's owners,
// in turn, and plays on there on its phase. With runs started on every
// slot by the queues of every worker, each worker ends up with the same
// number of queues: all the workers share the steady-state sends.
func TestSlotOwners(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 4, 6, 8, 16} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			c := newClock(workers, Tick)
			owned := -1
			for s, o := range c.owners {
				if len(o) == 0 || len(o) != len(c.owners[0]) {
					t.Fatalf("slot %d has %d owners, slot 0 %d", s, len(o), len(c.owners[0]))
				}
			}
			for i, w := range c.workers {
				n := 0
				for s := range int64(Slots) {
					mine := w.owns&(1<<s) != 0
					if mine {
						n++
					}
					if mine != slices.Contains(c.owners[s], w) {
						t.Fatalf("worker %d: owns bit %v for slot %d, owners %v", i, mine, s, c.owners[s])
					}
					// Two workers share each slot when Slots is odd, and
					// take every other slot when it is even.
					if workers == 2 && mine != (Slots%2 == 1 || s%2 == int64(i)) {
						t.Fatalf("two workers: worker %d owns slot %d: %v", i, s, mine)
					}
				}
				if owned == -1 {
					owned = n
				}
				if n == 0 || n != owned {
					t.Fatalf("worker %d owns %d slots, worker 0 %d", i, n, owned)
				}
			}
			// A tick wakes each worker once per slot it owns: Slots in all
			// with up to Slots workers when they divide it, one per worker
			// with a multiple of Slots workers.
			if workers%Slots == 0 && owned != 1 || Slots%workers == 0 && owned*workers != Slots {
				t.Fatalf("%d workers own %d slots each", workers, owned)
			}

			base := int64(1000 * Slots)
			for _, w := range c.workers {
				w.runSlots(base)
			}
			// For each slot, 3 runs from the queues of each worker
			// (NewQueue spreads queues over the workers in turn).
			const perWorker = 3
			var sinks []*recorder
			for s := range int64(Slots) {
				k := base + 1 + s
				for range perWorker * workers {
					sk := &recorder{at: k*c.slotSamples + 7}
					q := c.NewQueue(sk, QueueConfig{})
					for i := range 5 {
						if err := q.PushAudio([]byte(fmt.Sprint(i)), 960); err != nil {
							t.Fatal(err)
						}
					}
					sinks = append(sinks, sk)
				}
				// Started in slot k by their own workers. A run for
				// another worker's slot is handed over only after the
				// round (after the Batcher's Flush, in run): its owner
				// cannot send its second packet before the first left.
				moved := func(w *worker) (n int) { // handed to the others
					for _, o := range c.workers {
						if o == w {
							continue
						}
						o.mu.Lock()
						n += len(o.moved)
						o.mu.Unlock()
					}
					return n
				}
				for _, w := range c.workers {
					before := moved(w)
					w.runStarts(k*c.slotSamples + 7)
					if after := moved(w); after > before {
						t.Fatalf("%d runs handed over during the round", after-before)
					}
					w.handOver()
				}
			}
			for k := base + Slots + 1; k <= base+7*Slots; k++ {
				for _, sk := range sinks {
					sk.at = k * c.slotSamples
				}
				for _, w := range c.workers {
					w.runStarts(k * c.slotSamples)
					w.handOver()
					w.runSlots(k)
				}
			}
			// The runs are in their grace, still on their slots: each
			// owner of a slot holds the same number of its queues, and
			// nobody else any.
			for i, w := range c.workers {
				for s, l := range w.slots {
					want := 0
					if w.owns&(1<<s) != 0 {
						want = perWorker * workers / len(c.owners[s])
					}
					if len(l) != want {
						t.Fatalf("worker %d holds %d queues on slot %d, want %d", i, len(l), s, want)
					}
				}
				if n := w.active(); n != perWorker*Slots {
					t.Fatalf("worker %d holds %d queues, want %d", i, n, perWorker*Slots)
				}
			}
			h := &slotHarness{t: t, w: c.workers[0]}
			for i, sk := range sinks {
				if len(sk.pkts) != 5 {
					t.Fatalf("queue %d sent %d packets", i, len(sk.pkts))
				}
				h.checkPhase(sk.pkts)
			}
		})
	}
}

// TestMarkOffTheGrid: on a run whose phase is off the slot grid, a mark
// between two packets comes back at the turn that sends the packet after
// it, and does not hold that packet back (no gap, no marker); a run that
// runs dry calls OnUnderrun one tick after its last packet's turn, and
// what it pushes leaves in that turn.
func TestMarkOffTheGrid(t *testing.T) {
	var h *slotHarness
	var underruns []int64
	h = newSlotHarness(t, Tick, QueueConfig{OnUnderrun: func() {
		underruns = append(underruns, h.sink.at)
		h.push("tail", 960)
	}})
	h.push("a0", 960)
	h.push("a1", 960)
	if err := h.q.PushMark("m"); err != nil {
		t.Fatal(err)
	}
	h.push("a2", 960)
	h.wake(h.mid(77))  // a0, in the next slot
	h.slots(Slots + 1) // that slot, then a tick: a1
	if ev := eventTypes(h.q.Events(nil)); !reflect.DeepEqual(ev, []EventType{EventStarted}) {
		t.Fatalf("events after a1's turn %v, want the start only", ev)
	}
	h.slots(Slots) // a2
	if ev := h.q.Events(nil); !reflect.DeepEqual(ev, []Event{{Type: EventMark, Name: "m"}}) {
		t.Fatalf("events at a2's turn %+v, want the mark", ev)
	}
	if len(h.sink.pkts) != 3 {
		t.Fatalf("%d packets, want a0 a1 a2", len(h.sink.pkts))
	}
	h.checkPhase(h.sink.pkts)
	h.slots(2 * Slots) // a2's turn + a tick: the underrun
	a2 := h.sink.pkts[2]
	if len(underruns) != 1 || underruns[0] != a2.at+2*960 || len(h.sink.pkts) != 4 {
		t.Fatalf("OnUnderrun at %v, %d packets; want once at %d (a tick after a2's turn), the tail sent then", underruns, len(h.sink.pkts), a2.at+2*960)
	}
	// a0 left at its timeline position: the timestamps' offset.
	a0 := h.sink.pkts[0]
	if tail := h.sink.pkts[3]; tail.at != underruns[0] || !tail.marker || tail.ts-a0.ts != uint32(tail.at-a0.at) {
		t.Fatalf("tail %+v after a2 %+v: want it sent at the underrun's turn, marker, timestamp at that turn's time", tail, a2)
	}
}
