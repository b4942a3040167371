package transceiver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/rtp"

	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/playout"
	"github.com/switchboard-rtc/switchboard/internal/rtcpreport"
)

// This file is a session's media path between the client's Opus track and
// the backend bridge (docs/bridge.md §5, §6):
//
//	client RTP ─▶ fromClient ─▶ toBackend ─▶ (PCM formats: audio.Decoder) ─▶ bridge
//	bridge ─▶ playAudio ─▶ (PCM formats: audio.Encoder) ─▶ playout.Queue
//	shared playout.Clock ─▶ SendPacket ─▶ client RTP
//	playout events ─▶ drainEvents ─▶ output.* to the backend,
//	                                 output_audio_buffer.* to the client

// Reasons of switchboard_transceiver_backend_input_refused_total: backend
// input the transceiver refused or answered specially (docs/bridge.md §8.1).
const (
	refusedOddLength   = "pcm_odd_length"      // PCM frame with an odd byte count
	refusedInvalidOpus = "invalid_opus"        // Opus frame that is not an Opus packet
	refusedQueueFull   = "output_queue_full"   // audio or mark past the queue's cap
	refusedMarkName    = "invalid_mark_name"   // empty or overlong mark name
	refusedUnexpected  = "unexpected_type"     // a control type backends do not send
	refusedUnknown     = "unknown_type"        // a message type v1 does not know (ignored)
	refusedClearIdle   = "clear_idle"          // output.clear with nothing queued (answered played_ms 0)
	refusedResponseID  = "invalid_response_id" // overlong output.response id
	// turn_detection (hello or input.turn_detection) that does not
	// validate, or a detector that could not be made
	refusedTurnDetection = "invalid_turn_detection"
)

var refusedReasons = []string{refusedOddLength, refusedInvalidOpus, refusedQueueFull, refusedMarkName, refusedUnexpected, refusedUnknown, refusedClearIdle, refusedResponseID, refusedTurnDetection}

// bridgeCtx is the context of the media path's bridge calls (audio both
// ways, playout reports). It never ends, so the WebSocket library arms no
// context.AfterFunc per message (docs/bridge.md §10). The session's
// teardown unblocks them: when a send is stuck on a backend that does not
// read, bridge End aborts the session once its ctx ends (v1: closes the
// WebSocket; v2: wakes the session's blocked send), and a v2 connection
// whose batch write is stuck fails after bridge.DefaultWriteTimeout
// (TestCloseStalledV2Backend).
var bridgeCtx = context.Background()

// mediaPath is a session's audio between the client's track and the
// bridge: the decoder and the fan-out of client audio to the bridge and
// turn detection, the encoder and the paced output queue, the playout
// events' drain. Its methods run on four goroutines, each owning its part:
//
//   - the track goroutine (fromClient): toBackend, dec, decLast, turns
//     (but turns.next), and the turn reports;
//   - the bridge reader (fromBackend): playAudio, onControl, full;
//   - the playout clock's worker: SendPacket, rtpPkt, flushTail;
//   - the event drain, while it runs: drainEvents.
//
// Clears come from any of them and the oai-events reader. Locks, in the
// order they are taken: turnMu, encMu, the queue's own, evMu (kickEvents,
// which the queue calls with its lock held). encMu is never held across a
// bridge write; turnMu is, for the writes it orders: a barge-in's
// input.speech_started and the drain's playout reports.
type mediaPath struct {
	// Set once (newMediaPath).
	cfg      *Config
	be       *bridge.Conn
	peer     *peer.Session
	client   *clientEvents
	sent     rtcpreport.LocalStream // the output's RTCP sender state
	outSSRC  uint32
	metrics  *metrics
	probe    *delayProbe
	log      *slog.Logger
	ending   func() bool    // the session is ending: bridge errors are its teardown's
	dropped  *atomic.Uint64 // the session's messages not delivered to the client
	q        *playout.Queue
	dec      *audio.Decoder // nil for Opus passthrough
	frameDur int            // PCM: one encoded frame at 48 kHz (Config.Ptime: 960 or 480)
	frameLen int            // PCM: samples per encoded frame at the format's rate

	// encMu guards enc: the bridge reader encodes, the clock's worker
	// flushes a reply's last partial frame (OnUnderrun).
	encMu sync.Mutex
	enc   *audio.Encoder // nil for Opus passthrough

	full        atomic.Bool   // audio is being refused for the cap; one error per episode
	tailRefused chan struct{} // flushTail → drainEvents: a tail did not fit; capacity 1
	rtpPkt      rtp.Packet    // SendPacket's packet; only the clock worker touches it
	decLast     audio.DecoderStats

	turns turns // turn detection (turns.go)
	// turnMu orders a barge-in's input.speech_started before the
	// playout events its clear causes (speechStarted, drainEvents).
	turnMu sync.Mutex

	// The playout event drain (kickEvents).
	evPending atomic.Int32   // wake-ups not yet handled by a drain
	evMu      sync.Mutex     // orders starting a drain against stopEvents
	evDone    bool           // guarded by evMu: no drain starts after stopEvents
	evWG      sync.WaitGroup // the running drain
}

// opusSilence is one 20 ms Opus packet of silence, sent a few times after
// a clear cuts a reply (playout.QueueConfig.ClearTail), so the client's
// decoder plays silence instead of concealing the missing reply. Opus
// packets describe themselves (RFC 6716 §3.1), so one packet suits every
// session, whatever the backend's own Opus settings.
var opusSilence = sync.OnceValues(func() ([]byte, error) {
	enc, err := audio.NewEncoder(16000, 16000)
	if err != nil {
		return nil, err
	}
	pkts, err := enc.Write(make([]byte, 2*audio.FrameSamples(16000)))
	if err != nil {
		return nil, err
	}
	if len(pkts) != 1 {
		return nil, fmt.Errorf("encoding 20 ms of silence gave %d packets", len(pkts))
	}
	return bytes.Clone(pkts[0].Payload), nil
})

// ClearTailPacket returns the Opus payload of the silence packets a clear
// sends the client after cutting a reply (docs/bridge.md §6.3), for
// clients and tests that count the reply's packets. The caller must not
// modify it.
func ClearTailPacket() ([]byte, error) { return opusSilence() }

// newMediaPath sets up sess's media path for the bridge's agreed format;
// sess's peer, bridge, client events and RTCP sender are set.
func newMediaPath(sess *session) (*mediaPath, error) {
	cfg := &sess.srv.cfg
	m := &mediaPath{
		cfg: cfg, be: sess.be, peer: sess.peer, client: sess.client, sent: sess.sent, outSSRC: sess.outSSRC,
		metrics: sess.srv.metrics, probe: sess.srv.probe, log: sess.log, ending: sess.isEnding, dropped: &sess.dropped,
		tailRefused: make(chan struct{}, 1),
	}
	if rate := bridge.SampleRate(m.be.Format()); rate != 0 {
		var err error
		if m.dec, err = audio.NewDecoder(rate); err != nil {
			return nil, err
		}
		if m.enc, err = audio.NewEncoderConfig(audio.EncoderConfig{Rate: rate, Bitrate: cfg.OutputBitrate, Complexity: cfg.OutputComplexity, FrameMs: cfg.Ptime}); err != nil {
			return nil, err
		}
		m.frameDur, m.frameLen = cfg.Ptime*48, m.enc.FrameSamples()
	}
	m.rtpPkt.Header = rtp.Header{Version: 2, PayloadType: sess.opusPT, SSRC: m.outSSRC}
	// Audio the backend sends before the client is connected (a greeting
	// at session.start) waits: playout starts when ICE and DTLS are up
	// (startPlayout).
	qcfg := playout.QueueConfig{MaxQueued: cfg.OutputQueueMax, Paused: true}
	if silence, err := opusSilence(); err == nil {
		qcfg.ClearTail = silence
	} else {
		m.log.Warn("no silence packet for clears", "err", err)
	}
	if m.enc != nil {
		qcfg.OnUnderrun = m.flushTail
	}
	qcfg.OnEvents = m.kickEvents
	m.q = sess.srv.clock.NewQueue(m, qcfg)
	if td := m.be.TurnDetection(); td != nil {
		m.setTurnDetection(td, "hello")
	}
	return m, nil
}

// startPlayout lets the queued audio play: the client's media path is up.
func (m *mediaPath) startPlayout() { m.q.Resume() }

// toBackend forwards one client RTP packet (the track goroutine): as it
// came for Opus, decoded into 20 ms PCM frames (losses concealed) for the
// PCM formats; each frame, once written, goes to turn detection.
func (m *mediaPath) toBackend(pkt *rtp.Packet) error {
	m.applyTurns(pkt.Payload)
	t := &m.turns
	now := time.Now()
	if m.dec == nil {
		if err := m.be.SendAudio(bridgeCtx, bridge.AudioFrame{Seq: pkt.SequenceNumber, Timestamp: pkt.Timestamp, Payload: pkt.Payload}); err != nil {
			return err
		}
		m.reportTurns(t.opus(t.evs[:0], pkt, now))
		return nil
	}
	for _, f := range m.dec.Push(pkt.SequenceNumber, pkt.Timestamp, pkt.Payload) {
		if err := m.be.SendAudio(bridgeCtx, bridge.AudioFrame{Seq: f.Seq, Timestamp: f.Timestamp, Payload: f.PCM, Concealed: f.Concealed}); err != nil {
			return err
		}
		m.reportTurns(t.in.Frame(t.evs[:0], f.Timestamp, f.PCM, now))
	}
	// A 10 ms packet's audio is heard now, not with the packet that
	// completes its frame (vad.Input.Partial); the backend still gets
	// whole frames, so a turn message may lead the frame holding its
	// position by up to 10 ms.
	p := m.dec.Partial()
	m.reportTurns(t.in.Partial(t.evs[:0], p.Timestamp, p.PCM, now))
	m.countDecoder()
	return nil
}

// countDecoder exports the decoder's losses since the last packet.
func (m *mediaPath) countDecoder() {
	st := m.dec.Stats()
	if st == m.decLast {
		return
	}
	mt := m.metrics
	mt.clientAudioDropped.WithLabelValues("invalid_opus").Add(float64(st.Invalid - m.decLast.Invalid))
	mt.clientAudioDropped.WithLabelValues("late").Add(float64(st.Late - m.decLast.Late))
	rate := float64(m.dec.Rate())
	mt.concealed.WithLabelValues("fec").Add(float64(st.FECSamples-m.decLast.FECSamples) / rate)
	mt.concealed.WithLabelValues("plc").Add(float64(st.PLCSamples-m.decLast.PLCSamples) / rate)
	m.decLast = st
}

// playAudio queues one backend audio frame for paced playout. Under
// encMu it only decides; the backend is told after (sendControl blocks on
// the bridge, and a client's clear must not wait for it).
func (m *mediaPath) playAudio(f *bridge.AudioFrame) {
	if m.enc == nil {
		dur, err := audio.PacketDuration(f.Payload)
		if err != nil {
			m.refuse(refusedInvalidOpus, bridge.ErrCodeInvalidOpus, fmt.Sprintf("frame seq %d timestamp %d: %v", f.Seq, f.Timestamp, err))
			return
		}
		m.queued(m.q.PushAudio(f.Payload, dur), f)
		return
	}
	if len(f.Payload)%2 != 0 {
		m.refuse(refusedOddLength, bridge.ErrCodeOddLength, fmt.Sprintf("frame seq %d timestamp %d has %d bytes, not whole 16-bit samples; dropped", f.Seq, f.Timestamp, len(f.Payload)))
		return
	}
	m.encMu.Lock()
	err := m.encodeLocked(f.Payload)
	m.encMu.Unlock()
	m.queued(err, f)
}

// encodeLocked frames, encodes and queues PCM, or refuses it whole with
// playout.ErrFull before encoding anything. Each frame is queued as soon
// as it is encoded: the first packet of a reply sent in one burst (a
// second of audio is 20–30 ms of CPU) can leave while the rest is still
// being encoded. encMu held.
func (m *mediaPath) encodeLocked(pcm []byte) error {
	frames := (m.enc.Pending() + len(pcm)/2) / m.frameLen
	if !m.q.Fits(frames, frames*m.frameDur) {
		return playout.ErrFull
	}
	for len(pcm) > 0 {
		n := min(len(pcm), 2*(m.frameLen-m.enc.Pending()))
		pkts, err := m.enc.Write(pcm[:n])
		pcm = pcm[n:]
		for _, p := range pkts {
			if qerr := m.q.PushAudio(p.Payload, m.frameDur); qerr != nil {
				return qerr // closed: the session is ending
			}
		}
		if err != nil {
			m.log.Warn("opus encode failed", "err", err)
			return nil
		}
	}
	return nil
}

// queued accounts for the result of queueing f: past the cap the backend
// gets one output_queue_full error per episode (until audio fits again).
func (m *mediaPath) queued(err error, f *bridge.AudioFrame) {
	switch {
	case err == nil:
		m.full.Store(false)
	case errors.Is(err, playout.ErrFull):
		m.metrics.backendRefused.WithLabelValues(refusedQueueFull).Inc()
		if !m.full.Swap(true) {
			m.sendControl(bridge.Control{Type: bridge.TypeError, Code: bridge.ErrCodeQueueFull,
				Message: fmt.Sprintf("output queue holds its cap of %v; frame seq %d timestamp %d and the audio after it are refused until it has room", m.cfg.OutputQueueMax, f.Seq, f.Timestamp)})
		}
	}
}

// flushTail pads and queues the last partial PCM frame when the queue has
// run dry: the end of a reply. It runs on the clock's worker, so it must
// not block: when the encoder is busy, its holder is queueing more audio
// (which continues the partial frame), flushing before a mark or tag, or
// clearing (which drops it): no tail is due then.
func (m *mediaPath) flushTail() {
	if !m.encMu.TryLock() {
		return
	}
	err := m.flushLocked()
	m.encMu.Unlock()
	if err != nil {
		// The worker cannot write to the bridge; drainEvents tells the
		// backend.
		select {
		case m.tailRefused <- struct{}{}:
		default:
		}
		m.kickEvents()
	}
}

// flushLocked queues the partial PCM frame, padded. It returns
// playout.ErrFull when the frame does not fit (counted). encMu held.
func (m *mediaPath) flushLocked() error {
	if m.enc == nil || m.enc.Pending() == 0 {
		return nil
	}
	if !m.q.Fits(1, m.frameDur) {
		m.metrics.backendRefused.WithLabelValues(refusedQueueFull).Inc()
		_ = m.enc.Reset() // the partial frame is dropped
		return playout.ErrFull
	}
	pkts, _ := m.enc.Flush()
	for _, p := range pkts {
		if err := m.q.PushAudio(p.Payload, m.frameDur); err != nil {
			return err
		}
	}
	return nil
}

// onControl handles an output.* message from the backend.
func (m *mediaPath) onControl(c *bridge.Control) {
	switch c.Type {
	case bridge.TypeOutputClear:
		m.clearOutput("backend")
	case bridge.TypeOutputMark:
		if c.Name == "" || len(c.Name) > bridge.MaxMarkName {
			m.refuse(refusedMarkName, bridge.ErrCodeMarkName, fmt.Sprintf("mark names are 1 to %d bytes; this one has %d; dropped", bridge.MaxMarkName, len(c.Name)))
			return
		}
		m.encMu.Lock()
		tail := m.flushLocked() // the mark follows all the audio before it
		err := m.q.PushMark(c.Name)
		m.encMu.Unlock()
		m.reportTail(tail)
		if err != nil {
			m.refuse(refusedQueueFull, bridge.ErrCodeQueueFull, fmt.Sprintf("mark %q refused: the output queue holds its cap", c.Name))
		}
	case bridge.TypeOutputResponse:
		if len(c.ID) > bridge.MaxResponseID {
			m.refuse(refusedResponseID, bridge.ErrCodeResponseID, fmt.Sprintf("response ids are at most %d bytes; this one has %d; ignored", bridge.MaxResponseID, len(c.ID)))
			return
		}
		m.encMu.Lock()
		tail := m.flushLocked() // the previous response's audio ends here
		err := m.q.PushResponse(c.ID)
		m.encMu.Unlock()
		m.reportTail(tail)
		if err != nil {
			m.refuse(refusedQueueFull, bridge.ErrCodeQueueFull, fmt.Sprintf("response tag %q refused: the output queue holds its cap", c.ID))
		}
	case bridge.TypeInputTurnDetection:
		m.setTurnDetection(c.TurnDetection, bridge.TypeInputTurnDetection)
	default:
		m.refuse(refusedUnexpected, bridge.ErrCodeUnexpected, fmt.Sprintf("%s is sent by the transceiver, not to it; ignored", c.Type))
	}
}

// reportTail tells the backend that a reply's padded last frame did not
// fit in the queue (already counted by flushLocked).
func (m *mediaPath) reportTail(err error) {
	if errors.Is(err, playout.ErrFull) {
		m.sendControl(bridge.Control{Type: bridge.TypeError, Code: bridge.ErrCodeQueueFull,
			Message: "the last, partial frame of a reply did not fit in the output queue; dropped"})
	}
}

// clearOutput drops all queued audio at once and returns how many
// milliseconds of the current playout run had been sent to the client.
// The backend is told with output.cleared and the client with
// output_audio_buffer.cleared, in order with the other playout events.
// source labels the metric: "backend" (output.clear), "client"
// (output_audio_buffer.clear), "turn" (turn detection's barge-in).
func (m *mediaPath) clearOutput(source string) int64 {
	m.encMu.Lock()
	defer m.encMu.Unlock()
	if m.enc != nil {
		// The encoder ran ahead of playout: start the next reply from a
		// clean state, not predicting from audio that was never sent.
		if err := m.enc.Reset(); err != nil {
			m.log.Warn("opus encoder reset failed", "err", err)
		}
	}
	if m.q.Idle() && source == "backend" {
		m.metrics.backendRefused.WithLabelValues(refusedClearIdle).Inc()
	}
	m.metrics.clears.WithLabelValues(source).Inc()
	return m.q.Clear()
}

// refuse counts bad backend input and tells the backend.
func (m *mediaPath) refuse(reason, code, msg string) {
	m.metrics.backendRefused.WithLabelValues(reason).Inc()
	m.sendControl(bridge.Control{Type: bridge.TypeError, Code: code, Message: msg})
}

func (m *mediaPath) sendControl(c bridge.Control) {
	if err := m.be.SendControl(bridgeCtx, c); err != nil && !m.ending() {
		m.metrics.bridgeErrors.WithLabelValues("send").Inc()
	}
}

// SendPacket sends one paced packet to the client (playout.Sink). It runs
// on the clock's worker goroutine.
func (m *mediaPath) SendPacket(p *playout.Packet) {
	pkt := &m.rtpPkt
	pkt.SequenceNumber, pkt.Timestamp, pkt.Marker, pkt.Payload = p.Seq, p.Timestamp, p.Marker, p.Payload
	m.probe.toClient.enter(m.outSSRC, pkt.SequenceNumber)
	if err := m.peer.WriteRTP(&pkt.Header, pkt.Payload); err != nil {
		m.dropped.Add(1)
		m.metrics.outputDropped.Inc()
		return
	}
	m.sent.Sent(pkt.SequenceNumber, pkt.Timestamp, len(pkt.Payload), time.Now())
}

// Playout events (output.* to the backend, output_audio_buffer.* to the
// client) are reported by a goroutine that runs only while there are some
// to report: a voice session spends most of its life with none due, so
// it keeps no goroutine waiting for them. The queue calls kickEvents when
// it queues events (playout.QueueConfig.OnEvents), flushTail when a
// reply's tail did not fit; the first wake-up starts drainEvents, later
// ones while it runs make it go round again. At most one drain runs at a
// time, so the reports keep their order.

// kickEvents wakes the event drain, starting it if none runs. It runs
// with the queue's lock held (or on the clock's worker): it only counts
// and starts a goroutine.
func (m *mediaPath) kickEvents() {
	if m.evPending.Add(1) != 1 {
		return // the running drain will go round again
	}
	m.evMu.Lock()
	defer m.evMu.Unlock()
	if m.evDone {
		return // the session is ending: nothing more is reported
	}
	m.evWG.Add(1)
	go m.drainEvents()
}

// drainEvents reports the queued playout events, in order, until no
// wake-up came while it did.
func (m *mediaPath) drainEvents() {
	defer m.evWG.Done()
	var evs []playout.Event
	for {
		n := m.evPending.Load()
		select {
		case <-m.tailRefused:
			m.reportTail(playout.ErrFull)
		default:
		}
		// turnMu: a barge-in's input.speech_started goes out before
		// the output.cleared its clear caused (turns.go).
		m.turnMu.Lock()
		evs = m.q.Events(evs[:0])
		for _, e := range evs {
			m.reportPlayout(e)
		}
		m.turnMu.Unlock()
		if m.evPending.Add(-n) == 0 {
			return
		}
	}
}

// stopEvents starts no event drain after it returns; the one running, if
// any, finishes on its own (teardown waits for it on m.evWG).
func (m *mediaPath) stopEvents() {
	m.evMu.Lock()
	m.evDone = true
	m.evMu.Unlock()
}

func (m *mediaPath) reportPlayout(e playout.Event) {
	var client string
	switch e.Type {
	case playout.EventStarted:
		m.sendControl(bridge.Control{Type: bridge.TypeOutputStarted})
		client = clientStartedType
	case playout.EventStopped:
		m.sendControl(bridge.Control{Type: bridge.TypeOutputStopped, PlayedMs: e.PlayedMs})
		client = clientStoppedType
	case playout.EventCleared:
		m.sendControl(bridge.Control{Type: bridge.TypeOutputCleared, PlayedMs: e.PlayedMs})
		client = clientClearedType
	case playout.EventMark:
		m.sendControl(bridge.Control{Type: bridge.TypeOutputMark, Name: e.Name, Cleared: e.Cleared})
		return
	}
	m.client.playout(client, e.ResponseID)
}

// clockTick is the playout clock's period for c.Ptime: one packet per
// session per tick (playout.ClockConfig.Tick).
func (c *Config) clockTick() time.Duration { return time.Duration(c.Ptime) * time.Millisecond }

// answerPtime is the a=ptime the answer carries (RFC 4566 §6: the audio,
// in ms, the answerer wants in each packet it receives), so that the
// client's encoder sends packets of that length (Chromium's WebRTC takes
// the remote description's ptime as its Opus frame size); 0, no a=ptime,
// at DefaultPtime: 20 ms is what WebRTC clients send unasked.
func (c *Config) answerPtime() int {
	if c.Ptime == DefaultPtime {
		return 0
	}
	return c.Ptime
}
