package playout

import (
	"cmp"
	"math/rand/v2"
	"sync"
	"time"
)

// DefaultMaxQueued is the default cap on the audio a queue holds.
const DefaultMaxQueued = 60 * time.Second

// DefaultMaxItems is the default cap on the items (packets, marks,
// response tags) a queue holds.
const DefaultMaxItems = 8192

// DefaultRunGrace is the default QueueConfig.RunGrace: how long a run's
// queue may stay empty after its last audio before the run stops. A
// backend that streams in real time (a streaming TTS, an echo of the
// caller) delivers its frames with the jitter of its own scheduling and
// of its link (tens of milliseconds, more when a TCP segment of the
// bridge is retransmitted); ten ticks keep such a reply in one run, as
// OpenAI's Realtime WebRTC events bracket one response with one
// output_audio_buffer.started and .stopped, while the reply's end is
// still reported well within the pause before a turn change (about
// 200 ms in conversation).
const DefaultRunGrace = 200 * time.Millisecond

// QueueConfig configures a Queue. The zero value takes the defaults.
type QueueConfig struct {
	// MaxQueued caps the audio waiting in the queue (not yet sent), to
	// the 48 kHz sample. Default DefaultMaxQueued.
	MaxQueued time.Duration
	// MaxItems caps the packets, marks and response tags waiting in the
	// queue. Default DefaultMaxItems.
	MaxItems int
	// RunGrace is how long the queue may stay empty after a run's last
	// audio ended before the run stops (EventStopped): audio that comes
	// within it continues the run after a gap (its first packet carries
	// the marker bit, its timestamp follows the time that passed), so a
	// backend streaming in real time with jitter plays one run per reply.
	// EventStopped thus comes RunGrace after the reply's audio ended.
	// Audio tagged with a new response id (PushResponse) that comes after
	// a gap starts a new run at once. Rounded up to whole ticks; at least
	// one tick. Default DefaultRunGrace.
	RunGrace time.Duration
	// OnUnderrun, if set, is called on the clock's worker goroutine, with
	// no lock held, when the queue has run empty during a run and stayed
	// empty past its audio's end for longer than JitterAllowance (the
	// second turn after it, at the 20 ms tick; whatever RunGrace), so not
	// between the frames of a backend streaming in real time: the owner
	// may push the last, partial frame of a reply now (padded), and it is
	// sent in the same turn. Called at most once per underrun.
	OnUnderrun func()
	// ClearTail, if set, is one 20 ms packet of silence (Opus) that a
	// Clear which cuts a run sends ClearTailTicks times, one every 20 ms
	// from the queue's next turn, continuing its RTP numbering, outside
	// any run (no events, not counted in played_ms). Audio pushed
	// meanwhile ends the tail and plays at the queue's next turn, as a
	// new run. A receiver whose jitter buffer runs dry conceals the
	// missing audio (Opus PLC, WebRTC NetEq's expand) and keeps sounding
	// the reply for a while; a few packets of real silence end the
	// talkspurt at once. The payload is not copied.
	ClearTail []byte
	// ClearTailTicks is how many ClearTail packets a clear sends
	// (default 3: 60 ms).
	ClearTailTicks int
	// Paused makes the queue hold its audio, sending nothing, until
	// Resume: for a session whose client is not connected yet.
	Paused bool
	// OnEvents, if set, is called each time new events are queued,
	// instead of a send on Notify's channel: the owner then needs no
	// goroutine waiting for events. It runs on the goroutine that queued
	// them (the clock's worker, or a caller of Clear or PushMark) with the
	// queue's lock held, so it must return at once and must not call the
	// queue: start or wake whatever calls Events.
	OnEvents func()
}

type itemKind uint8

const (
	itemAudio itemKind = iota
	itemMark
	itemResponse
)

// item is one queue entry. Audio payloads live in the queue's arena at
// [off, off+n).
type item struct {
	kind itemKind
	off  int
	n    int
	dur  int    // audio: duration at 48 kHz
	text string // mark name or response id
}

// pendingMark is a mark whose audio has been sent and plays out at end
// (a timeline position, 48 kHz samples).
type pendingMark struct {
	name string
	end  int64
}

// Queue is one session's output queue, drained by a Clock. All methods
// are safe for concurrent use.
type Queue struct {
	// Set once.
	w          *worker
	sink       Sink
	onUnderrun func()
	onEvents   func()
	maxQueued  int64 // 48 kHz samples
	maxItems   int
	period     int64 // the clock's tick, 48 kHz samples: a turn at now stands for [now, now+period)
	grace      int64 // RunGrace, 48 kHz samples, whole ticks
	notify     chan struct{}

	mu        sync.Mutex
	items     []item // guarded by mu; items[head:] are waiting
	head      int
	arena     []byte // guarded by mu
	queued    int64  // guarded by mu: audio waiting, 48 kHz samples
	scheduled bool   // guarded by mu: on its worker (playing, or starting)
	closed    bool
	paused    bool   // hold everything until Resume
	running   bool   // a run is in progress
	tl        int64  // timeline position (48 kHz samples) where the next packet starts
	seq       uint16 // next packet's RTP fields
	ts        uint32
	played    int64  // samples sent in the current run
	respID    string // the latest response tag
	sentResp  string // respID when the run's last packet was sent
	underrun  bool   // OnUnderrun was called for the current underrun
	// late counts the turns, at or after the next packet's position,
	// that found the running queue without it: how late it comes.
	late   int64
	events []Event
	// marks are the marks whose audio has all been sent but has not yet
	// played out on the timeline (a run's packets leave up to a tick
	// early), in order, each with the position where its audio ends.
	marks []pendingMark
	// The clear tail (QueueConfig.ClearTail): set once; tailLeft, guarded
	// by mu, is how many packets of it are still to send.
	tail      []byte
	tailTicks int
	tailLeft  int
	inflow    int64      // audio pushed since the worker last looked, 48 kHz samples
	pace      paceWindow // the backend's pushes over the last PaceWindow
	// The gate (Hold): while holding, items[gate:] are held, not played.
	holding bool
	gate    int
	// sentEnd is the timeline position where the last audio sent ends.
	sentEnd int64
	// suspended: the run is paused (PauseRun): nothing of it is sent, and
	// it does not end, until ResumeRun or a Clear.
	suspended bool

	// Owned by the queue's worker goroutine.
	next int64 // the tick number of the queue's next turn
}

// NewQueue returns an empty queue drained by c that sends to sink.
func (c *Clock) NewQueue(sink Sink, cfg QueueConfig) *Queue {
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.MaxItems <= 0 {
		cfg.MaxItems = DefaultMaxItems
	}
	if cfg.RunGrace <= 0 {
		cfg.RunGrace = DefaultRunGrace
	}
	w := c.workers[int(c.next.Add(1))%len(c.workers)]
	ticks := int64((cfg.RunGrace + c.period - 1) / c.period)
	return &Queue{
		w:          w,
		sink:       sink,
		onUnderrun: cfg.OnUnderrun,
		onEvents:   cfg.OnEvents,
		maxQueued:  durSamples(cfg.MaxQueued),
		maxItems:   cfg.MaxItems,
		period:     c.samples,
		grace:      ticks * c.samples,
		notify:     make(chan struct{}, 1),
		paused:     cfg.Paused,
		seq:        uint16(rand.Uint32()),
		ts:         rand.Uint32(),
		tail:       cfg.ClearTail,
		tailTicks:  cmp.Or(max(cfg.ClearTailTicks, 0), 3),
	}
}

// PushAudio queues one encoded packet of dur samples at 48 kHz (960 for
// 20 ms). The payload is copied. Into an idle queue (no run, no clear
// tail) that is not paused it starts a run: the worker is woken and sends
// the packet at once; otherwise it plays at the queue's turn. It returns
// ErrFull, queueing nothing, when the queue is at its cap, and ErrClosed
// after Close.
func (q *Queue) PushAudio(payload []byte, dur int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.admit(int64(dur)); err != nil {
		return err
	}
	q.items = append(q.items, item{kind: itemAudio, off: len(q.arena), n: len(payload), dur: dur})
	q.arena = append(q.arena, payload...)
	q.queued += int64(dur)
	q.inflow += int64(dur)
	if !q.holding {
		q.schedule()
	}
	return nil
}

// PushMark queues a mark. On an idle, empty queue it comes back at once
// (an EventMark); otherwise when the audio queued before it has played
// out: at the queue's first turn at or after the moment that audio's end
// reaches on the timeline (never before; up to a tick after, as turns
// fall on the tick grid), or at a Clear that comes first.
func (q *Queue) PushMark(name string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.admit(0); err != nil {
		return err
	}
	if !q.running && q.head == len(q.items) && !q.holding {
		q.events = append(q.events, Event{Type: EventMark, Name: name})
		q.signal()
		return nil
	}
	q.items = append(q.items, item{kind: itemMark, text: name})
	if !q.holding {
		q.schedule()
	}
	return nil
}

// PushResponse tags the audio queued after it with a response id, which
// the events report (Event.ResponseID). Audio with a new id that starts
// after a gap in the run (the run's grace, QueueConfig.RunGrace) ends the
// run and starts another: one run per response.
func (q *Queue) PushResponse(id string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.admit(0); err != nil {
		return err
	}
	if !q.running && q.head == len(q.items) && !q.holding {
		q.respID = id
		return nil
	}
	q.items = append(q.items, item{kind: itemResponse, text: id})
	if !q.holding {
		q.schedule()
	}
	return nil
}

// Clear drops everything queued, at once, and ends the current run. It
// returns the milliseconds of the run sent to the Sink before the clear
// (0 when there was no run), and queues, in order, the marks whose audio
// had all been sent (as played: that audio is counted in playedMs and
// reaches the client), then the marks it drops (Cleared set), then an
// EventCleared. This is the one way to interrupt playout: the
// backend's output.clear, the client's output_audio_buffer.clear and,
// later, barge-in on detected speech all call it.
func (q *Queue) Clear() (playedMs int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running {
		playedMs = q.played * 1000 / 48000
	}
	// Marks whose audio has been sent in full: it is in played_ms and on
	// its way to the client, so they come back as played.
	for _, m := range q.marks {
		q.events = append(q.events, Event{Type: EventMark, Name: m.name})
	}
	clear(q.marks)
	q.marks = q.marks[:0]
	// So are the marks at the head of the queue, ahead of any audio not
	// sent yet: the turn that sent their audio stopped before them (the
	// timeline had not reached the turn's tick). A mark only stands
	// behind unsent audio if it was pushed after that audio.
	// Held items (Hold) are not: they were never to play before the gate.
	rest := q.items[q.head:]
	for played := q.items[q.head:q.playEnd()]; len(played) > 0 && played[0].kind != itemAudio; played = played[1:] {
		if played[0].kind == itemMark {
			q.events = append(q.events, Event{Type: EventMark, Name: played[0].text})
		}
		rest = rest[1:]
	}
	for _, it := range rest {
		if it.kind == itemMark {
			q.events = append(q.events, Event{Type: EventMark, Name: it.text, Cleared: true})
		}
	}
	q.events = append(q.events, Event{Type: EventCleared, PlayedMs: playedMs, ResponseID: q.respID})
	if q.running && q.tail != nil && !q.suspended {
		q.tailLeft = q.tailTicks // a paused run sent its tail when it paused
		q.schedule()
	}
	q.reset()
	q.running, q.played, q.respID, q.sentResp, q.underrun, q.suspended = false, 0, "", "", false, false
	q.signal()
	return playedMs
}

// Hold closes a gate at the queue's tail: audio, marks and response tags
// pushed from now on are held behind it, not played (a reply prepared
// for a turn that is not yet decided), while what was queued before it
// plays on. Release lets them play; Discard drops them. Idempotent.
func (q *Queue) Hold() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.holding {
		q.holding, q.gate = true, len(q.items)
	}
}

// Holding reports whether the gate is closed (Hold).
func (q *Queue) Holding() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.holding
}

// Release opens the gate: what was held plays after what is before it, at
// once from an idle queue (a run from idle). It returns the held audio's
// duration, ms (0 when nothing was held, or no gate).
func (q *Queue) Release() (heldMs int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.holding {
		return 0
	}
	held := q.heldSamples()
	q.holding = false
	if q.head < len(q.items) {
		q.schedule()
	}
	return held * 1000 / 48000
}

// Discard drops what is held behind the gate, which stays closed: what
// is pushed next is held too. Marks it drops come back at once, in order,
// with Cleared set. It returns the dropped audio's duration, ms (0 when
// nothing was held, or no gate).
func (q *Queue) Discard() (discardedMs int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.holding {
		return 0
	}
	held := q.heldSamples()
	arenaEnd := -1
	for _, it := range q.items[q.gate:] {
		switch it.kind {
		case itemMark:
			q.events = append(q.events, Event{Type: EventMark, Name: it.text, Cleared: true})
		case itemAudio:
			if arenaEnd < 0 {
				arenaEnd = it.off // payloads lie in queue order
			}
		}
	}
	if arenaEnd >= 0 {
		q.arena = q.arena[:arenaEnd]
	}
	clear(q.items[q.gate:])
	q.items = q.items[:q.gate]
	q.queued -= held
	if len(q.events) > 0 {
		q.signal()
	}
	return held * 1000 / 48000
}

// heldSamples is the audio behind the gate, 48 kHz samples. mu held,
// holding.
func (q *Queue) heldSamples() int64 {
	var n int64
	for _, it := range q.items[q.gate:] {
		if it.kind == itemAudio {
			n += int64(it.dur)
		}
	}
	return n
}

// playEnd is the end of the items that may play: the gate, while
// holding. mu held.
func (q *Queue) playEnd() int {
	if q.holding {
		return q.gate
	}
	return len(q.items)
}

// PauseRun pauses playout: from the queue's next turn no audio is sent,
// what is queued and what is pushed meanwhile waits, and the run does not
// end, until ResumeRun (or a Clear, which ends it as always). A run that
// was sending fills the pause with the clear tail's silence
// (QueueConfig.ClearTail), a packet every 20 ms on the run's timeline for
// as long as it lasts: the client's decoder plays silence rather than
// concealing the reply, and its jitter buffer sees no gap (WebRTC's NetEq
// takes a gap in a stream, then a talkspurt, as delay to allow for).
// It queues EventPaused with the run's played time, and returns it; ok is
// false, and nothing changes, when no run is in progress or starting (an
// idle queue, or only held audio) or the run is already paused.
func (q *Queue) PauseRun() (playedMs int64, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.suspended || (!q.running && q.head == q.playEnd()) {
		return 0, false
	}
	q.suspended = true
	if q.running {
		playedMs = q.played * 1000 / 48000
	}
	q.events = append(q.events, Event{Type: EventPaused, PlayedMs: playedMs, ResponseID: q.respID})
	q.signal()
	return playedMs, true
}

// ResumeRun resumes a run paused by PauseRun where it paused: its next
// packet leaves at the queue's next turn, after the pause's silence (with
// no ClearTail: after a gap, the marker bit set and its timestamp
// following the time that passed). It queues EventResumed
// with the run's played time and returns it; ok is false when the run is
// not paused.
func (q *Queue) ResumeRun() (playedMs int64, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.suspended {
		return 0, false
	}
	q.suspended, q.tailLeft = false, 0
	if q.running {
		playedMs = q.played * 1000 / 48000
	}
	q.events = append(q.events, Event{Type: EventResumed, PlayedMs: playedMs, ResponseID: q.respID})
	if q.running || q.head < q.playEnd() {
		q.schedule()
	}
	q.signal()
	return playedMs, true
}

// RunPaused reports whether the run is paused (PauseRun).
func (q *Queue) RunPaused() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.suspended
}

// AudioEnd returns when the audio the queue sent last ends on the pacing
// clock: the moment its last packet was due plus that packet's duration
// (the client hears it later, by its path and jitter buffer). After an
// EventStopped or EventCleared, that is the end of the run's audio;
// before the queue sent anything, the clock's start.
func (q *Queue) AudioEnd() time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	tl := q.sentEnd
	return q.w.c.start.Add(time.Duration(tl/48000)*time.Second + time.Duration(tl%48000)*time.Second/48000)
}

// Resume starts playing a queue made with QueueConfig.Paused: what was
// queued meanwhile starts at once, as a run from idle does. Idempotent.
func (q *Queue) Resume() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.paused = false
	if q.head < q.playEnd() {
		q.schedule()
	}
}

// Idle reports whether nothing is queued (held audio included) and no run
// is in progress (a run whose queue has run dry is in progress until its
// RunGrace is over).
func (q *Queue) Idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.running && q.head == len(q.items)
}

// Playing reports whether a run is in progress (paused or not) or audio
// that may play is queued: audio held behind the gate (Hold) does not
// count.
func (q *Queue) Playing() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running || q.head < q.playEnd()
}

// Queued returns the audio waiting in the queue.
func (q *Queue) Queued() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	return time.Duration(q.queued/48000)*time.Second + time.Duration(q.queued%48000)*time.Second/48000
}

// Fits reports whether n more packets totalling dur samples (48 kHz) fit
// under both caps now.
func (q *Queue) Fits(n, dur int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.closed && q.queued+int64(dur) <= q.maxQueued && len(q.items)-q.head+n <= q.maxItems
}

// Notify returns a channel that receives (without blocking the sender,
// capacity 1) after new events were queued: call Events then. With
// QueueConfig.OnEvents set, nothing is ever sent on it.
func (q *Queue) Notify() <-chan struct{} { return q.notify }

// Events appends the events queued since the last call to dst, in order,
// and returns it.
func (q *Queue) Events(dst []Event) []Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = append(dst, q.events...)
	clear(q.events)
	q.events = q.events[:0]
	return dst
}

// Close drops everything queued and takes the queue off the clock; later
// pushes return ErrClosed. Idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.reset()
	q.marks = nil
}

// admit checks the caps for an item of dur samples. mu held.
func (q *Queue) admit(dur int64) error {
	switch {
	case q.closed:
		return ErrClosed
	case q.queued+dur > q.maxQueued || len(q.items)-q.head >= q.maxItems:
		return ErrFull
	}
	return nil
}

// schedule hands the queue to its worker, which plays what is due at
// once and then at each tick; a paused queue waits
// for Resume. mu held.
func (q *Queue) schedule() {
	if !q.scheduled && !q.paused {
		q.scheduled = true
		q.w.add(q)
	}
}

// position returns where a run starting at at (48 kHz samples since the
// clock's start) starts on the queue's timeline: at, or later if the
// audio sent before a clear still covers at. Called by the worker before
// the queue's first turn.
func (q *Queue) position(at int64) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return max(at, q.tl)
}

// signal tells the owner that events are queued. mu held.
func (q *Queue) signal() {
	if q.onEvents != nil {
		q.onEvents()
		return
	}
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// Above these capacities an emptied queue gives its buffers back, so a
// session keeps no memory from its longest reply: a few seconds' worth of
// packets are kept for reuse.
const (
	keepArena = 64 << 10
	keepItems = 512
)

// reset empties the items and the arena. mu held.
func (q *Queue) reset() {
	clear(q.items[q.head:]) // drop the strings
	q.items, q.head, q.arena, q.queued, q.gate = q.items[:0], 0, q.arena[:0], 0, 0
	if cap(q.arena) > keepArena {
		q.arena = nil
	}
	if cap(q.items) > keepItems {
		q.items = nil
	}
}

// compact moves the waiting items to the front once at least half of
// the item slice has been consumed, so a queue a backend keeps topped up
// does not grow. mu held.
func (q *Queue) compact() {
	if q.head < 64 || q.head < len(q.items)/2 {
		return
	}
	n := copy(q.items, q.items[q.head:])
	clear(q.items[n:])
	if q.holding {
		q.gate -= q.head
	}
	q.items, q.head = q.items[:n], 0
	// Audio offsets increase along the queue; marks and tags carry no
	// bytes. Move the bytes from the first waiting payload on.
	shift := len(q.arena)
	for _, it := range q.items {
		if it.kind == itemAudio {
			shift = it.off
			break
		}
	}
	m := copy(q.arena, q.arena[shift:])
	q.arena = q.arena[:m]
	for i := range q.items {
		if q.items[i].kind == itemAudio {
			q.items[i].off -= shift
		}
	}
}

// tick plays the queue's turns from first to now (timeline positions,
// 48 kHz samples; more than one turn when the worker ran late, a tick
// apart): it sends what is due before the turn after now, processes marks
// and tags whose audio has played, and ends the run when the queue stayed
// empty. Audio after a gap (nothing due since before first) starts at at
// (now, or later for a queue's first turn: the moment it became active).
// It reports whether the queue stays on its worker.
func (q *Queue) tick(now, first, at int64, w *worker) (keep bool) {
	events := q.take(now, first, at, w)
	if len(w.batch) == 0 && q.onUnderrun != nil && q.wantsTail() {
		q.onUnderrun()
		events = q.take(now, first, at, w) || events
	}
	for i := range w.batch {
		q.sink.SendPacket(&w.batch[i])
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	// The run's grace (RunGrace) after the last audio ended before the
	// run stops, so a backend streaming in real time with jitter does not
	// split its playout.
	if q.running && !q.suspended && len(w.batch) == 0 && q.head == q.playEnd() && now+q.period > q.tl+q.grace {
		q.stop()
		events = true
	}
	if events {
		q.signal()
	}
	if q.closed || (!q.running && q.head == q.playEnd() && q.tailLeft == 0 && len(q.marks) == 0) {
		q.scheduled = false
		return false
	}
	return true
}

// stop ends the run: EventStopped with what it sent. mu held.
func (q *Queue) stop() {
	q.running = false
	q.events = append(q.events, Event{Type: EventStopped, PlayedMs: q.played * 1000 / 48000, ResponseID: q.sentResp})
	q.played, q.underrun = 0, false
}

// wantsTail reports, and records, that the run has run dry and stayed dry
// past its audio's end for longer than JitterAllowance (the audio that
// came next would start a talkspurt after a gap): the owner's OnUnderrun
// is due.
func (q *Queue) wantsTail() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.running || q.suspended || q.head != q.playEnd() || q.underrun || q.late*q.period <= jitterSamples {
		return false
	}
	q.underrun = true
	return true
}

// take moves the packets due before the queue's next turn (a tick after
// now) into w.batch (payloads copied into w.buf), and queues the events
// that come due. first is the earliest turn being played (now, unless the
// worker ran late); audio after a gap starts at at. It reports whether it
// queued events.
func (q *Queue) take(now, first, at int64, w *worker) (events bool) {
	w.batch, w.buf = w.batch[:0], w.buf[:0]
	q.mu.Lock()
	defer q.mu.Unlock()
	nev := len(q.events)
	q.pace.add(now/paceSlot, q.inflow)
	q.inflow = 0
	q.playedMarks(now)
	if q.paused {
		return false
	}
	// Catch-up (docs/bridge.md §6.1): a run whose backlog is over the
	// target while the backend streams at about real time plays one more
	// tick's worth now; those packets do not advance the timeline.
	due := now + q.period
	if q.running && q.tl >= first && q.queued > CatchUpTarget+q.period && q.pace.realTime() {
		due += q.period
	}
	var extra int64
	for end := q.playEnd(); q.head < end && !q.closed && !q.suspended; {
		it := &q.items[q.head]
		if it.kind != itemAudio {
			if q.tl >= now+q.period {
				break // the audio before it ends after this turn's tick
			}
			if it.kind == itemMark {
				// Its audio is all sent, but a run's packets leave up
				// to a tick early: it has played when the timeline
				// reaches its end.
				if len(q.marks) == 0 && q.tl <= now {
					q.events = append(q.events, Event{Type: EventMark, Name: it.text})
				} else {
					q.marks = append(q.marks, pendingMark{it.text, q.tl})
				}
			} else {
				q.respID = it.text
			}
			it.text = ""
			q.head++
			continue
		}
		if q.tl >= due {
			break // not due in this tick
		}
		if q.tl >= now+q.period {
			extra += int64(it.dur) // due only for the catch-up
		}
		marker := false
		// Due at an earlier turn that found the queue without it: a
		// gap, unless the run goes on and it is the same response, at
		// most JitterAllowance late (a backend streaming in real time:
		// the run's first packet left at once, so the later ones come
		// at its phase, off the grid, with the backend's jitter).
		newResponse := q.running && q.respID != q.sentResp
		if q.tl < first && (!q.running || newResponse || q.late*q.period > jitterSamples) {
			// Follow real time.
			q.ts += uint32(at - q.tl)
			q.tl = at
			marker = true // a talkspurt after a gap, RFC 3551 §4.1
			if newResponse {
				// A new response after a gap: the run of the one
				// before it has ended.
				q.stop()
			}
		}
		if !q.running {
			q.running, q.played, marker = true, 0, true
			q.tailLeft = 0
			q.events = append(q.events, Event{Type: EventStarted, ResponseID: q.respID})
		}
		start := len(w.buf)
		w.buf = append(w.buf, q.arena[it.off:it.off+it.n]...)
		w.batch = append(w.batch, Packet{Seq: q.seq, Timestamp: q.ts, Marker: marker})
		w.batch[len(w.batch)-1].Payload = w.buf[start:len(w.buf):len(w.buf)]
		q.seq++
		q.ts += uint32(it.dur)
		q.tl += int64(it.dur)
		q.played += int64(it.dur)
		q.sentResp = q.respID
		q.queued -= int64(it.dur)
		q.underrun = false
		q.late = 0
		q.head++
	}
	if q.running && len(w.batch) == 0 && q.tl <= now {
		q.late++ // its next packet is due and not there
	}
	if extra > 0 {
		q.tl -= extra
		w.c.caughtUp.Add(uint64(extra))
	}
	if len(w.batch) > 0 {
		q.sentEnd = q.tl
	}
	// A paused run fills its pause with silence, for as long as it lasts.
	fill := q.suspended && q.running && q.tail != nil
	if (fill || q.tailLeft > 0 && q.head == q.playEnd() && !q.running) && q.tl < now+q.period && !q.closed {
		// The clear tail: silence where the cut reply was, on its
		// timeline (or where a paused run stopped).
		if q.tl < first {
			q.ts += uint32(at - q.tl)
			q.tl = at
		}
		start := len(w.buf)
		w.buf = append(w.buf, q.tail...)
		w.batch = append(w.batch, Packet{Seq: q.seq, Timestamp: q.ts})
		w.batch[len(w.batch)-1].Payload = w.buf[start:len(w.buf):len(w.buf)]
		q.seq++
		q.ts += tailSamples
		q.tl += tailSamples
		if !fill {
			q.tailLeft--
		}
	}
	if q.head == len(q.items) {
		q.reset()
	} else {
		q.compact()
	}
	return len(q.events) > nev
}

// playedMarks queues the EventMark of each pending mark whose audio has
// played out by now (a timeline position). mu held.
func (q *Queue) playedMarks(now int64) {
	n := 0
	for n < len(q.marks) && q.marks[n].end <= now {
		q.events = append(q.events, Event{Type: EventMark, Name: q.marks[n].name})
		n++
	}
	if n > 0 {
		k := copy(q.marks, q.marks[n:])
		clear(q.marks[k:])
		q.marks = q.marks[:k]
	}
}

// JitterAllowance is how late, at most, the next packet of a run may come
// and still continue the run's timestamps, without the marker bit: a
// backend streaming in real time (a streaming TTS, an echo) delivers each
// frame at about its time, with the jitter of its scheduling and its
// link, while the run's first packet left at once, at the phase of its
// arrival, off the tick grid. It is counted in the queue's turns that
// found the packet due and missing (at least one tick, two at the 10 ms
// tick), so a frame may come up to between one and two ticks after its
// time, whatever the run's phase. Later than that, the audio is a
// talkspurt after a gap (its timestamp follows the time that passed,
// marker bit set), as is a new response's audio after any wait.
const JitterAllowance = 20 * time.Millisecond

// jitterSamples is JitterAllowance at 48 kHz.
const jitterSamples = int64(JitterAllowance / time.Millisecond * 48)

// CatchUpTarget is the backlog (48 kHz samples, 60 ms) a queue keeps
// while its backend streams at about real time: above it, playout catches
// up (docs/bridge.md §6.1).
const CatchUpTarget = 3 * TickSamples

// tailSamples is the duration of a ClearTail packet (20 ms), 48 kHz
// samples: it follows the one before it on the timeline, whatever the
// clock's tick.
const tailSamples = TickSamples

// PaceWindow is how far back a queue looks to tell whether its backend
// streams at about real time: it pushed between half of PaceWindow and
// PaceWindow plus CatchUpTarget of audio in the last PaceWindow, and
// within the last PaceRecent. Twice the longest stall whose backlog is
// caught up without a pause.
const PaceWindow = 2 * time.Second

// PaceRecent is how recently a backend that streams at about real time
// last pushed audio: the window's pushes are then its stream, not the
// tail of a burst (a reply sent ahead of real time, its pushes spread
// over a few ticks by the encoder) sliding out of the window, whose
// sum passes through the real-time range on the way to zero. Ten ticks
// of a backend's jitter.
const PaceRecent = 200 * time.Millisecond

const paceRecentTicks = int64(PaceRecent / Tick)

// paceSlot is the time one slot of a paceWindow covers, 48 kHz samples
// (20 ms, whatever the clock's tick).
const paceSlot = TickSamples

const paceTicks = int64(PaceWindow / Tick)

// paceWindow is the audio pushed in each of the last paceTicks slots of
// paceSlot (a ring indexed by slot number: the timeline position over
// paceSlot) and their sum, in 48 kHz samples.
type paceWindow struct {
	slots [paceTicks]int64
	last  int64 // the latest tick recorded
	since int64 // the tick of the first push after the window was empty
	fresh int64 // the tick of the latest push
	sum   int64
}

// add records samples pushed by slot n (n never decreases).
func (p *paceWindow) add(n, samples int64) {
	if n > p.last {
		if n-p.last >= paceTicks {
			clear(p.slots[:])
			p.sum = 0
		} else {
			for t := p.last + 1; t <= n; t++ {
				i := t % paceTicks
				p.sum -= p.slots[i]
				p.slots[i] = 0
			}
		}
		p.last = n
	}
	if samples > 0 {
		if p.sum == 0 {
			p.since = n
		}
		p.fresh = p.last
	}
	p.slots[p.last%paceTicks] += samples
	p.sum += samples
}

// realTime reports whether the pushes of the window were about real time:
// neither a backend that is silent or stalled (less than half of it) nor
// one sending ahead (a burst, a faster-than-real-time TTS). The pushes
// must span the whole window: a reply of up to PaceWindow sent in one
// burst into an idle queue would otherwise look like real time; and
// reach its present (PaceRecent): the last part of a longer burst would
// otherwise look like real time while it leaves the window.
func (p *paceWindow) realTime() bool {
	const window = paceTicks * TickSamples
	return p.last-p.since >= paceTicks-1 && p.last-p.fresh <= paceRecentTicks &&
		p.sum >= window/2 && p.sum <= window+CatchUpTarget
}
