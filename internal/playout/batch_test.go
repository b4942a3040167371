package playout_test

import (
	"sync"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/playout"
)

// logBatcher records Hold, Flush and the sends of its clock's sinks in
// one log.
type logBatcher struct {
	mu    sync.Mutex
	log   []string
	sends int
	done  chan struct{} // closed at the want-th send
	want  int
}

func (b *logBatcher) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, s)
	if s == "send" {
		if b.sends++; b.sends == b.want {
			close(b.done)
		}
	}
}

func (b *logBatcher) Hold()                      { b.add("hold") }
func (b *logBatcher) Flush()                     { b.add("flush") }
func (b *logBatcher) SendPacket(*playout.Packet) { b.add("send") }

// TestBatchedClockBracketsTicks: every packet a worker sends is sent
// between the Hold and the Flush of one of its rounds (a tick, or the
// start of runs), and every Hold is flushed.
func TestBatchedClockBracketsTicks(t *testing.T) {
	const queues, packets = 3, 4
	b := &logBatcher{done: make(chan struct{}), want: queues * packets}
	c, err := playout.NewClock(playout.ClockConfig{Workers: 1, Batcher: b})
	if err != nil {
		t.Fatal(err)
	}
	for range queues {
		q := c.NewQueue(b, playout.QueueConfig{})
		for range packets {
			if err := q.PushAudio([]byte{0xf8, 0xff, 0xfe}, playout.TickSamples); err != nil {
				t.Fatal(err)
			}
		}
	}
	<-b.done
	c.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	// How many rounds the sends took depends on timing (a worker that ran
	// late plays several ticks' turns in one round; the queues' first packets
	// may leave in one round or in three), so only the bracketing is
	// checked.
	held := false
	for i, e := range b.log {
		switch {
		case e == "hold" && !held:
			held = true
		case e == "flush" && held:
			held = false
		case e == "send" && held:
		default:
			t.Fatalf("event %d %q out of place (held %v): %q", i, e, held, b.log)
		}
	}
	if held {
		t.Fatalf("a Hold was never flushed: %q", b.log)
	}
}
