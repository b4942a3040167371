package playout

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// phaseHarness drives one queue on a one-worker clock tick by tick, and
// wakes the worker at moments the test chooses, as a push does.
type phaseHarness struct {
	t    *testing.T
	w    *worker
	q    *Queue
	sink *recorder
	n    int64 // the last tick played
}

func newPhaseHarness(t *testing.T, tick time.Duration, cfg QueueConfig) *phaseHarness {
	c := newClock(1, tick)
	h := &phaseHarness{t: t, w: c.workers[0], sink: &recorder{}, n: 1000}
	h.q = c.NewQueue(h.sink, cfg)
	h.w.playTick(h.n)
	return h
}

// wake plays what a worker woken at timeline position at plays: the runs
// that start then. at lies within the tick after the last one played.
func (h *phaseHarness) wake(at int64) {
	h.sink.at = at
	h.w.runStarts(at)
}

// ticks plays the next k ticks, each at its time.
func (h *phaseHarness) ticks(k int) {
	for range k {
		h.n++
		h.sink.at = h.n * h.w.c.samples
		h.w.playTick(h.n)
	}
}

// mid returns a position within the next tick, off its start.
func (h *phaseHarness) mid(off int64) int64 { return (h.n+1)*h.w.c.samples + off }

func (h *phaseHarness) push(data string, dur int) {
	h.t.Helper()
	if err := h.q.PushAudio([]byte(data), dur); err != nil {
		h.t.Fatalf("PushAudio(%s): %v", data, err)
	}
}

// checkPhase checks the packets of one run, pkts, sent from a first
// packet that left at its own time: each later packet left no later than
// its timestamp says (the first packet's send time plus the timestamp
// difference) and at most one tick earlier, seq +1, no marker.
func (h *phaseHarness) checkPhase(pkts []sent) {
	h.t.Helper()
	first := pkts[0]
	if !first.marker {
		h.t.Fatalf("a run's first packet %+v has no marker", first)
	}
	for i, p := range pkts[1:] {
		due := first.at + int64(p.ts-first.ts) // when its timestamp says it plays
		if p.at > due || p.at <= due-h.w.c.samples || p.marker || p.seq != first.seq+uint16(i+1) {
			h.t.Fatalf("packet %d %+v of the run from %+v: want it sent in (%d, %d], seq +%d, no marker", i+1, p, first, due-h.w.c.samples, due, i+1)
		}
	}
}

// TestRunStartsAtOnce: a reply queued into an idle queue sends its first
// packet as soon as the worker is woken, in the middle of a tick, with the
// marker bit and EventStarted; the rest of the reply leaves one packet per
// tick on that moment's phase (never later than its timestamp, at most a
// tick earlier), with the 20 ms and the 10 ms tick, whatever the moment.
func TestRunStartsAtOnce(t *testing.T) {
	for _, tick := range []time.Duration{Tick, TickShort} {
		for _, off := range []int64{0, 1, 37, 119} {
			t.Run(fmt.Sprintf("%v/%d", tick, off), func(t *testing.T) {
				h := newPhaseHarness(t, tick, QueueConfig{})
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
				h.ticks(n + 2)
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
// is not a new run: it waits for the run's next turn, on the tick grid;
// when it comes within JitterAllowance of its time (a backend streaming in
// real time, at the phase the run's first packet set), its timestamps
// go on from the run's, no marker; later, they follow the time that
// passed, marker bit set, on the tick grid from there. After the grace,
// the next run starts at once on its own phase.
func TestRunKeepsPhaseWithinGrace(t *testing.T) {
	h := newPhaseHarness(t, Tick, QueueConfig{})
	h.push("a0", 960)
	h.push("a1", 960)
	h.wake(h.mid(50))
	h.ticks(3) // a0, a1, then a tick of nothing: b0's time was in it
	h.push("b0", 960)
	h.push("b1", 960)
	h.wake(h.mid(10)) // a running queue: nothing starts
	if len(h.sink.pkts) != 2 {
		t.Fatalf("%d packets: audio within the grace started on the wake-up", len(h.sink.pkts))
	}
	h.ticks(1)
	if len(h.sink.pkts) != 4 {
		t.Fatalf("%d packets, want 4: b0 late, b1 due", len(h.sink.pkts))
	}
	a1, b0, b1 := h.sink.pkts[1], h.sink.pkts[2], h.sink.pkts[3]
	if b0.at%h.w.c.samples != 0 || b0.marker || b0.ts != a1.ts+960 || b1.at != b0.at || b1.marker || b1.ts != b0.ts+960 {
		t.Fatalf("b0 %+v, b1 %+v after a1 %+v: want them at the next turn, no marker, timestamps on from a1's", b0, b1, a1)
	}
	h.ticks(3) // b1's audio ends in the first; then two turns without audio
	h.push("c0", 960)
	h.push("c1", 960)
	h.ticks(3)
	if len(h.sink.pkts) != 6 {
		t.Fatalf("%d packets, want 6", len(h.sink.pkts))
	}
	c0 := h.sink.pkts[4]
	if c0.at%h.w.c.samples != 0 || !c0.marker || c0.ts != b1.ts+960+uint32(c0.at-(b1.at+960+50)) {
		t.Fatalf("c0 %+v after b1 %+v: want it on the tick grid, marker, timestamp by the time that passed", c0, b1)
	}
	h.checkPhase(h.sink.pkts[4:])
	if ev := eventTypes(h.q.Events(nil)); !reflect.DeepEqual(ev, []EventType{EventStarted}) {
		t.Fatalf("events %v, want one run", ev)
	}
	// The grace runs out: a new run, at once, on its own phase.
	h.ticks(graceTicks + 1)
	if ev := eventTypes(h.q.Events(nil)); !reflect.DeepEqual(ev, []EventType{EventStopped}) {
		t.Fatalf("events %v, want the run stopped", ev)
	}
	h.push("d0", 960)
	h.push("d1", 960)
	at := h.mid(203)
	h.wake(at)
	last, d0 := h.sink.pkts[5], h.sink.pkts[6]
	if d0.at != at || !d0.marker || d0.seq != last.seq+1 || d0.ts != last.ts+960+uint32(at-(last.at+960)) {
		t.Fatalf("next run's first packet %+v after %+v: want at %d, marker, seq +1, timestamp by the time since the last audio ended", d0, last, at)
	}
	h.ticks(2)
	h.checkPhase(h.sink.pkts[6:])
}

// TestClearStopsAtOnce: after Clear no packet of the cleared audio is
// sent, whether the run was playing or its first packet was still to be
// sent; the clear tail keeps the run's phase; the next reply starts at
// once, numbered on.
func TestClearStopsAtOnce(t *testing.T) {
	h := newPhaseHarness(t, Tick, QueueConfig{ClearTail: []byte("quiet"), ClearTailTicks: 2})
	for i := range 50 {
		h.push(fmt.Sprint(i), 960)
	}
	h.wake(h.mid(77))
	h.ticks(4) // through the run's fourth turn
	if played := h.q.Clear(); played != 80 {
		t.Fatalf("Clear = %d ms, want 80", played)
	}
	h.ticks(4)
	run := h.sink.pkts[:4]
	tail := h.sink.pkts[4:]
	if len(tail) != 2 || tail[0].data != "quiet" || tail[1].data != "quiet" {
		t.Fatalf("after the clear: %+v, want 2 packets of silence and nothing else", tail)
	}
	h.checkPhase(append(run, tail[0]))
	// Cleared before the worker woke: nothing is sent.
	h.ticks(1)
	n := len(h.sink.pkts)
	h.push("x", 960)
	h.q.Clear()
	h.wake(h.mid(5))
	h.ticks(2)
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
	h := newPhaseHarness(t, Tick, QueueConfig{Paused: true})
	h.push("greeting", 960)
	h.wake(h.mid(1))
	h.ticks(2)
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

// TestRandomLateness plays replies and pauses of random lengths on a
// worker that is woken late by random amounts (up to several ticks) and
// pushes at random moments: every packet is sent once, in order, seq +1,
// each timestamp at least the previous packet's duration on, and no
// packet leaves more than a tick before the time its timestamp gives.
func TestRandomLateness(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	h := newPhaseHarness(t, Tick, QueueConfig{})
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
			h.wake(h.mid(rng.Int64N(h.w.c.samples)))
		case r < 5: // the worker is late
			h.n += rng.Int64N(3)
			h.ticks(1)
		default:
			h.ticks(1 + rng.IntN(2))
		}
	}
	h.ticks(40)
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
		// the time it played the tick at); never more than a tick early.
		if pos := int64(uint32(p.ts - offset)); p.at < pos-h.w.c.samples {
			t.Fatalf("packet %d %+v left more than a tick before its time %d", i, p, pos)
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

// TestWorkersShareQueues: at any number of workers, runs started at
// every moment of a tick by the queues of every worker stay on their
// queue's worker and play on their phase there: each worker ends up with
// the same number of queues, so all the workers share the steady-state
// sends.
func TestWorkersShareQueues(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 4, 6, 8, 16} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			c := newClock(workers, Tick)
			const base = 1000
			for _, w := range c.workers {
				w.playTick(base)
			}
			// At each of 4 moments of tick base+1, 3 runs from the
			// queues of each worker (NewQueue spreads queues over the
			// workers in turn).
			const moments, perWorker = 4, 3
			var sinks []*recorder
			for m := range int64(moments) {
				at := (base+1)*c.samples + m*c.samples/moments + 7
				for range perWorker * workers {
					sk := &recorder{at: at}
					q := c.NewQueue(sk, QueueConfig{})
					for i := range 5 {
						if err := q.PushAudio([]byte(fmt.Sprint(i)), 960); err != nil {
							t.Fatal(err)
						}
					}
					sinks = append(sinks, sk)
				}
				for _, w := range c.workers {
					w.runStarts(at)
				}
			}
			for k := int64(base + 2); k <= base+7; k++ {
				for _, sk := range sinks {
					sk.at = k * c.samples
				}
				for _, w := range c.workers {
					w.runStarts(k * c.samples)
					w.playTick(k)
				}
			}
			// The runs are in their grace, still on their workers.
			for i, w := range c.workers {
				if n := w.active(); n != perWorker*moments {
					t.Fatalf("worker %d holds %d queues, want %d", i, n, perWorker*moments)
				}
			}
			h := &phaseHarness{t: t, w: c.workers[0]}
			for i, sk := range sinks {
				if len(sk.pkts) != 5 {
					t.Fatalf("queue %d sent %d packets", i, len(sk.pkts))
				}
				h.checkPhase(sk.pkts)
			}
		})
	}
}

// TestMarkOffTheGrid: on a run whose phase is off the tick grid, a mark
// between two packets does not hold back the packet after it (no gap, no
// marker), and comes back at the first turn at or after its audio's end:
// the turn after the one that sends that packet, which leaves up to a
// tick before the end (TestMarkNotBeforeItsAudioEnds); a run that runs
// dry calls OnUnderrun at its second turn after its audio ended (more than
// JitterAllowance later), and what it pushes leaves in that turn.
func TestMarkOffTheGrid(t *testing.T) {
	var h *phaseHarness
	var underruns []int64
	h = newPhaseHarness(t, Tick, QueueConfig{OnUnderrun: func() {
		underruns = append(underruns, h.sink.at)
		h.push("tail", 960)
	}})
	h.push("a0", 960)
	h.push("a1", 960)
	if err := h.q.PushMark("m"); err != nil {
		t.Fatal(err)
	}
	h.push("a2", 960)
	h.wake(h.mid(77)) // a0, in the next tick
	h.ticks(2)        // that tick, then the next: a1
	if ev := eventTypes(h.q.Events(nil)); !reflect.DeepEqual(ev, []EventType{EventStarted}) {
		t.Fatalf("events after a1's turn %v, want the start only", ev)
	}
	h.ticks(1) // a2, before a1's audio ends
	if ev := h.q.Events(nil); len(ev) != 0 {
		t.Fatalf("events at a2's turn %+v, want none: a1's audio has not ended", ev)
	}
	if len(h.sink.pkts) != 3 {
		t.Fatalf("%d packets, want a0 a1 a2", len(h.sink.pkts))
	}
	h.checkPhase(h.sink.pkts)
	h.ticks(1) // a1's audio has ended
	if ev := h.q.Events(nil); !reflect.DeepEqual(ev, []Event{{Type: EventMark, Name: "m"}}) {
		t.Fatalf("events at the turn after a2's %+v, want the mark", ev)
	}
	h.ticks(1) // a2's turn + 2 ticks: the first turn after its audio ended, within JitterAllowance
	if len(underruns) != 0 {
		t.Fatalf("OnUnderrun at %v: within JitterAllowance of the audio's end", underruns)
	}
	h.ticks(1) // the underrun
	a2 := h.sink.pkts[2]
	if len(underruns) != 1 || underruns[0] != a2.at+3*960 || len(h.sink.pkts) != 4 {
		t.Fatalf("OnUnderrun at %v, %d packets; want once at %d (two turns after a2's audio ended), the tail sent then", underruns, len(h.sink.pkts), a2.at+3*960)
	}
	// a0 left at its timeline position: the timestamps' offset.
	// a0 left at its timeline position: the timestamps' offset. The tail
	// comes more than JitterAllowance after its time: a talkspurt.
	a0 := h.sink.pkts[0]
	if tail := h.sink.pkts[3]; tail.at != underruns[0] || !tail.marker || tail.ts-a0.ts != uint32(tail.at-a0.at) {
		t.Fatalf("tail %+v after a2 %+v: want it sent at the underrun's turn, marker, timestamp at that turn's time", tail, a2)
	}
}

// TestMarkNotBeforeItsAudioEnds: a mark comes back when the audio before
// it has played out on the pacing timeline: at the first turn at or after
// the end of its last packet (the first packet's send time plus the
// timestamps' difference plus the packet's duration), never before it,
// although that packet left up to a tick early, whatever the run's phase
// against the tick grid; and the marks hold back no audio. With the 20 ms
// and the 10 ms tick, and 20 ms packets on the 10 ms tick; with marks
// between packets, after the last, and one pushed while the last packet's
// audio is still playing.
func TestMarkNotBeforeItsAudioEnds(t *testing.T) {
	for _, c := range []struct {
		tick time.Duration
		dur  int
	}{{Tick, 960}, {TickShort, 480}, {TickShort, 960}} {
		for _, off := range []int64{0, 1, 77, 479} {
			t.Run(fmt.Sprintf("%v/%d/%d", c.tick, c.dur, off), func(t *testing.T) {
				h := newPhaseHarness(t, c.tick, QueueConfig{})
				const n = 6
				for i := range n {
					h.push(fmt.Sprint(i), c.dur)
					if err := h.q.PushMark(fmt.Sprint(i)); err != nil {
						t.Fatal(err)
					}
				}
				marks := map[string]int64{} // mark → the time it came back
				var order []string
				collect := func() {
					for _, e := range h.q.Events(nil) {
						if e.Type == EventMark {
							marks[e.Name] = h.sink.at
							order = append(order, e.Name)
						}
					}
				}
				h.wake(h.mid(off))
				collect()
				for len(h.sink.pkts) < n {
					h.ticks(1)
					collect()
				}
				// The last packet just left: its audio is still to play.
				if err := h.q.PushMark("grace"); err != nil {
					t.Fatal(err)
				}
				for range 4 {
					h.ticks(1)
					collect()
				}
				if len(h.sink.pkts) != n {
					t.Fatalf("%d packets sent of %d", len(h.sink.pkts), n)
				}
				h.checkPhase(h.sink.pkts)
				first := h.sink.pkts[0]
				end := func(i int) int64 { return first.at + int64(h.sink.pkts[i].ts-first.ts) + int64(c.dur) }
				want := []string{"0", "1", "2", "3", "4", "5", "grace"}
				if !slices.Equal(order, want) {
					t.Fatalf("marks came back %q, want %q", order, want)
				}
				for i, name := range want {
					p := min(i, n-1)
					at, e := marks[name], end(p)
					if at < e {
						t.Errorf("mark %s came back at %d, %d samples before its audio's end %d (packet %+v)", name, at, e-at, e, h.sink.pkts[p])
					}
					if at >= e+h.w.c.samples {
						t.Errorf("mark %s came back at %d, want the first turn at or after its audio's end %d", name, at, e)
					}
				}
			})
		}
	}
}

// TestClearReturnsSentMarks: a clear that finds marks whose audio has
// been sent in full but has not played out yet returns them as played
// (their audio is counted in played_ms and reaches the client), in order,
// before the marks it drops: those behind audio not sent yet. The first
// such mark has moved to the pending list (a later turn passed it); the
// second, right after the last packet sent, is still at the head of the
// queue (the turn that sent its audio stopped before it).
func TestClearReturnsSentMarks(t *testing.T) {
	h := newPhaseHarness(t, Tick, QueueConfig{})
	h.push("a0", 960)
	_ = h.q.PushMark("sent")
	h.push("a1", 960)
	_ = h.q.PushMark("sent, at the head")
	h.push("a2", 960)
	_ = h.q.PushMark("dropped")
	h.wake(h.mid(300)) // a0, 300 samples into a tick
	h.ticks(2)         // that tick, then the next: a1, before a0's audio ends
	if len(h.sink.pkts) != 2 {
		t.Fatalf("%d packets, want a0 and a1", len(h.sink.pkts))
	}
	h.q.Events(nil)
	if played := h.q.Clear(); played != 40 {
		t.Fatalf("Clear = %d ms, want 40", played)
	}
	want := []Event{
		{Type: EventMark, Name: "sent"},
		{Type: EventMark, Name: "sent, at the head"},
		{Type: EventMark, Name: "dropped", Cleared: true},
		{Type: EventCleared, PlayedMs: 40},
	}
	if ev := h.q.Events(nil); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events at the clear %+v, want %+v", ev, want)
	}
	h.ticks(3)
	if ev := h.q.Events(nil); len(ev) != 0 {
		t.Fatalf("events after the clear %+v, want none", ev)
	}
}

// TestRealTimeStreamOneTalkspurt: a backend that streams 20 ms frames in
// real time, each coming up to 14 ms after its time (its scheduling, its
// link), is played as one talkspurt: the first packet at once with the
// marker bit, every later one at the first turn after it came, with no
// marker and its timestamp 960 on, whatever the phase of the reply's start
// against the tick grid, with the 20 ms and the 10 ms tick (issue 28: the
// second packet fell off the grid: marker bit, timestamp 14–20 ms late).
func TestRealTimeStreamOneTalkspurt(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tick := range []time.Duration{Tick, TickShort} {
		for _, off := range []int64{0, 1, 100, 240, 479, 700, 959} {
			t.Run(fmt.Sprintf("%v/%d", tick, off), func(t *testing.T) {
				h := newPhaseHarness(t, tick, QueueConfig{})
				period := h.w.c.samples
				const frames, jitter = 150, 14 * 48
				start := h.mid(off % period)
				arrive := make([]int64, frames)
				for k := range arrive {
					arrive[k] = start + int64(k)*960
					if k > 0 {
						arrive[k] = max(arrive[k]+rng.Int64N(jitter+1), arrive[k-1])
					}
				}
				h.push("0", 960)
				h.wake(start)
				for k := 1; k < frames; k++ {
					for (h.n+1)*period <= arrive[k] {
						h.ticks(1)
					}
					h.push(fmt.Sprint(k), 960)
				}
				h.ticks(int(3 * 960 / period))
				pkts := h.sink.pkts
				if len(pkts) != frames || !pkts[0].marker || pkts[0].at != start {
					t.Fatalf("%d packets of %d, the first %+v: want it at %d with the marker", len(pkts), frames, pkts[0], start)
				}
				for k, p := range pkts[1:] {
					k++
					prev := pkts[k-1]
					turn := (arrive[k]/period + 1) * period // the first turn after it came
					if p.marker || p.ts != prev.ts+960 || p.seq != prev.seq+1 || p.data != fmt.Sprint(k) || p.at != turn {
						t.Fatalf("packet %d %+v after %+v, came at %d: want it at %d, no marker, timestamp +960, seq +1", k, p, prev, arrive[k], turn)
					}
				}
				if ev := eventTypes(h.q.Events(nil)); !reflect.DeepEqual(ev, []EventType{EventStarted}) {
					t.Fatalf("events %v, want one run started", ev)
				}
			})
		}
	}
}
