package bridge_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// overConnLimit returns the load both connection budget tests queue:
// sessions sessions that each send frames frames of payload, 3.75 MiB a
// session (under SessionQueueLimit) and, all together, past
// ConnQueueLimit.
func overConnLimit(t *testing.T) (sessions, frames int, payload []byte) {
	t.Helper()
	const frame = 64 << 10
	sessions, frames = 10, (bridge.SessionQueueLimit-256<<10)/frame // 3.75 MiB per session
	if sessions*frames*frame <= bridge.ConnQueueLimit {
		t.Fatal("the test does not pass the connection limit")
	}
	return sessions, frames, make([]byte, frame)
}

// budgetCtx bounds a connection budget test. overConnLimit's 37.5 MiB
// go through masked WebSocket frames under the race detector, which
// spends most of its time in the race runtime: 2–4.5 s on a 2-core
// machine already at load 3.5, 8–13 s with three busy loops added, so
// testCtx's 20 s was within reach of a loaded CI machine. Two minutes
// only ends a hang.
func budgetCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// dialOneConn dials the sessions ids on p before any of them sends, and
// checks that they share one connection. Dialing each just before its
// sends would leave the pool's pick to timing: a connection whose batch
// write has been in flight for a second (the previous session's last
// 64 KiB frame, on a starved machine) gets no new session, and a second
// connection would split the load under ConnQueueLimit.
func dialOneConn(t *testing.T, p *bridge.Pool, ids ...string) []*bridge.Conn {
	t.Helper()
	cs := make([]*bridge.Conn, len(ids))
	for i, id := range ids {
		cs[i] = poolDial(t, p, id)
	}
	if n := p.Conns(); n != 1 {
		t.Fatalf("%d sessions on %d connections, want 1", len(ids), n)
	}
	return cs
}

// sessionIDs returns the ids s0 … s(n−1).
func sessionIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("s", i)
	}
	return ids
}

// TestV2EndedSessionsLeaveBudget: what is queued for a session that has
// ended no longer counts against its connection's ConnQueueLimit. Ten
// sessions in turn each queue 3.75 MiB at a backend handler that never
// reads, then end; 37.5 MiB in all, but never more than one session's
// worth for a live session. Before the fix the ended sessions' bytes
// stayed in the connection's count (the handlers never read them, and
// shed cannot end a session that has left the table), so the tenth
// session, live and within its own limit, was ended with 4003
// (queue_full).
func TestV2EndedSessionsLeaveBudget(t *testing.T) {
	stats := new(bridge.MuxStats)
	stop := make(chan struct{})
	holderDone := make(chan string, 1)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = bridge.Serve(w, r, bridge.AcceptOptions{Stats: stats}, func(sc *bridge.ServerConn) {
			if sc.Session().SessionID != "holder" {
				<-stop // never reads
				return
			}
			// The holder reads until the transceiver's last event, which
			// comes after every other session's records.
			for {
				m, err := sc.Recv(context.Background())
				if err != nil {
					holderDone <- err.Error()
					return
				}
				if m.Event != nil {
					holderDone <- string(m.Event)
					return
				}
			}
		})
	}))
	t.Cleanup(func() { close(stop) })
	p := newPool(t, url, 0)
	ctx := budgetCtx(t)
	sessions, frames, payload := overConnLimit(t)
	// The holder keeps the connection open while the others end in turn.
	cs := dialOneConn(t, p, append([]string{"holder"}, sessionIDs(sessions)...)...)
	holder := cs[0]
	for i, c := range cs[1:] {
		for j := range frames {
			if err := c.SendAudio(ctx, bridge.AudioFrame{Seq: uint16(j), Payload: payload}); err != nil {
				t.Fatalf("session %d frame %d: %v", i, j, err)
			}
		}
		if err := c.End(ctx, bridge.ReasonClientHangup); err != nil {
			t.Fatalf("session %d End: %v", i, err)
		}
	}
	if n := p.Conns(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	if err := holder.SendEvent(ctx, []byte("last")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-holderDone:
		if got != "last" {
			t.Fatalf("holder session: %s, want the event \"last\"", got)
		}
	case <-ctx.Done():
		t.Fatal("the holder's event did not arrive")
	}
	// The backend has dispatched every record before the holder's event.
	if n := stats.Drops(bridge.DropQueueFull); n != 0 {
		t.Errorf("queue_full = %d with at most %d MiB queued for live sessions, want 0", n, frames*len(payload)>>20)
	}
}
