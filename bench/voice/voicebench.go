// Package voicebench measures turn-taking as a user feels it: headless
// Chromium runs the demo page through the relay with a round-trip time
// added (an impair.UDP proxy in front of the relay, half the RTT each
// way), its fake microphone plays espeak-ng speech with pauses, and the
// parrot agent answers. Per turn:
//
//	(a) speech end → the turn's stop at the backend, minus the silence
//	    window: the detector's share. Measured at the backend on its own
//	    clock: the time the stop reached the agent, minus the time the
//	    frame that ends at the detected speech end (audio_ms −
//	    silence_duration_ms) reached it, minus the silence window. An
//	    end in the middle of a 20 ms frame (ptime 10: the detector's
//	    frames are 10 ms) reached it between the frames either side.
//	(b) speech end → the first reply audio heard in the page, minus the
//	    silence window: on the page's clock, from the last moment its
//	    microphone analyser heard the user (before speech_stopped) to the
//	    first moment its analyser on the agent's stream heard sound
//	    (internal/web's window.switchboard.talk).
//	(c) the user's onset → the agent silent in the page, for turns that
//	    began while the agent was sounding: from the start of the
//	    microphone's stretch of sound to the start of 250 ms of quiet on
//	    the agent's stream.
//
// Two modes run the same script: "edge" (the transceiver's turn
// detection clears the reply: barge-in at the edge) and "backend" (the
// agent runs the same detector on the PCM it receives and sends
// output.clear; the edge still detects turns, with interrupt_response
// false, so that the page gets the same events). Two more exercise the
// edge's turn-taking options (issue 25, turntaking.go): "tentative" (the
// early pause: the agent prepares its reply during the pause, the edge
// holds it until the turn ends) on the same script, whose sentences
// include pauses the user goes on after, and "resume" (coughs and
// backchannels over the agent's replies pause them and let them resume;
// a real interruption still clears; an idle timeout after each first
// reply) on a script of its own.
package voicebench

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/chromium"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/impair"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
	"github.com/switchboard-rtc/switchboard/internal/vad"
	"github.com/switchboard-rtc/switchboard/internal/web"
)

// Modes.
const (
	ModeEdge    = "edge"    // the transceiver clears on the user's onset
	ModeBackend = "backend" // the agent's own VAD sends output.clear
	// ModeEdgeHint is ModeEdge with the page's receiver asked for a
	// jitter buffer target (Options.JitterBufferTarget): what a page
	// written for low latency may do, and a client written for OpenAI
	// does not.
	ModeEdgeHint = "edge-hint"
	// ModeTentative is ModeEdge with the early pause
	// (Options.PauseMs): the agent answers input.speech_paused and the
	// edge holds the reply until the stop.
	ModeTentative = "tentative"
	// ModeResume is ModeEdge with resume_false_interruption and the idle
	// timeout (Options.IdleTimeout), on the script with coughs and
	// backchannels over the replies.
	ModeResume = "resume"
)

// Options configures Run.
type Options struct {
	// RTT is added between the browser and the relay (half each way).
	RTT time.Duration
	// Cycles of the script to run per mode; each has two user turns, the
	// second of which talks over the reply to the first.
	Cycles int
	// Modes to run, in order (default edge, backend). ModeEdgeHint is
	// edge with the page's receiver given JitterBufferTarget.
	Modes []string
	// JitterBufferTarget is the RTCRtpReceiver.jitterBufferTarget the
	// page sets on the agent's audio in ModeEdgeHint.
	JitterBufferTarget time.Duration
	// Ptimes are the transceiver's packet lengths (transceiver.Config.Ptime,
	// ms: 20 or 10) each mode runs with, in order (default 20 alone).
	Ptimes []int
	// Rounds runs every mode at every ptime, in turn, this many times
	// (default 1), Cycles each time; a row pools its rounds. Short
	// alternating rounds put the configurations compared under the same
	// machine load, which moves Chromium's jitter buffer more than most
	// changes do.
	Rounds int
	// ReplyDelay is the parrot's delay from the turn event to its reply
	// (agent.ParrotAgentConfig.ReplyDelay), in every mode: what a real
	// pipeline takes. 0: it answers at once.
	ReplyDelay time.Duration
	// PauseMs is pause_duration_ms in ModeTentative (default
	// DefaultPauseMs).
	PauseMs int
	// IdleTimeout is idle_timeout_ms in ModeResume (default
	// DefaultIdleTimeout).
	IdleTimeout time.Duration
	// Logger gets progress; nil discards it.
	Logger *slog.Logger
}

// Mode is one mode's measurements, ms.
type Mode struct {
	Name string
	// Ptime is the transceiver's packet length, ms.
	Ptime int
	// StopAtBackend is (a), Reply (b), Quiet (c), one value per turn.
	StopAtBackend, Reply, Quiet []float64
	// Heard is, per interruption, the user's onset → the page's receipt
	// of input_audio_buffer.speech_started: detection plus one RTT, the
	// part of (c) before the clear can act; the rest of (c) is the reply
	// already on its way and the browser's playout.
	Heard []float64
	Turns int
	// Split is where (b)'s time went, per reply (see Split).
	Split Split
	// ClientPacketMs is, per run, the call's length over the packets the
	// page's microphone sent in it (getStats outbound-rtp packetsSent):
	// the browser's Opus frame, which follows the answer's a=ptime.
	ClientPacketMs []float64
	// Loads are the 1-minute load averages at the start and end of each
	// run.
	Loads [][2]string
	// Turns is what the turn-taking options did (ModeTentative,
	// ModeResume; turntaking.go).
	TurnTaking TurnTaking
}

// Split divides (b), per reply, ms. Up, Edge and Browser add up to (b)
// (the page's speech end to the reply heard, less the silence window);
// the page times both events it uses when they arrive, and both crossed
// the same path from the transceiver, so the path's delay cancels out of
// Edge and lands once in Up (the stop's way to the page) and once in
// Browser (the reply's).
type Split struct {
	// Up: the page's speech end → input_audio_buffer.speech_stopped in
	// the page, less the silence window: the microphone's capture and
	// packetization, the way to the edge, the detector's speech end being
	// later than the page's, the stop's way back to the page.
	Up []float64
	// Edge: speech_stopped → output_audio_buffer.started in the page: the
	// agent's reply and the transceiver's encoding and queueing, up to
	// the reply's first packet.
	Edge []float64
	// Agent: the part of Edge spent in the agent, on its clock: the stop
	// arrived → it began sending the reply.
	Agent []float64
	// Browser: output_audio_buffer.started in the page → the reply heard:
	// the jitter buffer, decoding, playout and the page's analyser.
	Browser []float64
	// QuietLead: how long each reply plays before its first 10 ms at or
	// above the page's −45 dBFS, in whole 10 ms blocks (the parrot starts
	// a reply 2 ms before its first sample at −40 dBFS, faded in; a soft
	// start of speech counts here too): part of Browser.
	QuietLead []float64
	// JitterBuffer is the mean time the reply's first 300 ms of samples
	// spent in the page's jitter buffer (getStats inbound-rtp
	// jitterBufferDelay / jitterBufferEmittedCount over the reply), and
	// JitterTarget the mean target delay over the same samples.
	JitterBuffer, JitterTarget []float64
}

// Result is what Run measured.
type Result struct {
	Opts     Options
	Modes    []Mode
	Browser  string
	Silence  int // silence_duration_ms
	Duration time.Duration
	// EndLag is, by the client's packet length (each of Opts.Ptimes, ms),
	// per utterance of the script, the detector's speech end (the end of
	// its last frame that counted as speech) minus the page's (the end of
	// the last 10 ms at or above −45 dBFS), ms, on the same audio: the
	// script, through Opus at 48 kHz in packets of that length and
	// decoded at 24 kHz, the detector fed as the transceiver feeds it
	// (10 ms frames, each packet as it is decoded, for 10 ms packets).
	EndLag map[int][]float64
	// Load is the 1-minute load average at the start and end of the run.
	Load [2]string
}

// The script's utterances: a longer first one the agent repeats, and a
// short second one said over the reply.
var (
	firsts = []string{
		"The quick brown fox jumps over the lazy dog.",
		"Please book a table for two at seven tonight.",
		"What is the weather going to be like tomorrow?",
		"I would like to change my delivery address.",
	}
	// pausedFirsts are the last cycles' first utterances: sentences with
	// a pause inside ("|", continueMs) that the user goes on after (a
	// tentative end of turn that is not the end).
	pausedFirsts = []string{
		"Please book a table for two|at seven tonight.",
		"I would like to change|my delivery address.",
	}
	seconds = []string{"Wait, stop.", "Hold on a moment.", "No, listen.", "Sorry, one thing."}
)

const (
	leadMs       = 600  // silence before the first cycle
	overMs       = 1100 // pause after the first utterance: the reply starts, then is cut
	afterMs      = 3200 // pause after the second: its reply plays out
	cyclesInFile = 6    // the firsts, then the pausedFirsts
)

// continueMs is the pause inside some of the firsts ("|"): longer than
// the early pause, shorter than the silence window, so the user goes on
// after a tentative end of turn.
const continueMs = 350

// script builds the fake microphone's file: cyclesInFile cycles; Chromium
// loops it. ends are where the cycles end, ms.
func script() (sc *speech.Script, ends []int, err error) {
	sc = &speech.Script{Rate: 48000, Samples: make([]int16, leadMs*48)}
	for i := range cyclesInFile {
		first := firsts[i%len(firsts)]
		if i >= len(firsts) {
			first = pausedFirsts[(i-len(firsts))%len(pausedFirsts)]
		}
		for j, text := range []string{first, seconds[i%len(seconds)]} {
			if err := say(sc, text); err != nil {
				return nil, nil, err
			}
			sc.Pause([]int{overMs, afterMs}[j])
		}
		ends = append(ends, len(sc.Samples)/48)
	}
	return sc, ends, nil
}

// say appends text as one utterance of sc, its parts ("|") continueMs
// apart.
func say(sc *speech.Script, text string) error {
	start := len(sc.Samples) * 1000 / sc.Rate
	for i, part := range strings.Split(text, "|") {
		if i > 0 {
			sc.Pause(continueMs)
		}
		s, err := speech.Say(part, sc.Rate)
		if err != nil {
			return err
		}
		sc.Samples = append(sc.Samples, s...)
	}
	sc.Utterances = append(sc.Utterances, speech.Utterance{StartMs: start, EndMs: len(sc.Samples) * 1000 / sc.Rate, Text: text})
	return nil
}

// Run runs the modes one after the other and returns what they measured.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if opts.Cycles < 1 {
		return nil, errors.New("voicebench: Cycles must be at least 1")
	}
	if len(opts.Modes) == 0 {
		opts.Modes = []string{ModeEdge, ModeBackend}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if len(opts.Ptimes) == 0 {
		opts.Ptimes = []int{transceiver.DefaultPtime}
	}
	if opts.Rounds < 1 {
		opts.Rounds = 1
	}
	for _, mode := range opts.Modes {
		if !slices.Contains([]string{ModeEdge, ModeBackend, ModeEdgeHint, ModeTentative, ModeResume}, mode) {
			return nil, fmt.Errorf("voicebench: mode %q: want %s, %s, %s, %s or %s", mode, ModeEdge, ModeEdgeHint, ModeBackend, ModeTentative, ModeResume)
		}
	}
	if opts.PauseMs == 0 {
		opts.PauseMs = DefaultPauseMs
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.ReplyDelay < 0 {
		return nil, errors.New("voicebench: ReplyDelay must not be negative")
	}
	for _, pt := range opts.Ptimes {
		if pt != 10 && pt != 20 {
			return nil, fmt.Errorf("voicebench: ptime %d: want 10 or 20", pt)
		}
	}
	bin, err := chromiumPath()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "voicebench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// The scripts the modes play, their files, and how long to listen:
	// until the last cycle's last reply has played out.
	scripts := map[string]*benchScript{}
	for _, mode := range opts.Modes {
		name := scriptOf(mode)
		if scripts[name] != nil {
			continue
		}
		bs := &benchScript{name: name, wav: filepath.Join(dir, name+".wav")}
		if name == scriptBackchannel {
			bs.sc, bs.ends, err = backchannelScript()
		} else {
			bs.sc, bs.ends, err = script()
		}
		if err != nil {
			return nil, err
		}
		if err := bs.sc.WriteWAV(bs.wav); err != nil {
			return nil, err
		}
		last := opts.Cycles - 1
		listenMs := last/len(bs.ends)*(len(bs.sc.Samples)/48) + bs.ends[last%len(bs.ends)]
		bs.listen = time.Duration(listenMs)*time.Millisecond + 2*time.Second
		scripts[name] = bs
	}
	sc := scripts[scriptOf(opts.Modes[0])].sc
	if cs := scripts[scriptConversation]; cs != nil {
		sc = cs.sc
	}
	res := &Result{Opts: opts, Silence: vad.DefaultSilenceDurationMs, Browser: chromiumVersion(bin), EndLag: map[int][]float64{}}
	for _, pt := range opts.Ptimes {
		if res.EndLag[pt], err = endLag(sc, pt); err != nil {
			return nil, err
		}
	}
	res.Load[0] = loadAverage()
	start := time.Now()
	for _, mode := range opts.Modes {
		for _, pt := range opts.Ptimes {
			res.Modes = append(res.Modes, Mode{Name: mode, Ptime: pt})
		}
	}
	for round := range opts.Rounds {
		for i := range res.Modes {
			row := &res.Modes[i]
			load := loadAverage()
			bs := scripts[scriptOf(row.Name)]
			opts.Logger.Info("voice bench: mode", "mode", row.Name, "ptime", row.Ptime, "round", round+1, "listen", bs.listen.Round(time.Second), "load", load)
			m, err := runMode(ctx, opts, row.Name, row.Ptime, bin, bs)
			if err != nil {
				return nil, fmt.Errorf("voicebench: %s, ptime %d: %w", row.Name, row.Ptime, err)
			}
			row.merge(m)
			row.Loads = append(row.Loads, [2]string{load, loadAverage()})
		}
	}
	res.Duration = time.Since(start)
	res.Load[1] = loadAverage()
	return res, nil
}

// merge adds run m's measurements to row r.
func (r *Mode) merge(m *Mode) {
	r.StopAtBackend = append(r.StopAtBackend, m.StopAtBackend...)
	r.Reply = append(r.Reply, m.Reply...)
	r.Quiet = append(r.Quiet, m.Quiet...)
	r.Heard = append(r.Heard, m.Heard...)
	r.Turns += m.Turns
	r.ClientPacketMs = append(r.ClientPacketMs, m.ClientPacketMs...)
	s, o := &r.Split, &m.Split
	s.Up = append(s.Up, o.Up...)
	s.Edge = append(s.Edge, o.Edge...)
	s.Agent = append(s.Agent, o.Agent...)
	s.Browser = append(s.Browser, o.Browser...)
	s.QuietLead = append(s.QuietLead, o.QuietLead...)
	s.JitterBuffer = append(s.JitterBuffer, o.JitterBuffer...)
	s.JitterTarget = append(s.JitterTarget, o.JitterTarget...)
	r.TurnTaking.merge(&m.TurnTaking)
}

// loadAverage returns the 1-minute load average (Linux), or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// pageVoiceDB and pageTickMs are the page's "sounding" level and analyser
// window (internal/web's VOICE_DB, TICK_MS).
const (
	pageVoiceDB = -45
	pageTickMs  = 10
)

// endLag runs the detector the transceiver runs (default turn detection,
// 24 kHz) over the script as the transceiver gets it (Opus-encoded at 48
// kHz in packets of packetMs as the browser sends it, decoded at 24 kHz;
// for 10 ms packets, 10 ms frames fed as each packet is decoded, as
// internal/transceiver's turns.go does), and returns for each utterance
// the detector's speech end minus the page's, ms.
func endLag(sc *speech.Script, packetMs int) ([]float64, error) {
	enc, err := audio.NewEncoderConfig(audio.EncoderConfig{Rate: 48000, Bitrate: 32000, FrameMs: packetMs})
	if err != nil {
		return nil, err
	}
	dec, err := audio.NewDecoder(vad.Rate24k)
	if err != nil {
		return nil, err
	}
	frameMs := vad.Frame20ms
	if packetMs <= 10 {
		frameMs = vad.Frame10ms
	}
	det, err := vad.NewDetector(vad.DefaultTurnDetection(), vad.Rate24k, frameMs)
	if err != nil {
		return nil, err
	}
	defer det.Close()
	pcm := make([]byte, 2*len(sc.Samples))
	for i, v := range sc.Samples {
		binary.LittleEndian.PutUint16(pcm[2*i:], uint16(v))
	}
	var stops []int64
	n := det.FrameBytes()
	process := func(b []byte) error {
		for off := 0; off+n <= len(b); off += n {
			ev, err := det.Process(b[off : off+n])
			if err != nil {
				return err
			}
			if ev.Kind == vad.SpeechStopped {
				stops = append(stops, ev.SpeechMs)
			}
		}
		return nil
	}
	// Encoded 20 ms at a time into packets of packetMs; the decoder's
	// frames, and with 10 ms frames the half frame a packet leaves
	// pending, go to the detector.
	early := false
	seq, ts := uint16(0), uint32(0)
	for off := 0; off+1920 <= len(pcm); off += 1920 {
		pkts, err := enc.Write(pcm[off : off+1920])
		if err != nil {
			return nil, err
		}
		for _, p := range pkts {
			for _, f := range dec.Push(seq, ts, p.Payload) {
				b := f.PCM
				if early {
					b, early = b[n:], false
				}
				if err := process(b); err != nil {
					return nil, err
				}
			}
			if part := dec.Partial(); frameMs == vad.Frame10ms && len(part.PCM) >= n && !early {
				if err := process(part.PCM[:n]); err != nil {
					return nil, err
				}
				early = true
			}
			seq++
			ts += uint32(packetMs * 48)
		}
	}
	// The page's end: the last 10 ms window at or above pageVoiceDB.
	win := sc.Rate * pageTickMs / 1000
	loud := func(endMs int) bool {
		end := endMs * sc.Rate / 1000
		var sum float64
		for _, v := range sc.Samples[max(0, end-win):end] {
			sum += float64(v) * float64(v)
		}
		return 10*math.Log10(sum/float64(win)/(32768*32768)+1e-12) >= pageVoiceDB
	}
	var out []float64
	for _, u := range sc.Utterances {
		pageEnd := -1
		for ms := u.StartMs; ms <= u.EndMs+pageTickMs; ms++ {
			if ms*sc.Rate/1000 <= len(sc.Samples) && loud(ms) {
				pageEnd = ms
			}
		}
		// The detector's stop for this utterance: the first after its start.
		for _, st := range stops {
			if st > int64(u.StartMs) && pageEnd >= 0 {
				out = append(out, float64(st)-float64(pageEnd))
				break
			}
		}
	}
	return out, nil
}

// tracer keeps, for the agent's session, when each input frame and each
// turn stop reached the agent.
type tracer struct {
	mu      sync.Mutex
	frames  map[int64]time.Time // frame end, ms → arrival
	stops   []stopAt
	replies []time.Time // when the agent began sending each reply
	leads   []float64   // each reply's quiet lead, ms
	events  []traceAt   // every event but the frames, in order
}

// traceAt is one trace event and when it reached the tracer.
type traceAt struct {
	kind agent.TraceKind
	ms   int64
	at   time.Time
}

type stopAt struct {
	ms int64
	at time.Time
}

func (tr *tracer) trace(ev agent.TraceEvent) {
	now := time.Now()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if ev.Kind != agent.TraceFrame {
		tr.events = append(tr.events, traceAt{ev.Kind, ev.Ms, now})
	}
	switch ev.Kind {
	case agent.TraceFrame:
		tr.frames[ev.Ms] = now
	case agent.TraceSpeechStopped:
		tr.stops = append(tr.stops, stopAt{ev.Ms, now})
	case agent.TraceReply:
		tr.replies = append(tr.replies, now)
		tr.leads = append(tr.leads, float64(ev.QuietLeadMs))
	}
}

// agentLatencies returns, per turn the agent answered, the time from its
// stop's arrival to the reply, ms: negative for a reply it prepared
// during the turn's early pause (ModeTentative), sent before the stop. A
// turn's reply is the first the agent began sending after the turn's
// speech start and before the next one.
func (tr *tracer) agentLatencies() []float64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []float64
	var stop, reply time.Time
	flush := func() {
		if !stop.IsZero() && !reply.IsZero() {
			out = append(out, float64(reply.Sub(stop))/float64(time.Millisecond))
		}
		stop, reply = time.Time{}, time.Time{}
	}
	for _, e := range tr.events {
		switch e.kind {
		case agent.TraceSpeechStarted:
			flush()
		case agent.TraceSpeechStopped:
			stop = e.at
		case agent.TraceReply:
			if reply.IsZero() {
				reply = e.at
			}
		}
	}
	flush()
	return out
}

// backendFrameMs is the length of the PCM frames the transceiver sends
// the backend, whatever the client's packets (docs/bridge.md §5.1).
const backendFrameMs = 20

// stopLatencies returns (a) per stop, ms.
func (tr *tracer) stopLatencies(silenceMs int) []float64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []float64
	for _, s := range tr.stops {
		at, ok := tr.arrivalLocked(s.ms - int64(silenceMs))
		if !ok {
			continue
		}
		out = append(out, float64(s.at.Sub(at))/float64(time.Millisecond)-float64(silenceMs))
	}
	return out
}

// arrivalLocked returns when the input up to ms (on the input clock)
// reached the backend: the arrival of the frame that ends there. At
// ptime 10 the detector's frames are 10 ms and half its speech ends
// fall in the middle of a backend frame, whose first half the detector
// heard with its own packet, 10 ms before the frame was complete. Such
// an end's arrival is interpolated between the arrivals of the frames
// that end either side of it: the client's packets come evenly, so that
// is when the packet that ends at ms came, plus the same way to the
// backend. Taking the earlier frame instead would add half a frame to
// those stops' (a). false if a frame it needs did not arrive. tr.mu
// held.
func (tr *tracer) arrivalLocked(ms int64) (time.Time, bool) {
	lo := ms - ms%backendFrameMs
	a, ok := tr.frames[lo]
	if !ok || lo == ms {
		return a, ok
	}
	b, ok := tr.frames[lo+backendFrameMs]
	if !ok {
		return time.Time{}, false
	}
	return a.Add(b.Sub(a) * time.Duration(ms-lo) / backendFrameMs), true
}

// runMode builds a stack (relay, transceiver, parrot agent, the page),
// calls it from Chromium for listen, and reads the measurements.
func runMode(ctx context.Context, opts Options, mode string, ptime int, bin string, bs *benchScript) (*Mode, error) {
	wav, listen := bs.wav, bs.listen
	log := slog.New(minLevel{opts.Logger.Handler(), slog.LevelWarn})
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, err := token.NewKeyring(token.Key{ID: 1, Secret: secret})
	if err != nil {
		return nil, err
	}
	tr := &tracer{frames: map[int64]time.Time{}}
	td := modeTurnDetection(opts, mode)
	parrot, err := agent.NewParrotAgent(agent.ParrotAgentConfig{Logger: log, OwnVAD: mode == ModeBackend, Trace: tr.trace,
		TurnDetection: &td, ReplyDelay: opts.ReplyDelay})
	if err != nil {
		return nil, err
	}
	be := httptest.NewServer(parrot)
	closers = append(closers, be.Close)
	members := &membership.Table{}
	rly, err := relay.New(relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: 7, Workers: 1}, keys, members, nil, log)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = rly.Close() })
	px, err := impair.NewUDP("127.0.0.1:0", rly.PublicAddr(), impair.Config{Delay: opts.RTT / 2}, 1)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = px.Close() })
	reg := prometheus.NewRegistry()
	trx, err := transceiver.New(transceiver.Config{
		ID: 1, Cluster: 7, ListenAddr: "127.0.0.1:0",
		Advertise:   px.Addr().String(),
		AllowRelays: []string{netip.PrefixFrom(rly.InternalAddr().Addr(), 32).String()},
		BackendURL:  "ws" + strings.TrimPrefix(be.URL, "http") + "/v1/bridge",
		Ptime:       ptime,
	}, keys, reg, log)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = trx.Close() })
	if err := members.Set(map[uint32]netip.AddrPort{1: trx.HopAddr().(*net.UDPAddr).AddrPort()}); err != nil {
		return nil, err
	}
	api, page := trx.Handler(), web.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			page.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	}))
	closers = append(closers, hs.Close)

	out := &logbuf.Buffer{Max: 1 << 20}
	allocCtx, allocCancel := chromedp.NewExecAllocator(ctx, chromium.Options(bin, wav, out)...)
	bctx, cancel := chromedp.NewContext(allocCtx)
	closers = append(closers, func() {
		cctx, ccancel := context.WithTimeout(bctx, 10*time.Second)
		_ = chromedp.Cancel(cctx)
		ccancel()
		cancel()
		allocCancel()
	})
	if err := chromedp.Do(bctx, chromedp.Navigate(hs.URL+"/")); err != nil {
		return nil, fmt.Errorf("chromium: %w (output: %s)", err, out.Tail(2000))
	}
	callOpts := "{}"
	if mode == ModeEdgeHint {
		callOpts = fmt.Sprintf("{jitterBufferTarget: %d}", opts.JitterBufferTarget.Milliseconds())
	}
	if err := chromedp.Do(bctx, chromedp.Evaluate[chromedp.Void](`void window.switchboard.call(`+callOpts+`)`)); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := chromedp.Run(bctx, chromedp.Evaluate[string](`window.switchboard.state`))
		if err != nil {
			return nil, err
		}
		if st == "connected" {
			break
		}
		if st == "failed" || time.Now().After(deadline) {
			return nil, fmt.Errorf("the page did not connect: state %q", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sentBefore, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`window.switchboard.stats.packetsSent`))
	if err != nil {
		return nil, err
	}
	listenStart := time.Now()
	select {
	case <-time.After(listen):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	sentAfter, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`window.switchboard.stats.packetsSent`))
	if err != nil {
		return nil, err
	}
	talk, err := chromedp.Run(bctx, chromedp.Evaluate[pageTalk](`window.switchboard.talk`))
	if err != nil {
		return nil, err
	}
	_ = chromedp.Do(bctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.hangup()`, chromedp.EvalAwaitPromise))
	if mode == ModeEdgeHint {
		set, err := chromedp.Run(bctx, chromedp.Evaluate[*float64](`window.switchboard.jitterBufferTarget`))
		if err != nil {
			return nil, err
		}
		if set == nil {
			return nil, errors.New("the page could not set RTCRtpReceiver.jitterBufferTarget (not supported)")
		}
	}
	m := &Mode{Name: mode, Ptime: ptime, Turns: len(talk.Turns), StopAtBackend: tr.stopLatencies(vad.DefaultSilenceDurationMs)}
	if sentAfter > sentBefore {
		m.ClientPacketMs = []float64{float64(time.Since(listenStart).Milliseconds()) / (sentAfter - sentBefore)}
	}
	m.Split.Agent = tr.agentLatencies()
	tr.mu.Lock()
	m.Split.QuietLead = slices.Clone(tr.leads)
	tr.mu.Unlock()
	for _, t := range talk.Turns {
		if t.ReplyMs != nil {
			m.Reply = append(m.Reply, *t.ReplyMs-vad.DefaultSilenceDurationMs)
			if t.StoppedAt != nil && t.StartedAt != nil && t.EndAt != nil {
				heard := *t.EndAt + *t.ReplyMs
				m.Split.Up = append(m.Split.Up, *t.StoppedAt-*t.EndAt-vad.DefaultSilenceDurationMs)
				m.Split.Edge = append(m.Split.Edge, *t.StartedAt-*t.StoppedAt)
				m.Split.Browser = append(m.Split.Browser, heard-*t.StartedAt)
			}
			if jb := t.JB; jb != nil && jb.Before != nil && jb.After != nil && jb.After.Emitted > jb.Before.Emitted {
				n := jb.After.Emitted - jb.Before.Emitted
				m.Split.JitterBuffer = append(m.Split.JitterBuffer, (jb.After.Delay-jb.Before.Delay)/n*1000)
				m.Split.JitterTarget = append(m.Split.JitterTarget, (jb.After.Target-jb.Before.Target)/n*1000)
			}
		}
		if t.Interrupted && t.QuietMs != nil && t.Resumed {
			m.TurnTaking.QuietFalse = append(m.TurnTaking.QuietFalse, *t.QuietMs) // a cough or a backchannel
		} else if t.Interrupted && t.QuietMs != nil {
			m.Quiet = append(m.Quiet, *t.QuietMs)
			for _, ev := range talk.Events {
				if ev.Type == "input_audio_buffer.speech_started" && ev.At >= t.OnsetAt {
					m.Heard = append(m.Heard, ev.At-t.OnsetAt)
					break
				}
			}
		}
	}
	m.TurnTaking.measure(mode, opts, bs.sc, tr, &talk, reg)
	opts.Logger.Info("voice bench: mode done", "mode", mode, "turns", m.Turns, "stops", len(m.StopAtBackend), "replies", len(m.Reply), "interruptions", len(m.Quiet))
	return m, nil
}

// pageTalk is the part of window.switchboard.talk the bench reads.
type pageTalk struct {
	Turns []struct {
		OnsetAt     float64  `json:"onsetAt"`
		EndAt       *float64 `json:"endAt"`
		ReplyMs     *float64 `json:"replyMs"`
		Interrupted bool     `json:"interrupted"`
		Resumed     bool     `json:"resumed"`
		QuietMs     *float64 `json:"quietMs"`
		StoppedAt   *float64 `json:"stoppedAt"`
		StartedAt   *float64 `json:"startedAt"`
		JB          *struct {
			Before, After *jitterStats
		} `json:"jb"`
	} `json:"turns"`
	Events []struct {
		Type string  `json:"type"`
		At   float64 `json:"at"`
	} `json:"events"`
}

// jitterStats is the page's reading of the agent's stream's jitter
// buffer counters (getStats inbound-rtp, cumulative).
type jitterStats struct {
	Delay   float64 `json:"delay"`   // jitterBufferDelay, s
	Emitted float64 `json:"emitted"` // jitterBufferEmittedCount, samples
	Target  float64 `json:"target"`  // jitterBufferTargetDelay, s
	Minimum float64 `json:"minimum"` // jitterBufferMinimumDelay, s
}

// Stats are the median and 90th percentile of xs (nearest rank).
func Stats(xs []float64) (median, p90 float64) {
	if len(xs) == 0 {
		return math.NaN(), math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	rank := func(q float64) float64 { return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)] }
	return rank(0.5), rank(0.9)
}

// Markdown writes the results table.
func (r *Result) Markdown(w io.Writer) {
	rtt := float64(r.Opts.RTT) / float64(time.Millisecond)
	rounds := ""
	if r.Opts.Rounds > 1 {
		rounds = fmt.Sprintf(" in each of %d rounds (every row in turn, each round; rows pool their rounds)", r.Opts.Rounds)
	}
	delay := ""
	if r.Opts.ReplyDelay > 0 {
		delay = fmt.Sprintf(", the parrot answering %v after the turn event", r.Opts.ReplyDelay)
	}
	fmt.Fprintf(w, "RTT %s added between Chromium and the relay (%s each way), %d cycles per mode%s (the conversation script: two user turns each, the second over the reply; resume's: six utterances each)%s, silence window %d ms subtracted from (a) and (b); %s; %s in all.\n\n",
		r.Opts.RTT, r.Opts.RTT/2, r.Opts.Cycles, rounds, delay, r.Silence, r.Browser, r.Duration.Round(time.Second))
	fmt.Fprintln(w, "| who cuts the reply | (a) speech end → stop at the backend, ms | (b) speech end → reply heard, ms | (c) user's onset → agent quiet in the page, ms | of which: onset → speech_started in the page, ms |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	cell := func(xs []float64) string {
		if len(xs) == 0 {
			return "–"
		}
		m, p := Stats(xs)
		return fmt.Sprintf("%.0f / %.0f (n=%d)", m, p, len(xs))
	}
	for _, m := range r.Modes {
		name := map[string]string{ModeEdge: "edge (turn detection in the transceiver)", ModeBackend: "backend (its own VAD, output.clear)",
			ModeTentative: fmt.Sprintf("tentative (edge, early pause %d ms: the reply prepared during the pause)", r.Opts.PauseMs),
			ModeResume:    "resume (edge, resume_false_interruption; coughs and backchannels over replies)",
			ModeEdgeHint:  fmt.Sprintf("edge, the page's receiver with jitterBufferTarget %d ms", r.Opts.JitterBufferTarget.Milliseconds())}[m.Name]
		fmt.Fprintf(w, "| %s%s | %s | %s | %s | %s |\n", name, r.ptimeNote(m), cell(m.StopAtBackend), cell(m.Reply), cell(m.Quiet), cell(m.Heard))
	}
	fmt.Fprintf(w, "| target (issue 12) | ≤ 30 | ≤ 1 RTT + 60 = %.0f | ≤ 1 RTT + 80 = %.0f | |\n", rtt+60, rtt+80)
	fmt.Fprintln(w, "| reference: LiveKit Agents default (0.5 s of speech before an interruption) | | | ≥ 500 + the same path | |")
	fmt.Fprintln(w, "| reference: Pipecat default (VAD start 0.2 s) | | | ≥ 200 + the same path | |")
	fmt.Fprintln(w, "\nCells: median / p90 (n = turns measured).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Where (b) went, per reply (medians / p90, ms; up + edge + browser = (b), up to the medians' rounding):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| who cuts the reply | up: speech end → speech_stopped in the page, − silence window | edge: speech_stopped → output_audio_buffer.started in the page | of which the agent | browser: started → reply heard | of which the reply's quiet lead | of which jitter buffer (getStats), first 300 ms | jitter buffer target |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, m := range r.Modes {
		s := m.Split
		fmt.Fprintf(w, "| %s%s | %s | %s | %s | %s | %s | %s | %s |\n", m.Name, r.ptimeNote(m), cell(s.Up), cell(s.Edge), cell(s.Agent), cell(s.Browser), cell(s.QuietLead), cell(s.JitterBuffer), cell(s.JitterTarget))
	}
	for _, pt := range r.Opts.Ptimes {
		fmt.Fprintf(w, "\nThe detector's speech end minus the page's on the same audio (the script through Opus in %d ms packets, the detector in %d ms frames), per utterance: %s ms.\n", pt, min(pt, vad.Frame20ms), cell(r.EndLag[pt]))
	}
	r.markdownTurnTaking(w)
	fmt.Fprintf(w, "Load average (1 min) at the start and the end: %s, %s.\n", r.Load[0], r.Load[1])
	fmt.Fprintln(w, "\nPer row: the microphone's packets (the call's length over getStats packetsSent, per run, ms) and the load average (1 min) at the start and end of each run:")
	fmt.Fprintln(w)
	for _, m := range r.Modes {
		var pk, ld []string
		for _, x := range m.ClientPacketMs {
			pk = append(pk, fmt.Sprintf("%.1f", x))
		}
		for _, l := range m.Loads {
			ld = append(ld, l[0]+"–"+l[1])
		}
		fmt.Fprintf(w, "* %s%s: a packet every %s ms; load %s\n", m.Name, r.ptimeNote(m), strings.Join(pk, ", "), strings.Join(ld, ", "))
	}
}

// ptimeNote names m's ptime in a row when the run compared several.
func (r *Result) ptimeNote(m Mode) string {
	if len(r.Opts.Ptimes) < 2 && m.Ptime == transceiver.DefaultPtime {
		return ""
	}
	return fmt.Sprintf(", ptime %d", m.Ptime)
}

func chromiumPath() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("voicebench: chromium not found on PATH")
}

func chromiumVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "Chromium"
	}
	return strings.TrimSpace(string(out))
}

// minLevel drops records under a level.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}
