package transceiver

import (
	"errors"
	"fmt"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/playout"
)

// The media path's output side: backend audio framed, encoded and queued
// for paced playout, the backend's output.* controls, clears, the paced
// send to the client, and the playout events' reports (docs/bridge.md §6).

// playAudio queues one backend audio frame for paced playout. Under
// encMu it only decides; the backend is told after (sendControl blocks on
// the bridge, and a client's clear must not wait for it).
func (m *mediaPath) playAudio(f *bridge.AudioFrame) {
	if end := m.replyDue.Load(); end != 0 && m.replyDue.CompareAndSwap(end, 0) {
		m.metrics.turnReply.WithLabelValues(stageBackend).Observe(time.Since(time.Unix(0, end)).Seconds())
	}
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
	if !m.sentAny {
		m.sentAny = true
		m.firstSeq.Store(uint32(p.Seq) | firstSeqSet)
	}
	if end := m.sendDue.Load(); end != 0 && m.sendDue.CompareAndSwap(end, 0) {
		m.metrics.turnReply.WithLabelValues(stageClient).Observe(time.Since(time.Unix(0, end)).Seconds())
	}
	m.probe.toClient.enter(m.outSSRC, pkt.SequenceNumber)
	if err := m.peer.WriteRTP(&pkt.Header, pkt.Payload); err != nil {
		m.dropped.Add(1)
		m.metrics.outputDropped.Inc()
		return
	}
	now := time.Now()
	m.sent.Sent(pkt.SequenceNumber, pkt.Timestamp, len(pkt.Payload), now)
	m.cleanPlayed(pkt.Payload, pkt.Timestamp, now)
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
		// turnMu: a turn's messages and the playout events it caused
		// go out in order (turns.go).
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

// reportPlayout reports one playout event to the backend and the client,
// and follows the reply's playing for the idle timeout. turnMu held.
func (m *mediaPath) reportPlayout(e playout.Event) {
	var client string
	switch e.Type {
	case playout.EventStarted:
		m.idle.agentStarted()
		m.sendControl(bridge.Control{Type: bridge.TypeOutputStarted})
		client = clientStartedType
	case playout.EventStopped:
		m.idle.agentStopped(m.q.AudioEnd())
		m.sendControl(bridge.Control{Type: bridge.TypeOutputStopped, PlayedMs: e.PlayedMs})
		client = clientStoppedType
	case playout.EventCleared:
		m.idle.agentStopped(m.q.AudioEnd())
		m.sendControl(bridge.Control{Type: bridge.TypeOutputCleared, PlayedMs: e.PlayedMs})
		client = clientClearedType
	case playout.EventPaused:
		m.sendControl(bridge.Control{Type: bridge.TypeOutputPaused, PlayedMs: e.PlayedMs})
		client = clientPausedType
	case playout.EventResumed:
		m.sendControl(bridge.Control{Type: bridge.TypeOutputResumed, PlayedMs: e.PlayedMs})
		client = clientResumedType
	case playout.EventMark:
		m.sendControl(bridge.Control{Type: bridge.TypeOutputMark, Name: e.Name, Cleared: e.Cleared})
		return
	}
	m.client.playout(client, e.ResponseID)
}
