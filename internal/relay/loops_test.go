package relay

import (
	"testing"
	"time"
)

// TestReadBackoff: consecutive read errors wait 1 ms, then twice as long
// each time up to maxReadBackoff; a run that lasts the limit gives up; a
// successful read starts over.
func TestReadBackoff(t *testing.T) {
	var b readBackoff
	t0 := time.Unix(1000, 0)
	now := t0
	var waits []time.Duration
	for {
		wait, giveUp := b.failed(now, 5*time.Second)
		if giveUp {
			break
		}
		waits = append(waits, wait)
		now = now.Add(wait)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000, 1000, 1000}
	if len(waits) != len(want) {
		t.Fatalf("waits %v, want %v ms", waits, want)
	}
	for i, w := range want {
		if waits[i] != w*time.Millisecond {
			t.Fatalf("wait %d is %v, want %v ms (all: %v)", i, waits[i], w, waits)
		}
	}
	if got := now.Sub(t0); got < 5*time.Second {
		t.Errorf("gave up after %v of errors, want at least the 5s limit", got)
	}
	b.ok()
	if wait, giveUp := b.failed(now, 5*time.Second); giveUp || wait != time.Millisecond {
		t.Errorf("after a good read: wait %v, give up %v; want 1ms, false", wait, giveUp)
	}
}
