package transceiver

import (
	"bytes"
	"context"
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
// the backend bridge (docs/bridge.md §5, §6); output.go is its output side,
// turns.go its turn detection:
//
//	client RTP ─▶ fromClient ─▶ toBackend ─▶ (PCM formats: audio.Decoder) ─▶ bridge
//	                                     └─▶ turn detection (turns.go)
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
//     (but turns.next and its clock), clean (but clean.next, clean.on and
//     the played ring's slots), and the turn reports;
//   - the bridge reader (fromBackend): playAudio, onControl, full;
//   - the playout clock's worker: SendPacket, rtpPkt, flushTail, and
//     cleanPlayed (a copy into the played ring);
//   - the event drain, while it runs: drainEvents.
//
// Clears come from any of them and the oai-events reader; the idle
// timeout fires on a timer's goroutine (idle.go). Locks, in the order
// they are taken: turnMu, encMu, the queue's own, evMu (kickEvents, which
// the queue calls with its lock held). encMu is never held across a
// bridge write; turnMu is, for the writes it orders: the turn messages
// and the playout reports. Input cleaning's played ring (clean.go) has a
// leaf lock: SendPacket copies a packet in under it, the track goroutine
// swaps the packets out and decodes them after.
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
	id       string         // the session's, for file names (Config.EchoDumpDir)
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
	sentAny     bool          // SendPacket has sent a packet; only the clock worker touches it
	firstSeq    atomic.Uint32 // the first packet's sequence number | firstSeqSet, once sent
	decLast     audio.DecoderStats

	// The turn awaiting its reply, for the per-turn latencies: the wall
	// time (Unix ns) its speech ended, until the first reply audio from
	// the backend (replyDue, playAudio) and the first packet sent to the
	// client (sendDue, SendPacket) come; 0: none awaited.
	replyDue, sendDue atomic.Int64

	turns turns // turn detection (turns.go)
	// clean is input cleaning (clean.go): echo cancellation and noise
	// suppression before turn detection.
	clean cleaning
	// turnMu orders the turn messages and the playout events a turn
	// causes (speechStarted, drainEvents, reportPlayoutLocked), and
	// guards idle and evLocked.
	turnMu   sync.Mutex
	idle     idleWatch       // the idle timeout (idle.go)
	evLocked []playout.Event // reportPlayoutLocked's scratch

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
		metrics: sess.srv.metrics, probe: sess.srv.probe, log: sess.log, id: sess.id, ending: sess.isEnding, dropped: &sess.dropped,
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
	m.idle.fire, m.idle.clock = m.idleFired, m.turns.clockNow
	if td := m.be.TurnDetection(); td != nil {
		m.setTurnDetection(td, "hello")
	}
	return m, nil
}

// firstSeqSet marks mediaPath.firstSeq as set.
const firstSeqSet = 1 << 16

// firstSent returns the sequence number of the first packet sent to the
// client; sent is false before there was one.
func (m *mediaPath) firstSent() (seq uint16, sent bool) {
	v := m.firstSeq.Load()
	return uint16(v), v&firstSeqSet != 0
}

// startPlayout lets the queued audio play: the client's media path is up.
func (m *mediaPath) startPlayout() { m.q.Resume() }

// toBackend forwards one client RTP packet (the track goroutine): as it
// came for Opus, decoded into 20 ms PCM frames (losses concealed) for the
// PCM formats; each frame, once written, goes to turn detection.
func (m *mediaPath) toBackend(pkt *rtp.Packet) error {
	m.applyTurns(pkt.Payload)
	m.applyCleaning()
	t := &m.turns
	var now time.Time // the detector's and cleaner's wall time: read only when one is on
	if t.in.Detector() != nil || m.clean.c != nil {
		now = time.Now()
	}
	if t.in.Detector() != nil {
		t.now = now
		defer t.fed(now)
	}
	if m.dec == nil {
		if err := m.be.SendAudio(bridgeCtx, bridge.AudioFrame{Seq: pkt.SequenceNumber, Timestamp: pkt.Timestamp, Payload: pkt.Payload}); err != nil {
			return err
		}
		m.reportTurns(m.opusTurns(t.evs[:0], pkt, now))
		return nil
	}
	for _, f := range m.dec.Push(pkt.SequenceNumber, pkt.Timestamp, pkt.Payload) {
		toBE, toDet := m.cleanFrame(f.Timestamp, f.PCM, now)
		if err := m.be.SendAudio(bridgeCtx, bridge.AudioFrame{Seq: f.Seq, Timestamp: f.Timestamp, Payload: toBE, Concealed: f.Concealed}); err != nil {
			return err
		}
		m.reportTurns(t.in.Frame(t.evs[:0], f.Timestamp, toDet, now))
	}
	// A 10 ms packet's audio is heard now, not with the packet that
	// completes its frame (vad.Input.Partial); the backend still gets
	// whole frames, so a turn message may lead the frame holding its
	// position by up to 10 ms.
	p := m.dec.Partial()
	m.reportTurns(t.in.Partial(t.evs[:0], p.Timestamp, m.cleanPartial(p.Timestamp, p.PCM, now), now))
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
