// Package playout paces backend audio to clients: each session has a
// bounded output Queue of encoded packets, marks and response tags, and one
// shared Clock drains every session's queue at its real-time pace, one
// tick (20 ms, or 10 ms for 10 ms packets) at a time, however fast the
// backend filled it (docs/bridge.md §6).
//
// # Clock
//
// A Clock is a few worker goroutines (one per CPU by default), each
// owning a share of the queues (NewQueue deals them out in turn, so the
// steady-state sends spread evenly over the workers). A queue is on its
// worker only while it holds something or a playout run is in progress,
// and then has its turn every Tick. A worker sleeps until the next tick
// while it has queues playing (a timer on the tick grid): an idle session
// costs no timer and no wake-up, and an idle clock none at all. At each
// tick a worker walks its queues and sends what is due through each
// queue's Sink, so the sends of many sessions happen together on one
// goroutine, and a Batcher (ClockConfig.Batcher) can send them together (the
// transceiver's hop socket: one sendmmsg per batch). A push into an idle
// queue (or Resume) wakes the queue's worker, which sends the new run's
// first packet at once, in a round of its own (bracketed by the Batcher
// too). A queue's packets are all sent by its worker, in order; a Sink is
// called on one worker goroutine.
//
// # Timeline
//
// Positions on the timeline count 48 kHz samples (the RTP clock of Opus,
// RFC 7587 §4.1) from the clock's start; tick k starts at k×Tick. A
// queue keeps the timeline position where its next packet starts. A run
// from idle starts where the clock is when its worker is woken: its first
// packet's position is that moment (not a tick's), and it is sent then.
// At each turn, the packets that start before the queue's next turn are
// due, so packets of 10, 20 or 60 ms all leave at their real-time pace,
// and every later packet of the run that is queued in time leaves at the
// tick at or before its own position, up to one tick early, never after:
// a receiver that times the run from its first packet (WebRTC's NetEq)
// never sees it late, however the run's phase falls against the clock's.
// A packet that
// comes after its position (a backend streaming in real time delivers
// each frame at about its time, after the tick before it) leaves at the
// queue's first turn after it comes, and goes on from the run's timeline
// (timestamp and position) if it is at most JitterAllowance late, counted
// in the turns that found it missing. When the queue ran dry for longer
// within a run, the position jumps to the queue's current turn and the
// RTP timestamp jumps with it. Sequence
// numbers stay continuous (+1 per packet, across replies and clears),
// timestamps follow real time (RFC 3550 §5.1), and the first packet of
// each run, and the first after a gap within a run (longer than
// JitterAllowance, or before a new response), has the marker bit set (RFC
// 3551 §4.1: the first packet of a talkspurt).
//
// # Catch-up
//
// A backend that streams in real time and stalls sends what it owed in a
// bunch when it resumes; played at one packet per tick, the bunch would
// stay as added delay for the rest of the stream. So while a run is
// playing, its queue holds more than CatchUpTarget plus one tick, and the
// backend pushed about real time over the last PaceWindow (at least half
// of it, at most all of it plus CatchUpTarget, pushing since the window's
// start and within the last PaceRecent), each turn plays one more
// tick's worth than is due, without advancing the timeline: the backlog
// drains at twice real time down to the target. Sequence numbers and
// timestamps stay continuous and the caught-up packets count as played. A
// backend ahead of real time (a burst) or quiet is never caught up.
//
// # Runs, clear, marks
//
// A run starts when the first packet is sent from idle (EventStarted) and
// ends when the queue stayed empty for QueueConfig.RunGrace (default
// DefaultRunGrace, 200 ms) after its last audio ended (EventStopped, with
// the run's played milliseconds, the grace after that audio's end), when
// audio tagged with a new response id comes after a gap (EventStopped, then
// EventStarted for the new response), or at a Clear (EventCleared, no
// EventStopped). Audio that comes within the grace continues the run: a
// backend streaming in real time with jitter plays one run per reply, the
// gap in it is a gap in the timestamps. Played time counts the durations of the
// packets sent to the Sink, exactly; a packet is counted when the worker
// takes it, so the packets a worker took before a clear (one, or one per
// missed turn when it runs late) may still be sent after Clear returns.
//
// A mark comes back (EventMark) when the audio queued before it has
// played out on the timeline: at the queue's first turn at or after the
// position where that audio ends (its last packet's position plus its
// duration), never before, although that packet may have left up to a
// tick early; up to a tick after, since turns fall on the tick grid and a
// run's phase need not. A mark holds back no audio: the packets after it
// leave at their own turns. On an idle, empty queue a mark comes back at
// once. Clear first returns, as played, the marks whose audio had all
// been sent (it is counted in the played time and reaches the client),
// then the marks it dropped, with Cleared set, then its EventCleared.
//
// # Hold, pause
//
// Hold closes a gate at the queue's tail: what is pushed after it (a
// reply prepared for a turn not yet decided) waits, sent nothing and
// costing its worker nothing, while what was queued before it plays on;
// Release lets it play (at once, from an idle queue), Discard drops it
// (its marks come back Cleared) and keeps the gate closed. PauseRun stops
// a run where it is (speech over the reply that may prove a cough): it
// sends the clear tail's silence for as long as the pause lasts, keeps
// what is queued and pushed, and does not end; ResumeRun goes on from
// there, and a Clear ends it as always (EventPaused, EventResumed).
package playout

import (
	"errors"
	"time"
)

// Tick is the default clock period: one 20 ms packet per session per
// tick (ClockConfig.Tick may take TickShort instead).
const Tick = 20 * time.Millisecond

// TickSamples is Tick on the Opus RTP clock (48 kHz, RFC 7587 §4.1): one
// 20 ms packet.
const TickSamples = 960

// Errors returned by Queue methods.
var (
	// ErrFull: the item would take the queue past its cap
	// (QueueConfig.MaxQueued or MaxItems); it was not queued.
	ErrFull = errors.New("playout: output queue full")
	// ErrClosed: the queue was closed.
	ErrClosed = errors.New("playout: queue closed")
)

// Packet is one RTP packet's worth of audio handed to a Sink.
type Packet struct {
	// Seq is the RTP sequence number: +1 per packet of the queue, from a
	// random start.
	Seq uint16
	// Timestamp is the RTP timestamp at 48 kHz (RFC 7587 §4.1).
	Timestamp uint32
	// Marker is set on the first packet of a run and on the first after
	// a gap within a run (RFC 3551 §4.1: the start of a talkspurt).
	Marker bool
	// Payload is the encoded packet. It aliases the worker's buffer: valid
	// only during the SendPacket call.
	Payload []byte
}

// Sink receives a queue's packets, in order, on the goroutine of the
// clock worker the queue belongs to. SendPacket should not block: every
// queue of the worker waits for it.
type Sink interface {
	SendPacket(p *Packet)
}

// EventType says what an Event reports.
type EventType uint8

// Event types.
const (
	// EventStarted: a run started (its first packet was sent).
	EventStarted EventType = iota + 1
	// EventStopped: the run ended because the queue stayed empty for the
	// run's grace (QueueConfig.RunGrace), or because audio of a new
	// response came after a gap; PlayedMs is the whole run.
	EventStopped
	// EventCleared: Clear emptied the queue; PlayedMs is what the current
	// run had sent (0 when there was no run).
	EventCleared
	// EventMark: a mark's audio has played out on the timeline, or was
	// all sent before a clear (Cleared false); or a clear or a Discard
	// dropped it (Cleared true).
	EventMark
	// EventPaused: PauseRun paused the run; PlayedMs is what it had sent.
	EventPaused
	// EventResumed: ResumeRun resumed it; PlayedMs as for EventPaused.
	EventResumed
)

func (t EventType) String() string {
	switch t {
	case EventStarted:
		return "started"
	case EventStopped:
		return "stopped"
	case EventCleared:
		return "cleared"
	case EventMark:
		return "mark"
	case EventPaused:
		return "paused"
	case EventResumed:
		return "resumed"
	}
	return "unknown"
}

// Event is one playout event, delivered in order by Queue.Events.
type Event struct {
	Type EventType
	// PlayedMs is milliseconds of audio sent in the run (EventStopped,
	// EventCleared, EventPaused, EventResumed).
	PlayedMs int64
	// Name is the mark's name (EventMark).
	Name string
	// Cleared is set on an EventMark dropped by a clear.
	Cleared bool
	// ResponseID is the response id in force (set by PushResponse): for
	// EventStarted that of the run's first audio, for EventStopped and
	// EventCleared that of the last audio sent; for EventPaused and
	// EventResumed the latest. "" when none was set.
	ResponseID string
}
