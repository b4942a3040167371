package transceiver

import (
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// This file is a session's idle timeout (turn detection's
// idle_timeout_ms, docs/bridge.md §4.8): after that long with neither the
// user talking nor the agent's reply playing, the backend gets
// input.timeout_triggered and the client OpenAI's
// input_audio_buffer.timeout_triggered, once per quiet stretch, so that
// an agent can re-prompt.
//
// The stretch begins at the latest of: turn detection switched on, the
// end of the user's last speech (its speech end, not the stop that came
// a silence window later), and the end of the agent's last reply audio as
// the edge sent it (playout.Queue.AudioEnd); a speech start or a reply's
// first packet ends it. A timer (time.AfterFunc) waits for it: no
// goroutine while it waits.

// idleWatch is the idle timeout's state. It is guarded by the media
// path's turnMu: the track goroutine (speech starts and stops), the event
// drain (a reply's start and end) and the timer's own goroutine all take
// it.
type idleWatch struct {
	timeout time.Duration // 0: off
	timer   *time.Timer
	gen     uint64    // the arming the timer is for: an older one's firing does nothing
	user    bool      // the user is talking
	agent   bool      // a reply is playing (a run is in progress)
	since   time.Time // when the quiet stretch began
	sinceMs int64     // the same on the input clock, ms
	fire    func(gen uint64)
	clock   func(time.Time) int64 // the input clock's position at a wall time (turns.clockNow)
}

// set switches the timeout to d (0: off), the stretch starting at now if
// nobody is sounding.
func (w *idleWatch) set(d time.Duration, now time.Time) {
	w.timeout = d
	w.since, w.sinceMs = now, 0
	if d > 0 {
		w.sinceMs = w.clock(now)
	}
	w.arm()
}

// userStarted: the user started talking; the stretch ends.
func (w *idleWatch) userStarted() {
	w.user = true
	w.arm()
}

// userStopped: the user's speech ended at end, endMs on the input clock.
func (w *idleWatch) userStopped(end time.Time, endMs int64) {
	w.user = false
	w.quiet(end, endMs)
}

// agentStarted: a reply started playing; the stretch ends.
func (w *idleWatch) agentStarted() {
	w.agent = true
	w.arm()
}

// agentStopped: the reply's audio ended at end. A clear with no reply
// playing changes nothing.
func (w *idleWatch) agentStopped(end time.Time) {
	if !w.agent {
		return
	}
	w.agent = false
	w.quiet(end, w.clock(end))
}

func (w *idleWatch) quiet(end time.Time, endMs int64) {
	if end.After(w.since) {
		w.since, w.sinceMs = end, endMs
	}
	w.arm()
}

// arm stops the timer and, when the timeout is on and nobody is
// sounding, starts it for the stretch that began at since.
func (w *idleWatch) arm() {
	w.gen++
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	if w.timeout <= 0 || w.user || w.agent || w.since.IsZero() {
		return
	}
	gen := w.gen
	w.timer = time.AfterFunc(time.Until(w.since.Add(w.timeout)), func() { w.fire(gen) })
}

// idleFired runs on the idle timer's goroutine: if its arming still
// stands, the stretch has lasted the timeout. The backend and the client
// are told, once: the next stretch begins with the next speech or reply.
// The positions are on the input clock: where the stretch began and
// where the clock is now (they differ by the timeout when the client's
// audio comes in real time). Nothing once the session is ending: the
// client has had, or is about to get, the end event, which is the last.
func (m *mediaPath) idleFired(gen uint64) {
	m.turnMu.Lock()
	defer m.turnMu.Unlock()
	w := &m.idle
	if gen != w.gen || w.timer == nil || m.ending() {
		return
	}
	w.gen++
	w.timer = nil
	end := m.turns.clockNow(time.Now())
	start := min(w.sinceMs, end)
	m.metrics.turns.WithLabelValues(turnTimeout).Inc()
	m.sendControl(bridge.Control{Type: bridge.TypeInputTimeoutTriggered, AudioMs: end})
	m.client.timeoutTriggered(start, end)
}
