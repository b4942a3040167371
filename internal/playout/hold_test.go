package playout

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

// TestHoldReleaseDiscard: audio, marks and tags pushed behind the gate
// are not sent and keep no worker busy; Discard drops them (their marks
// come back cleared) and keeps holding; Release plays what is held at
// once, as a run from idle.
func TestHoldReleaseDiscard(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	h.q.Hold()
	if !h.q.Holding() {
		t.Fatal("Holding() = false after Hold")
	}
	_ = h.q.PushResponse("r1")
	for i := range 10 {
		h.push(fmt.Sprint("held", i), 960)
	}
	_ = h.q.PushMark("m1")
	h.run(5)
	if len(h.rec.pkts) != 0 || h.c.workers[0].active() != 0 {
		t.Fatalf("held audio: %d packets sent, worker active %d; want none, and no worker", len(h.rec.pkts), h.c.workers[0].active())
	}
	if h.q.Idle() || h.q.Playing() || h.q.Queued() != 200*time.Millisecond {
		t.Fatalf("held: Idle %v Playing %v Queued %v; want false, false, 200ms", h.q.Idle(), h.q.Playing(), h.q.Queued())
	}
	if ms := h.q.Discard(); ms != 200 {
		t.Fatalf("Discard = %d ms, want 200", ms)
	}
	if ev := h.events(); !reflect.DeepEqual(ev, []Event{{Type: EventMark, Name: "m1", Cleared: true}}) {
		t.Fatalf("events after Discard %+v, want m1 cleared", ev)
	}
	if !h.q.Holding() || !h.q.Idle() || h.q.Queued() != 0 {
		t.Fatalf("after Discard: Holding %v Idle %v Queued %v; want the gate closed on an empty queue", h.q.Holding(), h.q.Idle(), h.q.Queued())
	}
	// Still holding: the next reply waits too, then plays at once.
	_ = h.q.PushResponse("r2")
	for i := range 5 {
		h.push(fmt.Sprint("r2-", i), 960)
	}
	_ = h.q.PushMark("m2")
	h.run(3)
	if len(h.rec.pkts) != 0 {
		t.Fatalf("%d packets sent while holding", len(h.rec.pkts))
	}
	if ms := h.q.Release(); ms != 100 {
		t.Fatalf("Release = %d ms, want 100", ms)
	}
	if h.q.Holding() || !h.q.Playing() {
		t.Fatalf("after Release: Holding %v Playing %v", h.q.Holding(), h.q.Playing())
	}
	h.run(5 + graceTicks + 1)
	if len(h.rec.pkts) != 5 || h.rec.pkts[0].data != "r2-0" || !h.rec.pkts[0].marker {
		t.Fatalf("packets %+v, want r2's 5, the first a talkspurt", h.rec.pkts)
	}
	want := []Event{{Type: EventStarted, ResponseID: "r2"}, {Type: EventMark, Name: "m2"}, {Type: EventStopped, PlayedMs: 100, ResponseID: "r2"}}
	if ev := h.events(); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events %+v, want %+v", ev, want)
	}
	if ms := h.q.Release(); ms != 0 {
		t.Fatalf("Release without a gate = %d", ms)
	}
	if ms := h.q.Discard(); ms != 0 {
		t.Fatalf("Discard without a gate = %d", ms)
	}
}

// TestHoldBehindARun: a gate closed while a run plays holds only what is
// pushed after it: the run plays out and stops, the held reply waits for
// Release and then starts its own run. A clear drops both, and the gate
// stays.
func TestHoldBehindARun(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	for i := range 10 {
		h.push(fmt.Sprint("old", i), 960)
	}
	h.run(3)
	h.q.Hold()
	for i := range 4 {
		h.push(fmt.Sprint("new", i), 960)
	}
	h.run(7 + graceTicks + 5)
	if len(h.rec.pkts) != 10 || h.rec.pkts[9].data != "old9" {
		t.Fatalf("%d packets (last %+v), want the 10 of the run before the gate", len(h.rec.pkts), h.rec.pkts[len(h.rec.pkts)-1])
	}
	want := []Event{{Type: EventStarted}, {Type: EventStopped, PlayedMs: 200}}
	if ev := h.events(); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events %+v, want %+v", ev, want)
	}
	h.q.Release()
	h.run(4)
	if len(h.rec.pkts) != 14 || h.rec.pkts[10].data != "new0" || !h.rec.pkts[10].marker {
		t.Fatalf("after Release: packets %+v", h.rec.pkts[10:])
	}
	// A clear drops the playing run and what is held; the gate stays.
	h.run(graceTicks + 1)
	_ = h.events()
	for i := range 10 {
		h.push(fmt.Sprint("a", i), 960)
	}
	h.run(2)
	h.q.Hold()
	h.push("b", 960)
	_ = h.q.PushMark("mb")
	if played := h.q.Clear(); played != 40 {
		t.Fatalf("Clear = %d, want 40", played)
	}
	want = []Event{{Type: EventStarted}, {Type: EventMark, Name: "mb", Cleared: true}, {Type: EventCleared, PlayedMs: 40}}
	if ev := h.events(); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events %+v, want %+v", ev, want)
	}
	if !h.q.Holding() || h.q.Queued() != 0 {
		t.Fatalf("after a clear: Holding %v Queued %v", h.q.Holding(), h.q.Queued())
	}
}

// TestHoldCompaction: a gate stays in place while the queue before it is
// compacted (a long reply, with the held audio behind it).
func TestHoldCompaction(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	for i := range 300 {
		h.push(fmt.Sprint(i), 960)
	}
	h.q.Hold()
	for i := range 20 {
		h.push(fmt.Sprint("h", i), 960)
	}
	h.run(299)
	if ms := h.q.Discard(); ms != 400 {
		t.Fatalf("Discard after compactions = %d ms, want 400", ms)
	}
	h.run(1)
	if n := len(h.rec.pkts); n != 300 || h.rec.pkts[n-1].data != "299" {
		t.Fatalf("%d packets, last %+v: want the 300 before the gate", n, h.rec.pkts[n-1])
	}
	h.q.Release()
	h.push("after", 960)
	h.run(1)
	if p := h.rec.pkts[len(h.rec.pkts)-1]; p.data != "after" {
		t.Fatalf("last packet %+v, want the audio pushed after the release", p)
	}
}

// TestPauseRun: a paused run sends its clear tail and then nothing, does
// not end while paused (however long), fills the pause with silence (a
// packet a tick, numbered and timed on), keeps what is pushed meanwhile,
// and resumes where it paused, straight after the silence; a clear of a
// paused run reports what was played before the pause and sends nothing
// more.
func TestPauseRun(t *testing.T) {
	h := newHarness(t, QueueConfig{ClearTail: []byte("quiet"), ClearTailTicks: 3})
	if _, ok := h.q.PauseRun(); ok {
		t.Fatal("PauseRun on an idle queue: ok")
	}
	if _, ok := h.q.ResumeRun(); ok {
		t.Fatal("ResumeRun of a queue not paused: ok")
	}
	_ = h.q.PushResponse("r1")
	for i := range 20 {
		h.push(fmt.Sprint(i), 960)
	}
	_ = h.q.PushMark("m15")
	h.run(10)
	played, ok := h.q.PauseRun()
	if !ok || played != 200 || !h.q.RunPaused() {
		t.Fatalf("PauseRun = %d, %v; RunPaused %v; want 200 ms", played, ok, h.q.RunPaused())
	}
	if _, ok := h.q.PauseRun(); ok {
		t.Fatal("a second PauseRun: ok")
	}
	h.run(graceTicks + 20)
	h.push("late", 960) // a streaming backend goes on
	h.run(5)
	const pause = graceTicks + 25 // ticks
	if n := len(h.rec.pkts); n != 10+pause {
		t.Fatalf("%d packets while paused, want the 10 before and one of silence per tick of the pause (%d)", n, pause)
	}
	for i, p := range h.rec.pkts[10:] {
		prev := h.rec.pkts[9+i]
		if p.data != "quiet" || p.marker || p.seq != prev.seq+1 || p.ts != prev.ts+960 || p.at != prev.at+1 {
			t.Fatalf("silence packet %+v after %+v: want one per tick, numbered and timed on", p, prev)
		}
	}
	want := []Event{{Type: EventStarted, ResponseID: "r1"}, {Type: EventPaused, PlayedMs: 200, ResponseID: "r1"}}
	if ev := h.events(); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events while paused %+v, want %+v (no stop)", ev, want)
	}
	pausedAt := h.n
	if played, ok := h.q.ResumeRun(); !ok || played != 200 {
		t.Fatalf("ResumeRun = %d, %v", played, ok)
	}
	h.run(11 + graceTicks + 1)
	rest := h.rec.pkts[10+pause:]
	if len(rest) != 11 || rest[0].data != "10" || rest[10].data != "late" {
		t.Fatalf("after the resume: %+v, want 10..19 and late", rest)
	}
	last := h.rec.pkts[10+pause-1] // the pause's last silence
	if p := rest[0]; p.marker || p.seq != last.seq+1 || p.at != pausedAt || p.ts != last.ts+960 {
		t.Fatalf("the first packet after the resume %+v after %+v: want it straight after the silence, at the next tick", p, last)
	}
	want = []Event{{Type: EventResumed, PlayedMs: 200, ResponseID: "r1"}, {Type: EventMark, Name: "m15"}, {Type: EventStopped, PlayedMs: 420, ResponseID: "r1"}}
	if ev := h.events(); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events after the resume %+v, want %+v", ev, want)
	}
	// A clear of a paused run.
	for i := range 10 {
		h.push(fmt.Sprint("c", i), 960)
	}
	h.run(4)
	h.q.PauseRun()
	h.run(5)
	n := len(h.rec.pkts)
	if played := h.q.Clear(); played != 80 || h.q.RunPaused() {
		t.Fatalf("Clear of a paused run = %d ms, RunPaused %v; want 80, false", played, h.q.RunPaused())
	}
	h.run(5)
	if len(h.rec.pkts) != n {
		t.Fatalf("a clear of a paused run sent %d more packets", len(h.rec.pkts)-n)
	}
	if p := h.rec.pkts[n-1]; p.data != "quiet" {
		t.Fatalf("the paused run's last packet before the clear %+v, want its silence", p)
	}
	want = []Event{{Type: EventStarted, ResponseID: "r1"}, {Type: EventPaused, PlayedMs: 80, ResponseID: "r1"}, {Type: EventCleared, PlayedMs: 80, ResponseID: "r1"}}
	if ev := h.events(); !reflect.DeepEqual(ev, want) {
		t.Fatalf("events %+v, want %+v", ev, want)
	}
}

// TestPauseRunAllSent: a run whose audio has all been sent (within its
// grace) pauses too: audio a streaming backend sends meanwhile waits, and
// the run goes on when it resumes.
func TestPauseRunAllSent(t *testing.T) {
	h := newHarness(t, QueueConfig{})
	h.push("a", 960)
	h.run(2)
	if _, ok := h.q.PauseRun(); !ok {
		t.Fatal("PauseRun within the run's grace: not ok")
	}
	h.run(graceTicks * 3)
	h.push("b", 960)
	h.run(3)
	if len(h.rec.pkts) != 1 {
		t.Fatalf("%d packets while paused", len(h.rec.pkts))
	}
	h.q.ResumeRun()
	h.run(1 + graceTicks + 1)
	want := []Event{{Type: EventStarted}, {Type: EventPaused, PlayedMs: 20}, {Type: EventResumed, PlayedMs: 20}, {Type: EventStopped, PlayedMs: 40}}
	if ev := h.events(); !reflect.DeepEqual(ev, want) || len(h.rec.pkts) != 2 {
		t.Fatalf("events %+v, packets %+v; want %+v and b sent", ev, h.rec.pkts, want)
	}
}

// TestAudioEnd: AudioEnd is where the last audio sent ends on the pacing
// clock, tail packets not counted.
func TestAudioEnd(t *testing.T) {
	h := newHarness(t, QueueConfig{ClearTail: []byte("quiet")})
	for i := range 5 {
		h.push(fmt.Sprint(i), 960)
	}
	h.run(3)
	h.q.Clear()
	h.run(5)
	want := h.c.start.Add(1003 * Tick) // tick 1000, three packets
	if got := h.q.AudioEnd(); !got.Equal(want) {
		t.Fatalf("AudioEnd = %v after the clock's start, want %v", got.Sub(h.c.start), want.Sub(h.c.start))
	}
}
