package playout

import "testing"

// TestOnEvents: with QueueConfig.OnEvents the owner is called once per
// batch of new events, from where they were queued (a mark on an idle
// queue, a tick that starts and stops a run, a clear), and Notify stays
// silent; the events themselves are unchanged.
func TestOnEvents(t *testing.T) {
	calls := 0
	var h *harness
	h = newHarness(t, QueueConfig{OnEvents: func() {
		calls++
		if !h.q.mu.TryLock() {
			return // held, as documented: the callback must not call the queue
		}
		h.q.mu.Unlock()
		t.Error("OnEvents called without the queue's lock held")
	}})
	if err := h.q.PushMark("idle"); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("a mark on an idle queue: %d calls, want 1", calls)
	}
	h.push("a", TickSamples)
	h.run(1) // the run starts
	if calls != 2 {
		t.Fatalf("a run started: %d calls, want 2", calls)
	}
	h.run(2 + graceTicks) // drains, the run's grace, stops
	if calls != 3 {
		t.Fatalf("a run stopped: %d calls, want 3", calls)
	}
	h.q.Clear()
	if calls != 4 {
		t.Fatalf("a clear: %d calls, want 4", calls)
	}
	select {
	case <-h.q.Notify():
		t.Fatal("Notify fired although OnEvents is set")
	default:
	}
	var types []EventType
	for _, e := range h.events() {
		types = append(types, e.Type)
	}
	want := []EventType{EventMark, EventStarted, EventStopped, EventCleared}
	if len(types) != len(want) {
		t.Fatalf("events %v, want %v", types, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("events %v, want %v", types, want)
		}
	}
}
