package playout

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// graceTicks is DefaultRunGrace in ticks: the empty ticks a run outlasts.
const graceTicks = int(DefaultRunGrace / Tick)

// recorder is a Sink that keeps copies of what it was sent, each with the
// time it was sent at: the tick count in the tick-driven tests (harness),
// the timeline position in 48 kHz samples in the phase tests
// (phaseHarness).
type recorder struct {
	at   int64
	pkts []sent
}

type sent struct {
	at     int64
	seq    uint16
	ts     uint32
	marker bool
	data   string
}

func (r *recorder) SendPacket(p *Packet) {
	r.pkts = append(r.pkts, sent{r.at, p.Seq, p.Timestamp, p.Marker, string(p.Payload)})
}

// harness drives one queue on a clock with one worker, tick by tick.
type harness struct {
	t   *testing.T
	c   *Clock
	q   *Queue
	rec *recorder
	n   int64
}

func newHarness(t *testing.T, cfg QueueConfig) *harness {
	return newHarnessTick(t, Tick, cfg)
}

// newHarnessTick is newHarness on a clock ticking every tick.
func newHarnessTick(t *testing.T, tick time.Duration, cfg QueueConfig) *harness {
	c := newClock(1, tick)
	h := &harness{t: t, c: c, rec: &recorder{}, n: 1000}
	h.q = c.NewQueue(h.rec, cfg)
	return h
}

// run plays k ticks.
func (h *harness) run(k int) {
	for range k {
		h.rec.at = h.n
		h.c.workers[0].runTick(h.n)
		h.n++
	}
}

func (h *harness) push(data string, dur int) {
	h.t.Helper()
	if err := h.q.PushAudio([]byte(data), dur); err != nil {
		h.t.Fatalf("PushAudio(%s): %v", data, err)
	}
}

func (h *harness) events() []Event { return h.q.Events(nil) }

func TestBurstPacedOnePerTick(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	const n = 500 // 10 s in one burst
	for i := range n {
		h.push(fmt.Sprint(i), 960)
	}
	if q := h.q.Queued(); q != 10*time.Second {
		t.Fatalf("Queued = %v, want 10s", q)
	}
	h.run(n)
	if len(h.rec.pkts) != n {
		t.Fatalf("%d packets after %d ticks, want one per tick", len(h.rec.pkts), n)
	}
	first := h.rec.pkts[0]
	for i, p := range h.rec.pkts {
		want := sent{first.at + int64(i), first.seq + uint16(i), first.ts + uint32(i*960), i == 0, fmt.Sprint(i)}
		if p != want {
			t.Fatalf("packet %d = %+v, want %+v", i, p, want)
		}
	}
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventStarted}}) {
		t.Fatalf("events during playout %+v", ev)
	}
	h.run(graceTicks) // the last packet's audio ends: the run's grace
	if ev := h.events(); len(ev) != 0 {
		t.Fatalf("events within the grace after the audio %+v, want none yet", ev)
	}
	h.run(1)
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventStopped, PlayedMs: 10000}}) {
		t.Fatalf("events after the grace %+v, want stopped 10000 ms", ev)
	}
	if !h.q.Idle() || h.c.workers[0].active() != 0 {
		t.Fatalf("queue idle %v, worker active list %d after the run", h.q.Idle(), h.c.workers[0].active())
	}
	// A later reply: the sequence goes on, the timestamp follows real time,
	// a new talkspurt.
	h.run(10)
	h.push("later", 960)
	h.run(1)
	last, p := h.rec.pkts[n-1], h.rec.pkts[n]
	if p.seq != last.seq+1 || !p.marker || p.ts != last.ts+uint32((p.at-last.at)*960) {
		t.Fatalf("next reply's first packet %+v after %+v: want seq+1, marker, timestamp by elapsed ticks", p, last)
	}
}

func TestClear(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	if err := h.q.PushResponse("resp_1"); err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		h.push(fmt.Sprint(i), 960)
		if i == 100 {
			_ = h.q.PushMark("m100")
		}
	}
	_ = h.q.PushMark("end")
	h.run(50)
	if played := h.q.Clear(); played != 1000 {
		t.Fatalf("Clear = %d ms, want 1000 (50 packets sent)", played)
	}
	want := []Event{
		{Type: EventStarted, ResponseID: "resp_1"},
		{Type: EventMark, Name: "m100", Cleared: true},
		{Type: EventMark, Name: "end", Cleared: true},
		{Type: EventCleared, PlayedMs: 1000, ResponseID: "resp_1"},
	}
	if ev := h.events(); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events %+v, want %+v", ev, want)
	}
	h.run(20)
	if len(h.rec.pkts) != 50 || h.q.Queued() != 0 {
		t.Fatalf("%d packets sent, %v queued after the clear; want 50, 0", len(h.rec.pkts), h.q.Queued())
	}
	if ev := h.events(); len(ev) != 0 {
		t.Fatalf("events after a clear %+v, want none (no stopped)", ev)
	}
	// Nothing queued: a clear reports 0 and still answers.
	if played := h.q.Clear(); played != 0 {
		t.Fatalf("second Clear = %d", played)
	}
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventCleared}}) {
		t.Fatalf("events of an idle clear %+v", ev)
	}
	// The next reply continues the sequence, starts a talkspurt.
	h.push("next", 960)
	h.run(1)
	last, p := h.rec.pkts[49], h.rec.pkts[50]
	if p.seq != last.seq+1 || !p.marker || p.data != "next" {
		t.Fatalf("first packet after the clear %+v, last before %+v", p, last)
	}
}

// TestClearTail: a clear that cuts a run sends the configured silence
// packets on the next ticks, continuing the RTP numbering, with no events
// and nothing counted; an idle clear sends none; a new reply starts its
// own talkspurt after them.
func TestClearTail(t *testing.T) {
	h := newHarness(t, QueueConfig{ClearTail: []byte("quiet"), ClearTailTicks: 3})
	for i := range 100 {
		h.push(fmt.Sprint(i), 960)
	}
	h.run(10)
	if played := h.q.Clear(); played != 200 {
		t.Fatalf("Clear = %d ms, want 200", played)
	}
	h.run(10)
	if n := len(h.rec.pkts); n != 13 {
		t.Fatalf("%d packets after the clear and 10 ticks, want 10 of the reply and 3 of silence", n)
	}
	for i, p := range h.rec.pkts[10:] {
		prev := h.rec.pkts[9+i]
		if p.data != "quiet" || p.marker || p.seq != prev.seq+1 || p.ts != prev.ts+960 || p.at != prev.at+1 {
			t.Fatalf("tail packet %d %+v after %+v: want silence, numbered on, one per tick", i, p, prev)
		}
	}
	want := []Event{{Type: EventStarted}, {Type: EventCleared, PlayedMs: 200}}
	if ev := h.events(); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events %+v, want %+v", ev, want)
	}
	// Idle: no tail.
	h.q.Clear()
	h.run(5)
	if n := len(h.rec.pkts); n != 13 {
		t.Fatalf("an idle clear sent %d packets", n-13)
	}
	// A reply pushed during a tail ends it and starts a talkspurt.
	h.push("a", 960)
	h.run(1)
	h.q.Clear()
	h.push("b", 960)
	h.run(3)
	got := h.rec.pkts[13:]
	if len(got) != 2 || got[0].data != "a" || got[1].data != "b" || !got[1].marker {
		t.Fatalf("packets %+v, want a, then b starting a talkspurt and no tail", got)
	}
}

func TestMarksAfterTheirAudio(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	_ = h.q.PushMark("idle") // empty idle queue: back at once
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventMark, Name: "idle"}}) {
		t.Fatalf("mark on an idle queue: %+v", ev)
	}
	for _, s := range []string{"a0", "a1", "a2", "M1", "a3", "R", "a4", "M2"} {
		switch s[0] {
		case 'M':
			_ = h.q.PushMark(s)
		case 'R':
			_ = h.q.PushResponse("r2")
		default:
			h.push(s, 960)
		}
	}
	var got []string
	for range 7 + graceTicks {
		h.run(1)
		for _, e := range h.events() {
			got = append(got, fmt.Sprintf("%d:%s:%s:%s", h.n-1-1000, e.Type, e.Name, e.ResponseID))
		}
	}
	want := []string{"0:started::", "3:mark:M1:", "5:mark:M2:", fmt.Sprintf("%d:stopped::r2", 5+graceTicks)}
	if !slices.Equal(got, want) {
		t.Fatalf("events (tick:type:name:response) %q, want %q", got, want)
	}
	for i, p := range h.rec.pkts {
		if p.at-1000 != int64(i) {
			t.Fatalf("packet %d sent at tick %d", i, p.at-1000)
		}
	}
}

func TestPacketDurations(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	// 60 ms, 10 ms, 10 ms, 20 ms, 40 ms, 20 ms
	for i, d := range []int{2880, 480, 480, 960, 1920, 960} {
		h.push(fmt.Sprint(i), d)
	}
	h.run(10)
	var ticks []int64
	var tss []uint32
	for _, p := range h.rec.pkts {
		ticks = append(ticks, p.at-1000)
		tss = append(tss, p.ts-h.rec.pkts[0].ts)
	}
	if want := []int64{0, 3, 3, 4, 5, 7}; !slices.Equal(ticks, want) {
		t.Fatalf("sent at ticks %v, want %v", ticks, want)
	}
	if want := []uint32{0, 2880, 3360, 3840, 4800, 6720}; !slices.Equal(tss, want) {
		t.Fatalf("timestamps %v, want %v", tss, want)
	}
}

// TestGapWithinGrace: audio that comes while the run's queue has been
// empty for up to RunGrace continues the run: seq +1, the timestamp
// jumps by the time that passed (the receiver sees the gap as time), the
// marker bit starts the new talkspurt, played_ms counts the audio sent,
// not the gap, and OnUnderrun came once, after one empty tick.
// TestGapWithinGrace: audio that comes while its queue is empty within
// the run's grace continues the run (no new EventStarted); its timestamps
// go on when it is at most JitterAllowance late, and otherwise follow the
// time that passed, with the marker bit.
func TestGapWithinGrace(t *testing.T) {
	for _, gap := range []int{1, 3, graceTicks} { // empty ticks between a's end and b
		t.Run(fmt.Sprintf("%d ticks", gap), func(t *testing.T) {
			var h *harness
			var underruns []int64
			h = newHarness(t, QueueConfig{OnUnderrun: func() { underruns = append(underruns, h.rec.at) }})
			h.push("a", 960)
			h.run(1 + gap) // sent, then the empty ticks
			h.push("b", 960)
			h.run(2 + graceTicks)
			if len(h.rec.pkts) != 2 {
				t.Fatalf("%d packets", len(h.rec.pkts))
			}
			a, b := h.rec.pkts[0], h.rec.pkts[1]
			// b was due a tick after a: one empty turn at or after its
			// time is within JitterAllowance (timestamps go on), more is
			// a talkspurt after a gap.
			wantTS, wantMarker := a.ts+960, false
			if int64(gap)*960 > jitterSamples {
				wantTS, wantMarker = a.ts+uint32(960*(gap+1)), true
			}
			if b.marker != wantMarker || b.seq != a.seq+1 || b.at != a.at+int64(gap)+1 || b.ts != wantTS {
				t.Fatalf("late packet %+v after %+v: want marker %v, seq+1, %d ticks later, timestamp %d", b, a, wantMarker, gap+1, wantTS)
			}
			want := []Event{{Type: EventStarted}, {Type: EventStopped, PlayedMs: 40}}
			if ev := h.events(); !reflect.DeepEqual(ev, want) {
				t.Fatalf("events %+v, want one run %+v", ev, want)
			}
			// One underrun a gap of more than a tick, and one at the end.
			wantU := []int64{b.at + 2}
			if gap > 1 {
				wantU = []int64{a.at + 2, b.at + 2}
			}
			if !slices.Equal(underruns, wantU) {
				t.Fatalf("OnUnderrun at ticks %v, want %v", underruns, wantU)
			}
		})
	}
}

// TestGapLongerThanGrace: a queue empty for longer than RunGrace ends the
// run (EventStopped once the grace is over); the next audio is a new run,
// numbered on, its timestamp following real time.
func TestGapLongerThanGrace(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	h.push("a", 960)
	h.run(1 + graceTicks + 1)
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventStarted}, {Type: EventStopped, PlayedMs: 20}}) {
		t.Fatalf("events after a gap of more than the grace %+v, want the run stopped", ev)
	}
	if !h.q.Idle() {
		t.Fatal("queue not idle after its run stopped")
	}
	h.push("b", 960)
	h.run(2 + graceTicks)
	a, b := h.rec.pkts[0], h.rec.pkts[1]
	if !b.marker || b.seq != a.seq+1 || b.ts != a.ts+uint32(960*(b.at-a.at)) {
		t.Fatalf("next run's packet %+v after %+v: want marker, seq+1, timestamp by elapsed ticks", b, a)
	}
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventStarted}, {Type: EventStopped, PlayedMs: 20}}) {
		t.Fatalf("events of the second run %+v", ev)
	}
}

// TestNewResponseAfterGap: audio tagged with a new response id after a
// gap within the grace is a new run (one started/stopped pair per
// response, each with its id); the same id, or a new one in contiguous
// audio, continues the run.
func TestNewResponseAfterGap(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	tag := func(id string) {
		if err := h.q.PushResponse(id); err != nil {
			t.Fatal(err)
		}
	}
	tag("r1")
	h.push("a", 960)
	h.run(4) // a gap of three ticks
	tag("r1")
	h.push("b", 960) // the same response: same run
	tag("r2")
	h.push("c", 960) // contiguous: same run
	h.run(3)
	tag("r3")
	h.push("d", 960) // after a gap: a new run
	h.run(2 + graceTicks)
	var got []string
	for _, e := range h.events() {
		got = append(got, fmt.Sprintf("%s:%s:%d", e.Type, e.ResponseID, e.PlayedMs))
	}
	if want := []string{"started:r1:0", "stopped:r2:60", "started:r3:0", "stopped:r3:20"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	var marks []bool
	for _, p := range h.rec.pkts {
		marks = append(marks, p.marker)
	}
	if want := []bool{true, true, false, true}; !slices.Equal(marks, want) {
		t.Fatalf("markers %v, want %v", marks, want)
	}
}

// TestRunGraceConfig: QueueConfig.RunGrace rounds up to whole ticks, and
// one tick at least.
func TestRunGraceConfig(t *testing.T) {
	for _, c := range []struct {
		grace time.Duration
		ticks int // empty ticks the run outlasts
	}{{Tick, 1}, {time.Millisecond, 1}, {50 * time.Millisecond, 3}, {0, graceTicks}, {-time.Second, graceTicks}} {
		h := newHarness(t, QueueConfig{RunGrace: c.grace})
		h.push("a", 960)
		h.run(1 + c.ticks)
		if !slices.Equal(eventTypes(h.events()), []EventType{EventStarted}) {
			t.Fatalf("RunGrace %v: the run stopped within %d empty ticks", c.grace, c.ticks)
		}
		h.run(1)
		if !slices.Equal(eventTypes(h.events()), []EventType{EventStopped}) {
			t.Fatalf("RunGrace %v: the run did not stop after %d empty ticks", c.grace, c.ticks+1)
		}
	}
}

func eventTypes(evs []Event) []EventType {
	var types []EventType
	for _, e := range evs {
		types = append(types, e.Type)
	}
	return types
}

// TestRealTimeStreamWithJitter: a backend that streams a 10 s reply at
// about real time, pacing itself with a sleep of 20 ms after each frame
// (a TTS relay, an echo), plays one run: one EventStarted, one
// EventStopped with all of it. Its sleeps overshoot by up to 2 ms, and
// one in ten by up to 60 ms (its scheduler, a GC pause); it never makes
// up for lost time, so each long overshoot is a gap in the queue. The
// same stream with a grace of one tick splits into many runs (the defect
// the grace fixes), so the test can tell.
func TestRealTimeStreamWithJitter(t *testing.T) {
	const frames = 500
	rng := rand.New(rand.NewPCG(1, 2))
	arrive := make([]int, frames) // the tick before which frame k is pushed
	var sent float64              // ms
	for k := range arrive {
		arrive[k] = int(sent / 20)
		sent += 20 + 2*rng.Float64()
		if rng.IntN(10) == 0 {
			sent += 60 * rng.Float64()
		}
	}
	for _, c := range []struct {
		grace time.Duration
		runs  func(int) bool
	}{
		{0, func(n int) bool { return n == 1 }},
		{Tick, func(n int) bool { return n > 10 }},
	} {
		h := newHarness(t, QueueConfig{RunGrace: c.grace})
		k := 0
		for tick := 0; k < frames || !h.q.Idle(); tick++ {
			for ; k < frames && arrive[k] <= tick; k++ {
				h.push(fmt.Sprint(k), 960)
			}
			h.run(1)
		}
		var started, stopped int
		var played int64
		for _, e := range h.events() {
			switch e.Type {
			case EventStarted:
				started++
			case EventStopped:
				stopped++
				played += e.PlayedMs
			}
		}
		if !c.runs(started) || stopped != started || played != 20*frames || len(h.rec.pkts) != frames {
			t.Fatalf("RunGrace %v: %d runs started, %d stopped, %d ms played, %d packets", cmp.Or(c.grace, DefaultRunGrace), started, stopped, played, len(h.rec.pkts))
		}
		t.Logf("RunGrace %v: %d runs", cmp.Or(c.grace, DefaultRunGrace), started)
		for i, p := range h.rec.pkts[1:] {
			prev := h.rec.pkts[i]
			if p.seq != prev.seq+1 || p.ts-prev.ts < 960 || p.data != fmt.Sprint(i+1) {
				t.Fatalf("packet %d %+v after %+v", i+1, p, prev)
			}
		}
	}
}

// TestLateWorker: ticks the worker could not play in time are played
// with the next one: their packets leave together, timestamps contiguous.
func TestLateWorker(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	for i := range 6 {
		h.push(fmt.Sprint(i), 960)
	}
	h.run(1)
	h.n += 3 // three ticks missed
	h.run(1)
	h.run(1)
	var ticks []int64
	for i, p := range h.rec.pkts {
		ticks = append(ticks, p.at-1000)
		if p.ts != h.rec.pkts[0].ts+uint32(960*i) || p.seq != h.rec.pkts[0].seq+uint16(i) {
			t.Fatalf("packet %d: %+v", i, p)
		}
	}
	if want := []int64{0, 4, 4, 4, 4, 5}; !slices.Equal(ticks, want) {
		t.Fatalf("sent at ticks %v, want %v", ticks, want)
	}
	if got := h.c.Stats().LateTicks; got != 3 {
		t.Fatalf("LateTicks %d, want 3", got)
	}
}

// TestPaused: a paused queue holds its audio until Resume, then plays it
// from the start.
func TestPaused(t *testing.T) {
	h := newHarness(t, QueueConfig{Paused: true})
	h.push("greeting", 960)
	h.run(5)
	if len(h.rec.pkts) != 0 || len(h.events()) != 0 {
		t.Fatalf("a paused queue sent %d packets", len(h.rec.pkts))
	}
	h.q.Resume()
	h.run(1)
	if len(h.rec.pkts) != 1 || !h.rec.pkts[0].marker || h.rec.pkts[0].data != "greeting" {
		t.Fatalf("after Resume: %+v", h.rec.pkts)
	}
}

func TestCaps(t *testing.T) {
	h := newHarness(t, QueueConfig{MaxQueued: time.Second, MaxItems: 60})
	for i := range 50 {
		h.push(fmt.Sprint(i), 960)
	}
	if err := h.q.PushAudio([]byte("x"), 960); !errors.Is(err, ErrFull) {
		t.Fatalf("51st packet: %v, want ErrFull", err)
	}
	for range 10 {
		_ = h.q.PushMark("m")
	}
	if err := h.q.PushMark("m"); !errors.Is(err, ErrFull) {
		t.Fatalf("61st item: %v, want ErrFull", err)
	}
	h.run(1)
	if err := h.q.PushAudio([]byte("x"), 960); err != nil {
		t.Fatalf("after a packet left: %v", err)
	}
	h.q.Close()
	if err := h.q.PushAudio([]byte("x"), 960); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	h.run(1)
	if h.c.workers[0].active() != 0 {
		t.Fatal("a closed queue stays on the worker's list")
	}
}

// TestCompaction keeps a queue topped up for a long time: memory stays
// bounded and the bytes stay right.
func TestCompaction(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	next := 0
	for range 10 {
		h.push(fmt.Sprintf("p%06d", next), 960)
		next++
	}
	for range 5000 {
		h.push(fmt.Sprintf("p%06d", next), 960)
		next++
		if next%7 == 0 {
			_ = h.q.PushMark("m")
		}
		h.run(1)
	}
	for i, p := range h.rec.pkts {
		if p.data != fmt.Sprintf("p%06d", i) {
			t.Fatalf("packet %d = %q", i, p.data)
		}
	}
	if c := cap(h.q.arena); c > 4096 {
		t.Fatalf("arena grew to %d bytes for ~10 packets waiting", c)
	}
}

// TestMemoryReleased: after a long reply has played, the queue does not
// keep its buffers.
func TestMemoryReleased(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	payload := make([]byte, 160)
	for range 3000 { // 60 s
		if err := h.q.PushAudio(payload, 960); err != nil {
			t.Fatal(err)
		}
	}
	if cap(h.q.arena) < 3000*160 {
		t.Fatalf("arena %d bytes for 3000 packets", cap(h.q.arena))
	}
	h.run(3002)
	if cap(h.q.arena) > keepArena || cap(h.q.items) > keepItems {
		t.Fatalf("after the reply the queue keeps %d arena bytes and %d item slots", cap(h.q.arena), cap(h.q.items))
	}
	if !h.q.Fits(DefaultMaxItems, 1000) || h.q.Fits(DefaultMaxItems+1, 0) {
		t.Fatal("Fits does not check the item cap")
	}
}

func TestTickAllocs(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	h.q.sink = sinkFunc(func(*Packet) {}) // the recorder allocates
	payload := make([]byte, 120)
	var evs []Event
	step := func() {
		_ = h.q.PushAudio(payload, 960)
		h.run(1)
		evs = h.q.Events(evs[:0])
	}
	for range 200 {
		step()
	}
	if n := testing.AllocsPerRun(1000, step); n != 0 {
		t.Fatalf("push + tick: %v allocations, want 0", n)
	}
}

// TestClockRuns drives a real clock: a short reply plays and stops, and
// Close leaves no goroutine (goleak in TestMain).
func TestClockRuns(t *testing.T) {
	c, err := NewClock(ClockConfig{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rec := make(chan struct{}, 100)
	q := c.NewQueue(sinkFunc(func(*Packet) { rec <- struct{}{} }), QueueConfig{})
	for range 5 {
		if err := q.PushAudio([]byte{1}, 960); err != nil {
			t.Fatal(err)
		}
	}
	_ = q.PushMark("done")
	var got []Event
	for len(got) < 3 {
		select {
		case <-q.Notify():
			got = q.Events(got)
		case <-time.After(5 * time.Second):
			t.Fatalf("events so far %+v", got)
		}
	}
	want := []Event{{Type: EventStarted}, {Type: EventMark, Name: "done"}, {Type: EventStopped, PlayedMs: 100}}
	if !reflect.DeepEqual(got, want) || len(rec) != 5 {
		t.Fatalf("events %+v, %d packets; want %+v, 5", got, len(rec), want)
	}
}

type sinkFunc func(*Packet)

func (f sinkFunc) SendPacket(p *Packet) { f(p) }

// TestCatchUpAfterStall: a backend streaming in real time (one 20 ms
// packet per tick, an echo) stalls for half a second, then sends what it
// owed at once and goes on in real time. Playout sheds that backlog, two
// packets a tick, down to CatchUpTarget, instead of keeping the stall as
// added latency for the rest of the stream; nothing is dropped, the
// sequence and timestamps stay continuous, played_ms stays exact.
func TestCatchUpAfterStall(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	i := 0
	push := func() { h.push(fmt.Sprint(i), 960); i++ }
	stream := func(ticks int) {
		for range ticks {
			push()
			h.run(1)
		}
	}
	stream(150) // 3 s: the pace window sees real time
	if q := h.q.Queued(); q != 0 {
		t.Fatalf("%v queued while streaming in real time", q)
	}
	h.run(25) // the stall: the run stops
	for range 25 {
		push() // what the backend owed, at once
	}
	stream(20)
	if q := h.q.Queued(); q < 100*time.Millisecond {
		t.Fatalf("%v queued 20 ticks after the stall: caught up faster than one extra packet a tick", q)
	}
	stream(80)
	if q, limit := h.q.Queued(), time.Duration(CatchUpTarget+TickSamples)*time.Second/48000; q > limit {
		t.Fatalf("%v still queued 100 ticks after the stall, want at most %v: the stall stayed as latency", q, limit)
	}
	h.run(10 + graceTicks)
	if len(h.rec.pkts) != i {
		t.Fatalf("%d packets sent of %d", len(h.rec.pkts), i)
	}
	for k, p := range h.rec.pkts {
		if p.data != fmt.Sprint(k) || p.seq != h.rec.pkts[0].seq+uint16(k) {
			t.Fatalf("packet %d: %+v", k, p)
		}
	}
	// The run after the stall: timestamps +960 a packet, whatever the
	// ticks they left in.
	restart := slices.IndexFunc(h.rec.pkts[1:], func(p sent) bool { return p.marker }) + 1
	after := h.rec.pkts[restart:]
	for k, p := range after {
		if p.ts != after[0].ts+uint32(960*k) {
			t.Fatalf("packet %d after the stall: timestamp %d, want %d", k, p.ts, after[0].ts+uint32(960*k))
		}
	}
	caught := int(h.c.Stats().CaughtUp / 960)
	if caught < 20 || caught > 25 {
		t.Fatalf("caught up %d packets, want the stall's 25 less the target", caught)
	}
	var played []int64
	for _, e := range h.events() {
		if e.Type == EventStopped {
			played = append(played, e.PlayedMs)
		}
	}
	if want := []int64{int64(20 * restart), int64(20 * len(after))}; !slices.Equal(played, want) {
		t.Fatalf("runs played %v ms, want %v", played, want)
	}
}

// TestNoCatchUpForBurst: a backend that streamed in real time and then
// sends a 10 s reply in one go (ahead of real time) has it paced at one
// packet per tick: catch-up is for a backend that fell behind, never for
// one that is ahead.
func TestNoCatchUpForBurst(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	for k := range 150 {
		h.push(fmt.Sprint(k), 960)
		h.run(1)
	}
	for k := range 500 {
		h.push(fmt.Sprint(150+k), 960)
	}
	h.run(500)
	burst := h.rec.pkts[150:]
	if len(burst) != 500 {
		t.Fatalf("%d packets of the burst in 500 ticks", len(burst))
	}
	for k, p := range burst {
		if p.at != burst[0].at+int64(k) {
			t.Fatalf("burst packet %d sent at tick %d, want %d: one per tick", k, p.at, burst[0].at+int64(k))
		}
	}
	if c := h.c.Stats().CaughtUp; c != 0 {
		t.Fatalf("caught up %d samples of a burst", c)
	}
}

// TestNoCatchUpForSpreadBurst: a 10 s reply sent ahead of real time
// whose pushes spread over a few ticks (a transceiver encodes PCM frame by
// frame as it comes) is paced one packet per tick to its end: as the
// burst's last pushes slide out of the pace window, the window's sum
// passes through the real-time range, but the backend has gone quiet.
func TestNoCatchUpForSpreadBurst(t *testing.T) {
	for _, per := range []int{100, 50, 25, 10} { // packets pushed per tick
		h := newHarness(t, QueueConfig{})
		for k := range 500 {
			h.push(fmt.Sprint(k), 960)
			if k%per == per-1 {
				h.run(1)
			}
		}
		h.run(510)
		if len(h.rec.pkts) != 500 {
			t.Fatalf("%d a tick: %d packets of 500", per, len(h.rec.pkts))
		}
		for k, p := range h.rec.pkts {
			if p.at != h.rec.pkts[0].at+int64(k) {
				t.Fatalf("%d a tick: packet %d sent at tick %d, want %d: one per tick", per, k, p.at, h.rec.pkts[0].at+int64(k))
			}
		}
		if c := h.c.Stats().CaughtUp; c != 0 {
			t.Fatalf("%d a tick: caught up %d samples of a burst", per, c)
		}
	}
}

// TestNoCatchUpForShortReply: a reply no longer than the pace window, sent
// in one burst into an idle queue, is paced one packet per tick: its
// pushes look like real time over a full window, but they do not span it.
func TestNoCatchUpForShortReply(t *testing.T) {
	for _, n := range []int{50, 100, 110} { // 1 s, 2 s (the window), 2.2 s
		h := newHarness(t, QueueConfig{})
		for k := range n {
			h.push(fmt.Sprint(k), 960)
		}
		h.run(n + 10)
		if len(h.rec.pkts) != n {
			t.Fatalf("%d packets of a %d-packet reply", len(h.rec.pkts), n)
		}
		for k, p := range h.rec.pkts {
			if p.at != h.rec.pkts[0].at+int64(k) {
				t.Fatalf("%d-packet reply: packet %d sent at tick %d, want %d: one per tick", n, k, p.at, h.rec.pkts[0].at+int64(k))
			}
		}
		if c := h.c.Stats().CaughtUp; c != 0 {
			t.Fatalf("%d-packet reply: caught up %d samples", n, c)
		}
	}
}
