package transceiver

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/apm"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// This file is a session's input cleaning (internal/apm, docs/vad.md
// "Clean input"): echo cancellation with the session's own playout as the
// far-end reference, and noise suppression, on the decoded input of PCM
// sessions, before turn detection and (when asked, or with noise
// suppression on) before the backend.
//
//	SendPacket (clock worker) ─▶ played ring: the Opus payload and when it left
//	toBackend (track goroutine) ─▶ drain ring, decode ─▶ apm.Cleaner.Played
//	decoded frame ─▶ apm.Cleaner.Process ─▶ detector (and bridge: backend_audio / noise_reduction)
//
// The backend switches it with members of its turn_detection object (in
// its hello or an input.turn_detection), which the detector's own parser
// ignores:
//
//	"echo_cancellation": {"backend_audio": false, "guard_first_reply": true}   (null: off; absent: defaultEchoCancellation)
//	"noise_reduction":   {"type": "near_field"}     (or "far_field"; null or absent: off)

// defaultEchoCancellation says whether a PCM session whose turn
// detection interrupts the agent (interrupt_response) cancels echo when
// its turn_detection does not say. On: end to end a speakerphone's echo
// cut every reply off without it and none with it, while a client that
// cancels its own echo (headsets, browsers: most sessions) loses nothing
// on its interruptions, since the canceller and its gate wait until an
// echo is found in the input; such a client pays the echo estimator's
// CPU while the agent talks (docs/vad.md "Clean input", docs/benchmarks.md).
// A backend sends "echo_cancellation":null to turn it off.
const defaultEchoCancellation = true

// playedSlots bounds the packets SendPacket hands to the track goroutine
// between two client packets: 1 s of 20 ms packets (2 s of 10 ms); a
// client that stops sending for longer loses the older ones, counted in
// switchboard_transceiver_echo_reference_dropped_total{reason="ring_full"}.
const playedSlots = 100

// Reasons of switchboard_transceiver_echo_reference_dropped_total.
const (
	echoRefRingFull    = "ring_full"
	echoRefUndecodable = "undecodable"
)

// playedSlack is how far a packet's send time may be from where its RTP
// timestamp puts it before the far end's timeline starts again: a clock
// that fell this far behind (or a jump the timestamps do not show) has
// changed what the client plays.
const playedSlack = 500 * time.Millisecond

// cleanSetting is a turn_detection's cleaning members, decoded.
type cleanSetting struct {
	echo         bool   // cancel echo
	backendAudio bool   // the backend gets the cleaned audio too
	guard        bool   // the echo gate guards the first reply (apm.Config.GuardFirstReply)
	noise        string // apm.NearField, apm.FarField or "" (off)
}

// cleanMembers are the turn_detection members cleaning reads.
type cleanMembers struct {
	EchoCancellation json.RawMessage `json:"echo_cancellation"`
	NoiseReduction   json.RawMessage `json:"noise_reduction"`
}

// parseCleaning reads the cleaning members of a turn_detection object;
// interrupt is its interrupt_response (the default for echo cancellation).
// The error says what to fix.
func parseCleaning(raw json.RawMessage, interrupt bool) (cleanSetting, error) {
	var cm cleanMembers
	if err := json.Unmarshal(raw, &cm); err != nil {
		return cleanSetting{}, fmt.Errorf("%w: %v", apm.ErrConfig, err)
	}
	cs := cleanSetting{echo: defaultEchoCancellation && interrupt, guard: true}
	switch {
	case cm.EchoCancellation == nil:
	case isNull(cm.EchoCancellation):
		cs.echo = false
	default:
		var ec struct {
			BackendAudio    bool  `json:"backend_audio"`
			GuardFirstReply *bool `json:"guard_first_reply"`
		}
		if err := strictUnmarshal(cm.EchoCancellation, &ec); err != nil {
			return cleanSetting{}, fmt.Errorf("%w: echo_cancellation must be an object with backend_audio and guard_first_reply (booleans) such as {\"backend_audio\":false}, or null for off: %v", apm.ErrConfig, err)
		}
		cs.echo, cs.backendAudio = true, ec.BackendAudio
		if ec.GuardFirstReply != nil {
			cs.guard = *ec.GuardFirstReply
		}
	}
	cs.guard = cs.guard && cs.echo
	if cm.NoiseReduction != nil && !isNull(cm.NoiseReduction) {
		var nr struct {
			Type string `json:"type"`
		}
		if err := strictUnmarshal(cm.NoiseReduction, &nr); err != nil {
			return cleanSetting{}, fmt.Errorf("%w: noise_reduction must be an object such as {\"type\":\"near_field\"}, or null for off: %v", apm.ErrConfig, err)
		}
		if nr.Type == "" {
			return cleanSetting{}, fmt.Errorf("%w: noise_reduction needs a type, %q or %q", apm.ErrConfig, apm.NearField, apm.FarField)
		}
		cs.noise = nr.Type
		cfg := apm.Config{Rate: 16000, NoiseReduction: nr.Type}
		if err := cfg.Validate(); err != nil {
			return cleanSetting{}, err
		}
	}
	return cs, nil
}

// strictUnmarshal decodes one JSON object into v, refusing members v does
// not have: a misspelt member ({"backend_audo":true}) or one that is not
// there ({"enabled":false}, which would leave echo cancellation on) must
// not pass as the default.
func strictUnmarshal(raw json.RawMessage, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// cleaning is a session's input cleaning. next and played are shared;
// the rest belongs to the track goroutine.
type cleaning struct {
	next atomic.Pointer[cleanSetting] // to apply before the next packet
	on   atomic.Bool                  // SendPacket records the far end

	played playedRing

	dump  *os.File // Config.EchoDumpDir: the current cleaner's dump
	dumps int      // dumps made by the session

	c        *apm.Cleaner // nil: off
	set      cleanSetting
	dec      *opus.Decoder // the far end's packets, at the session's rate
	pcm      []int16       // decoded far end
	pcmBytes []byte
	scratch  []byte // the detector's copy of a frame the backend gets raw
	early    []byte // the cleaned first half of the frame at earlyTS (cleanPartial)
	earlyTS  uint32
	hasEarly bool
	// The far end's timeline: the send time of RTP timestamp 0, the
	// earliest seen (inRun: one was).
	runBase time.Time
	inRun   bool
	ts      uint32 // the last input frame's timestamp, and unwrapped
	ext     int64
	started bool
}

// playedRing hands the packets the clock's worker sent to the track
// goroutine: Opus payloads (copied into reused buffers) and send times.
// mu is a leaf, held only to copy a packet in or swap the slots out:
// push runs in SendPacket, which must not block the clock's worker (every
// queue on it waits), so drain decodes outside it.
type playedRing struct {
	mu      sync.Mutex
	slots   *[playedSlots]playedPkt // guarded by mu; nil until the first push
	head, n int
	lost    uint64
	// spare is the drainer's (the track goroutine's): the slots drain
	// swaps in, with their payload buffers.
	spare *[playedSlots]playedPkt
}

type playedPkt struct {
	at      time.Time
	ts      uint32 // RTP timestamp (48 kHz)
	payload []byte
}

func (r *playedRing) push(at time.Time, ts uint32, payload []byte) {
	r.mu.Lock()
	if r.slots == nil {
		r.slots = new([playedSlots]playedPkt)
	}
	if r.n == playedSlots {
		r.head = (r.head + 1) % playedSlots
		r.n--
		r.lost++
	}
	s := &r.slots[(r.head+r.n)%playedSlots]
	s.at, s.ts, s.payload = at, ts, append(s.payload[:0], payload...)
	r.n++
	r.mu.Unlock()
}

// drain calls f on each packet in order and empties the ring (the track
// goroutine); it returns the packets the full ring dropped since the last
// drain. f runs without the lock: push goes on into the other slots
// meanwhile, for the next drain.
func (r *playedRing) drain(f func(at time.Time, ts uint32, payload []byte)) (lost uint64) {
	if r.spare == nil {
		r.spare = new([playedSlots]playedPkt)
	}
	r.mu.Lock()
	slots, head, n := r.slots, r.head, r.n
	lost, r.lost = r.lost, 0
	if n == 0 {
		r.mu.Unlock()
		return lost
	}
	r.slots, r.spare, r.head, r.n = r.spare, nil, 0, 0
	r.mu.Unlock()
	for ; n > 0; n-- {
		s := &slots[head]
		f(s.at, s.ts, s.payload)
		head = (head + 1) % playedSlots
	}
	r.spare = slots
	return lost
}

// cleanPlayed records a packet sent to the client (SendPacket, the clock's
// worker): only a copy and the time, the decoding is the track
// goroutine's.
func (m *mediaPath) cleanPlayed(payload []byte, ts uint32, at time.Time) {
	if m.clean.on.Load() {
		m.clean.played.push(at, ts, payload)
	}
}

// setCleaning takes the cleaning members of a turn_detection the backend
// sent (raw; nil: turn detection off, so cleaning off) and applies them
// before the next input packet. A bad one is answered with an error,
// changes nothing, and setCleaning reports false: the turn_detection is
// refused whole.
func (m *mediaPath) setCleaning(raw json.RawMessage, interrupt bool, from string) bool {
	cs := cleanSetting{}
	if raw != nil && !isNull(raw) {
		var err error
		if cs, err = parseCleaning(raw, interrupt); err != nil {
			m.refuse(refusedTurnDetection, bridge.ErrCodeTurnDetection, fmt.Sprintf("%s: %v; turn detection unchanged", from, err))
			return false
		}
	}
	if m.dec == nil {
		// Opus passthrough: the backend's audio is the client's packets
		// as they came; only the detector's 16 kHz copy is cleaned.
		cs.backendAudio = false
	}
	m.clean.next.Store(&cs)
	return true
}

// applyCleaning switches cleaning to the setting that came since the last
// packet (the track goroutine).
func (m *mediaPath) applyCleaning() {
	cl := &m.clean
	if cl.next.Load() == nil {
		return
	}
	cs := cl.next.Swap(nil)
	if cs == nil || *cs == cl.set && (cl.c != nil) == (cs.echo || cs.noise != "") {
		return
	}
	m.stopCleaning()
	if !cs.echo && cs.noise == "" {
		return
	}
	rate := m.cleanRate()
	c, err := apm.New(apm.Config{Rate: rate, EchoCancellation: cs.echo, NoiseReduction: cs.noise, GuardFirstReply: cs.guard})
	if err != nil {
		m.log.Warn("input cleaning unavailable", "err", err)
		m.refuse(refusedTurnDetection, bridge.ErrCodeTurnDetection, fmt.Sprintf("input cleaning: %v", err))
		return
	}
	if cs.echo {
		if cl.dec, err = opus.NewDecoder(rate, 1); err != nil {
			c.Close()
			m.log.Warn("input cleaning: opus decoder", "err", err)
			return
		}
		cl.pcm = make([]int16, rate*120/1000) // the longest Opus packet
		cl.pcmBytes = make([]byte, 2*len(cl.pcm))
		cl.on.Store(true)
	}
	if cs.echo && m.cfg != nil && m.cfg.EchoDumpDir != "" {
		m.startDump(c)
	}
	cl.c, cl.set = c, *cs
	m.log.Debug("input cleaning on", "echo_cancellation", cs.echo, "backend_audio", cs.backendAudio, "noise_reduction", cs.noise)
}

// cleanFrame cleans one decoded input frame (timestamp ts at the
// session's rate, its packet in at now) and returns the audio for the
// backend and for the detector: pcm itself when cleaning is off. With
// noise reduction or backend_audio the backend gets the cleaned frame,
// else the frame as it came and the detector a cleaned copy. A first
// half that cleanPartial already cleaned is not cleaned again.
func (m *mediaPath) cleanFrame(ts uint32, pcm []byte, now time.Time) (backend, detector []byte) {
	cl := &m.clean
	if cl.c == nil {
		return pcm, pcm
	}
	out := pcm
	if !cl.set.backendAudio && cl.set.noise == "" {
		cl.scratch = append(cl.scratch[:0], pcm...)
		out = cl.scratch
	}
	done := 0
	if cl.hasEarly && cl.earlyTS == ts && len(cl.early) < len(out) {
		done = copy(out, cl.early)
	}
	cl.hasEarly = false
	if !m.cleanRun(ts, out[done:], done/2, now) {
		return pcm, pcm
	}
	return out, out
}

// cleanPartial cleans the first 10 ms of a frame that the decoder has
// assembled so far (audio.Decoder.Partial), the part turn detection hears
// early (vad.Input.Partial: 10 ms packets), once per frame, and keeps it
// for the frame. Less than 10 ms (packets of 2.5 or 5 ms) passes as it
// is: the cleaner takes whole 10 ms frames.
func (m *mediaPath) cleanPartial(ts uint32, pcm []byte, now time.Time) []byte {
	cl := &m.clean
	n := 2 * m.cleanRate() / 100
	if cl.c == nil || len(pcm) < n {
		return pcm
	}
	if cl.hasEarly && cl.earlyTS == ts {
		return cl.early // cleaned at an earlier packet of this frame
	}
	cl.early = append(cl.early[:0], pcm[:n]...)
	if !m.cleanRun(ts, cl.early, 0, now) {
		return pcm
	}
	cl.earlyTS, cl.hasEarly = ts, true
	return cl.early
}

// cleanRun cleans pcm in place: the audio off samples after the frame at
// ts. It reports false when cleaning failed, and switched it off.
func (m *mediaPath) cleanRun(ts uint32, pcm []byte, off int, now time.Time) bool {
	cl := &m.clean
	if cl.on.Load() {
		if lost := cl.played.drain(m.playedFar); lost > 0 {
			m.metrics.echoRefDropped.WithLabelValues(echoRefRingFull).Add(float64(lost))
		}
	}
	if !cl.started {
		cl.started, cl.ts, cl.ext = true, ts, int64(ts)
	} else {
		cl.ext += int64(int32(ts - cl.ts))
		cl.ts = ts
	}
	if len(pcm) == 0 {
		return true
	}
	if err := cl.c.Process(pcm, cl.ext+int64(off), now); err != nil {
		m.log.Warn("input cleaning failed; switched off", "err", err)
		m.stopCleaning()
		return false
	}
	return true
}

// playedFar decodes one packet sent to the client (at at, RTP timestamp
// ts) into the cleaner's far end. A packet that does not decode (none
// should: the transceiver's own encoder made it, or a backend's Opus that
// playAudio checked) is left out: the far end is silence there.
//
// The far end is placed where the client's jitter buffer plays it: by
// its RTP timestamp, from the earliest send time seen for timestamp 0,
// not by when each packet left: after a stall the clock sends the packets
// it owes together, and a receiver still plays them one after the other;
// a timestamp that jumps is a gap the receiver plays as silence. Only a
// packet more than playedSlack off that timeline starts it again.
func (m *mediaPath) playedFar(at time.Time, ts uint32, payload []byte) {
	cl := &m.clean
	n, err := cl.dec.Decode(payload, cl.pcm)
	if err != nil || n == 0 {
		m.metrics.echoRefDropped.WithLabelValues(echoRefUndecodable).Inc()
		return
	}
	// The run's base: the earliest send time less the timestamp's time
	// seen in it; a packet the clock sent late (it was busy) does not
	// move it.
	base := at.Add(-time.Duration(ts) * time.Second / opusClockRate)
	if !cl.inRun || base.Sub(cl.runBase) > playedSlack || cl.runBase.Sub(base) > playedSlack {
		cl.runBase, cl.inRun = base, true
	} else if base.Before(cl.runBase) {
		cl.runBase = base
	}
	nominal := cl.runBase.Add(time.Duration(ts) * time.Second / opusClockRate)
	// Whole 10 ms frames: every Opus packet is a multiple of 2.5 ms, and
	// the transceiver's are 10 or 20 ms.
	frame := m.cleanRate() / 100
	n -= n % frame
	b := cl.pcmBytes[:2*n]
	for i, v := range cl.pcm[:n] {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	}
	_ = cl.c.Played(nominal, b)
}

// cleanRate is the rate of the audio cleaned: the session's decoder's, or
// with Opus passthrough the detector's own decoder's (opusVADRate).
func (m *mediaPath) cleanRate() int {
	if m.dec != nil {
		return m.dec.Rate()
	}
	return opusVADRate
}

// startDump writes c's inputs to a new file in Config.EchoDumpDir (the
// track goroutine). A file that cannot be made is logged: the call goes
// on without a dump.
func (m *mediaPath) startDump(c *apm.Cleaner) {
	cl := &m.clean
	cl.dumps++
	name := filepath.Join(m.cfg.EchoDumpDir, fmt.Sprintf("%s-%d.apmdump", m.id, cl.dumps))
	f, err := os.Create(name)
	if err == nil {
		if err = c.DumpTo(f); err != nil {
			f.Close()
		}
	}
	if err != nil {
		m.log.Warn("echo dump not written", "file", name, "err", err)
		return
	}
	cl.dump = f
	m.log.Info("echo dump", "file", name)
}

// stopCleaning frees the cleaner (the track goroutine, and its end).
func (m *mediaPath) stopCleaning() {
	cl := &m.clean
	cl.on.Store(false)
	if lost := cl.played.drain(func(time.Time, uint32, []byte) {}); lost > 0 {
		m.metrics.echoRefDropped.WithLabelValues(echoRefRingFull).Add(float64(lost))
	}
	if cl.c != nil {
		cl.c.Close()
		if cl.dump != nil {
			err := cmp.Or(cl.c.DumpErr(), cl.dump.Close())
			if err != nil {
				m.log.Warn("echo dump cut short", "file", cl.dump.Name(), "err", err)
			}
			cl.dump = nil
		}
		cl.c = nil
	}
	cl.dec, cl.set, cl.started, cl.hasEarly, cl.inRun = nil, cleanSetting{}, false, false, false
}
