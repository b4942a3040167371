package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/apm"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speakerphone"
	speechgen "github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// speakerphoneReplies is the number of agent replies per run of
// TestSpeakerphone: a few in CI, more by flag (docs/vad.md: 10; the
// issue's target is measured over 50).
var speakerphoneReplies = flag.Int("speakerphone.replies", 5, "agent replies per session of TestSpeakerphone (docs/vad.md: 10; issue 26's target: 50)")

// speakerphoneDump, when set, is a directory where each run with echo
// cancellation leaves its cleaner's dump (transceiver Config.EchoDumpDir)
// as <run>.apmdump, and the frames (20 ms, from the client's first) at
// which the user started talking as <run>.json, for replaying the call
// offline (internal/apm TestReplay).
var speakerphoneDump = flag.String("speakerphone.dump", "", "directory for the runs' echo dumps (internal/apm -apm.replay)")

// replyTexts are the agent's replies, in turn.
var replyTexts = []string{
	"Sure, I can help with that. Your table for two is booked for eight tonight.",
	"Is there anything else you would like me to do for you today?",
	"The weather tomorrow looks sunny with a light breeze from the west.",
	"I have sent the confirmation to your email address, please check it.",
}

// interruptText is what the user says one second into a reply in the
// interruption runs.
const interruptText = "Wait, stop please."

// phoneRun is one session of TestSpeakerphone.
type phoneRun struct {
	echo      bool            // the client's speakerphone echoes what it hears
	cleaning  json.RawMessage // turn_detection members: nil for none (the default)
	interrupt bool            // the user talks one second into each reply
	replies   int
	name      string // for the dump's file names
	opus      bool   // the backend takes and sends Opus (passthrough): ERLE is not measured
}

// phoneResult is what a run measured.
type phoneResult struct {
	replies  int     // replies played
	cutOff   int     // replies cleared by a speech start before the user spoke (or with no user)
	detected []int   // interruptions: ms from the user's onset to the speech start at the backend
	missed   int     // interruptions the detector did not report within 1 s
	erle     float64 // dB: the echo the client added over what the backend got, replies without the user
	// sent is the share of the replies after the first (which the guard
	// covers) that was sent before a speech start cut it: 1 when none was
	// cut.
	sent float64
	// replyERLE is erle per reply after the first, in order.
	replyERLE []float64
}

// TestSpeakerphone: a Pion client on a speakerphone with no echo
// canceller (internal/testsupport/speakerphone: what it hears comes back
// 150–300 ms later, the delay drifting, 6 dB down) talks to a PCM
// backend that replies again and again, asking for turn detection with
// interruption. Four sessions: the echo alone without cleaning (today)
// and with the transceiver's echo cancellation as it comes by default
// (the first reply guarded); the user interrupting each reply one second
// in, with no echo and no cleaning (today's onset time), and over the
// echo with cancellation.
//
// Issue 26's targets, checked: the echo cuts most replies off without
// cleaning and none with it; in the median reply the canceller and its
// gate take at least 30 dB of echo off (ERLE, about 60 dB here); every
// interruption over the cancelled echo is heard, in the median at most
// 200 ms later than with no echo (100 ms here: the 40 ms is not
// met, docs/vad.md says why). docs/vad.md has the 50-reply runs
// (-speakerphone.replies=50).
func TestSpeakerphone(t *testing.T) {
	speechgen.Require(t)
	n := *speakerphoneReplies
	if n < 2 {
		t.Fatalf("-speakerphone.replies=%d: the test needs 2 replies or more (the first is guarded)", n)
	}
	off := json.RawMessage(`{"echo_cancellation":null}`)
	today := phoneCall(t, phoneRun{echo: true, cleaning: off, replies: n})
	cleaned := phoneCall(t, phoneRun{echo: true, cleaning: json.RawMessage(`{"echo_cancellation":{"backend_audio":true}}`), replies: n, name: "echo"})
	t.Logf("echo alone, %d replies: cut off by their own echo: %d without cleaning, %d with echo cancellation; ERLE (the echo the client added over what the backend got) %.1f dB", n, today.cutOff, cleaned.cutOff, cleaned.erle)
	if today.cutOff < (n+1)/2 {
		t.Errorf("without cleaning only %d of %d replies were cut off by their echo: the test's echo proves nothing", today.cutOff, n)
	}
	if cleaned.cutOff > 0 {
		t.Errorf("with echo cancellation %d of %d replies were cut off by their own echo, want 0", cleaned.cutOff, n)
	}
	if m := medianFloat(cleaned.replyERLE); !(m >= 30) { // NaN: no reply measured
		t.Errorf("ERLE per reply after the first %v dB, median %.1f: want 30 dB or more", cleaned.replyERLE, m)
	}
	quiet := phoneCall(t, phoneRun{cleaning: off, interrupt: true, replies: n})
	barge := phoneCall(t, phoneRun{echo: true, cleaning: json.RawMessage(`{"echo_cancellation":{}}`), interrupt: true, replies: n, name: "barge"})
	t.Logf("interruptions: heard after %v ms with no echo and no cleaning (missed %d), %v ms over the echo with cancellation (missed %d; replies cut off before the user spoke: %d)", quiet.detected, quiet.missed, barge.detected, barge.missed, barge.cutOff)
	if barge.cutOff > 0 || barge.missed > 0 || len(barge.detected) != n {
		t.Errorf("over the cancelled echo %d of %d interruptions heard, %d missed, %d replies cut off before the user spoke; want all heard, none cut", len(barge.detected), n, barge.missed, barge.cutOff)
	}
	if len(quiet.detected) > 0 && len(barge.detected) > 0 {
		q, b := median(quiet.detected), median(barge.detected)
		t.Logf("median onset-to-start: %d ms with no echo, %d ms over the cancelled echo", q, b)
		if b > q+200 {
			t.Errorf("interruptions over the cancelled echo heard %d ms after their onset in the median, %d ms with no echo: want at most 200 ms more", b, q)
		}
	}
}

// TestSpeakerphoneOpus: TestSpeakerphone's echo with an Opus backend
// (passthrough: the backend's Opus goes to the client as it is, the
// client's to the backend), whose turn detector hears a 16 kHz copy of
// the input: echo cancellation cleans that copy. Without it the echo cuts
// most replies off, with it (the default) none, and interruptions over
// the echo are all heard.
func TestSpeakerphoneOpus(t *testing.T) {
	speechgen.Require(t)
	n := *speakerphoneReplies
	today := phoneCall(t, phoneRun{echo: true, cleaning: json.RawMessage(`{"echo_cancellation":null}`), replies: n, opus: true})
	cleaned := phoneCall(t, phoneRun{echo: true, replies: n, opus: true, name: "opus-echo"})
	t.Logf("Opus backend, echo alone, %d replies: cut off by their own echo: %d without cleaning, %d with echo cancellation", n, today.cutOff, cleaned.cutOff)
	if today.cutOff < (n+1)/2 {
		t.Errorf("without cleaning only %d of %d replies were cut off by their echo: the test's echo proves nothing", today.cutOff, n)
	}
	if cleaned.cutOff > 0 {
		t.Errorf("with echo cancellation %d of %d replies were cut off by their own echo, want 0", cleaned.cutOff, n)
	}
	barge := phoneCall(t, phoneRun{echo: true, interrupt: true, replies: n, opus: true, name: "opus-barge"})
	t.Logf("Opus backend, interruptions over the echo: heard after %v ms (missed %d; replies cut off before the user spoke: %d)", barge.detected, barge.missed, barge.cutOff)
	if barge.cutOff > 0 || barge.missed > 0 || len(barge.detected) != n {
		t.Errorf("over the cancelled echo %d of %d interruptions heard, %d missed, %d replies cut off before the user spoke; want all heard, none cut", len(barge.detected), n, barge.missed, barge.cutOff)
	}
}

// replyMs is the length of a 24 kHz PCM16 reply, ms.
func replyMs(pcm []byte) int64 { return int64(len(pcm) / 48) }

// TestNoEchoClientCleaning: a client with no echo at all (a headset, a
// browser's canceller; here a digitally silent microphone but for the
// user) and turn detection with echo cancellation as it comes by
// default: no reply is cut before the user speaks, and every
// interruption is heard, in the median as soon as with no cleaning (the
// canceller waits for an echo it never finds). Before quiet input frames
// passed the cleaner as they came (apm's quietDB), AEC2's comfort noise
// on the silent input started a turn about 240 ms into the first reply,
// in every run.
func TestNoEchoClientCleaning(t *testing.T) {
	speechgen.Require(t)
	r := phoneCall(t, phoneRun{cleaning: json.RawMessage(`{"echo_cancellation":{}}`), interrupt: true, replies: *speakerphoneReplies, name: "noecho"})
	t.Logf("no echo, echo cancellation on: interruptions heard after %v ms (missed %d), replies cut before the user spoke %d", r.detected, r.missed, r.cutOff)
	if r.cutOff > 0 {
		t.Errorf("%d of %d replies were cut before the user spoke, with no echo", r.cutOff, r.replies)
	}
	if r.missed > 0 || len(r.detected) == 0 {
		t.Errorf("interruptions: %d heard, %d missed; want all heard", len(r.detected), r.missed)
	}
	// With no echo found the input passes untouched, but in the guarded
	// first reply's 3 s: the detector alone decides when each is heard
	// (40 ms after the onset on a quiet machine).
	if m := median(r.detected); len(r.detected) > 0 && m > 80 {
		t.Errorf("interruptions heard %v ms after their onsets, median %d: want at most 80 (no cleaning: 40)", r.detected, m)
	}
}

func medianFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func median(xs []int) int {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// phoneCall runs one session of TestSpeakerphone.
func phoneCall(t *testing.T, run phoneRun) phoneResult {
	t.Helper()
	const rate = 24000
	var replies [][]byte
	for _, text := range replyTexts {
		s, err := speechgen.Say(text, rate)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 2*len(s))
		for i, v := range s {
			binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
		}
		replies = append(replies, b)
	}
	user, err := speechgen.Say(interruptText, 48000)
	if err != nil {
		t.Fatal(err)
	}
	td := map[string]any{}
	base, _ := json.Marshal(vad.DefaultTurnDetection())
	_ = json.Unmarshal(base, &td)
	if run.cleaning != nil {
		var extra map[string]any
		_ = json.Unmarshal(run.cleaning, &extra)
		for k, v := range extra {
			td[k] = v
		}
	}
	tdJSON, _ := json.Marshal(td)
	var mutate func(*transceiver.Config)
	dumpDir := ""
	if *speakerphoneDump != "" && run.name != "" {
		dumpDir = t.TempDir()
		mutate = func(cfg *transceiver.Config) { cfg.EchoDumpDir = dumpDir }
	}
	format := bridge.FormatPCM24k
	if run.opus {
		format = bridge.FormatOpus
	}
	_, c, sc := dialFormat(t, format, tdJSON, mutate)
	phone, err := speakerphone.New(speakerphone.Config{Off: !run.echo})
	if err != nil {
		t.Fatal(err)
	}

	// The backend: replies one after another, each once the previous
	// one stopped or was cleared and 800 ms passed.
	ag := &phoneAgent{sc: sc, replies: replies, n: run.replies, ended: make(chan struct{}), ctl: make(chan bridge.Control, 64)}
	if run.opus {
		ag.opusReplies = opusPackets(t, replies, rate)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); ag.read(ctx) }()
	go func() { defer wg.Done(); ag.play(ctx) }()
	defer func() { cancel(); _ = sc.Close(); wg.Wait() }()

	// The client: a 20 ms clock; each frame is the user (when talking)
	// plus the speakerphone's echo of what has arrived.
	enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1275)
	mic := make([]int16, 960)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var (
		fed       int        // received packets taken from the client
		pending   []rxPacket // received, not yet played
		lastRx    time.Time  // the last packet's arrival
		replyAt   time.Time  // the current reply's first packet
		talkFrom  = -1       // frame index at which the user's utterance starts
		onsets    []int      // frames where the user started talking
		echoPow   []float64  // per frame sent: the echo's power (no user)
		userFrame []bool     // per frame sent: the user talks
	)
	deadline := time.Now().Add(time.Duration(run.replies)*6*time.Second + 10*time.Second)
	frame := 0
	// The microphone's clock: frame k is captured at t0 + 20 ms × k, as
	// a device's audio clock runs, whenever a loaded machine gets to send
	// it; its RTP timestamps follow the same clock.
	t0 := time.Now()
	for {
		select {
		case <-ag.ended:
		case <-tick.C:
			if time.Now().After(deadline) {
				t.Fatalf("the agent's %d replies did not finish in time (%d played)", run.replies, ag.count())
			}
			got := c.receivedFrom(fed)
			fed += len(got)
			pending = append(pending, got...)
			// Every frame the microphone's clock owes by now: after a
			// stall, those it captured meanwhile leave late, together.
			for ; !t0.Add(time.Duration(frame+1) * 20 * time.Millisecond).After(time.Now()); frame++ {
				now := t0.Add(time.Duration(frame) * 20 * time.Millisecond)
				// The loudspeaker plays what arrived before the frame
				// was captured.
				i := 0
				for ; i < len(pending) && !pending[i].at.After(now); i++ {
					p := pending[i]
					if lastRx.IsZero() || p.at.Sub(lastRx) > 300*time.Millisecond {
						replyAt = p.at // a new reply begins
						if run.interrupt {
							talkFrom = -2 // schedule from the next frame's time
						}
					}
					phone.Received(p.payload, p.ts, p.at)
					lastRx = p.at
				}
				pending = pending[i:]
				if talkFrom == -2 && now.Sub(replyAt) >= time.Second {
					talkFrom = frame
					onsets = append(onsets, frame)
					ag.userSpoke(frame)
				}
				clear(mic)
				talking := talkFrom >= 0 && (frame-talkFrom)*960 < len(user)
				phone.Capture(mic, now)
				var e float64
				for _, v := range mic {
					e += float64(v) * float64(v)
				}
				echoPow = append(echoPow, e/960)
				if talking {
					off := (frame - talkFrom) * 960
					for i := range mic {
						if off+i < len(user) {
							mic[i] = int16(max(-32768, min(32767, int(mic[i])+int(user[off+i]))))
						}
					}
				}
				userFrame = append(userFrame, talking || (talkFrom >= 0 && (frame-talkFrom)*960 < len(user)+24000))
				nb, err := enc.Encode(mic, buf)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.track.WriteSample(media.Sample{Data: buf[:nb], Duration: 20 * time.Millisecond}); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		break
	}
	// Let the last frames reach the backend.
	time.Sleep(300 * time.Millisecond)
	cancel()
	_ = sc.Close()
	wg.Wait()
	if mutate != nil {
		saveDump(t, dumpDir, run.name, t0, onsets)
	}
	return ag.result(t, run, onsets, echoPow, userFrame)
}

// saveDump moves a run's dump from the transceiver's directory to
// -speakerphone.dump, beside the user's onsets: 20 ms frames of the
// client's microphone from its first, captured at t0.
func saveDump(t *testing.T, from, name string, t0 time.Time, onsets []int) {
	t.Helper()
	// The dump is whole once the session's cleaner is closed.
	for end := time.Now().Add(10 * time.Second); apm.Live() > 0 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	dumps, _ := filepath.Glob(filepath.Join(from, "*.apmdump"))
	if len(dumps) != 1 {
		t.Errorf("run %s: %d echo dumps (%v), want 1", name, len(dumps), dumps)
		return
	}
	b, err := os.ReadFile(dumps[0])
	if err == nil {
		err = os.WriteFile(filepath.Join(*speakerphoneDump, name+".apmdump"), b, 0o644)
	}
	if err == nil {
		j, _ := json.Marshal(map[string]any{"t0_unix_ns": t0.UnixNano(), "onset_frames": onsets})
		err = os.WriteFile(filepath.Join(*speakerphoneDump, name+".json"), j, 0o644)
	}
	if err != nil {
		t.Error(err)
	}
}

// opusPackets encodes each reply (PCM16 at rate) as 20 ms Opus packets.
func opusPackets(t *testing.T, replies [][]byte, rate int) [][][]byte {
	t.Helper()
	enc, err := opus.NewEncoder(rate, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	n := rate / 50
	var out [][][]byte
	for _, r := range replies {
		var pkts [][]byte
		pcm := make([]int16, n)
		buf := make([]byte, 1275)
		for off := 0; off < len(r)/2; off += n {
			clear(pcm)
			for i := range pcm {
				if j := 2 * (off + i); j+1 < len(r) {
					pcm[i] = int16(binary.LittleEndian.Uint16(r[j:]))
				}
			}
			m, err := enc.Encode(pcm, buf)
			if err != nil {
				t.Fatal(err)
			}
			pkts = append(pkts, slices.Clone(buf[:m]))
		}
		out = append(out, pkts)
	}
	return out
}

// phoneAgent is TestSpeakerphone's backend.
type phoneAgent struct {
	sc      *bridge.ServerConn
	replies [][]byte
	// opusReplies, for an Opus backend: each reply as 20 ms Opus packets.
	opusReplies [][][]byte
	n           int
	ended       chan struct{}
	ctl         chan bridge.Control

	mu     sync.Mutex
	frames int        // audio frames received
	pcm    [][]byte   // the audio received, per frame
	played int        // replies started
	from   []int      // frames received when each reply started
	sentMs []int64    // per reply: played_ms of its output.stopped or output.cleared
	cuts   []phoneCut // speech starts that cleared a reply
	starts []int      // frames at each input.speech_started
	spoke  []int      // frames at which the user started (told by the client)
}

type phoneCut struct {
	reply, frame int
}

func (a *phoneAgent) count() int { a.mu.Lock(); defer a.mu.Unlock(); return a.played }

func (a *phoneAgent) userSpoke(frame int) {
	a.mu.Lock()
	a.spoke = append(a.spoke, frame)
	a.mu.Unlock()
}

func (a *phoneAgent) read(ctx context.Context) {
	for {
		m, err := a.sc.Recv(ctx)
		if err != nil {
			return
		}
		switch {
		case m.Audio != nil:
			a.mu.Lock()
			a.frames++
			a.pcm = append(a.pcm, slices.Clone(m.Audio.Payload))
			a.mu.Unlock()
		case m.Control != nil:
			a.mu.Lock()
			if m.Control.Type == bridge.TypeInputSpeechStarted {
				a.starts = append(a.starts, a.frames)
			}
			a.mu.Unlock()
			select {
			case a.ctl <- *m.Control:
			default:
			}
		}
	}
}

// play sends the replies: each waits for the previous one's
// output.stopped or output.cleared, then 800 ms.
func (a *phoneAgent) play(ctx context.Context) {
	defer close(a.ended)
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return
	}
	for i := range a.n {
		a.mu.Lock()
		a.played++
		a.from = append(a.from, a.frames)
		a.mu.Unlock()
		_ = a.sc.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputResponse, ID: fmt.Sprintf("resp_%d", i)})
		if a.opusReplies != nil {
			for k, pkt := range a.opusReplies[i%len(a.opusReplies)] {
				if err := a.sc.SendAudio(ctx, bridge.AudioFrame{Seq: uint16(k), Timestamp: uint32(960 * k), Payload: pkt}); err != nil {
					return
				}
			}
		} else if err := a.sc.SendAudio(ctx, bridge.AudioFrame{Payload: a.replies[i%len(a.replies)]}); err != nil {
			return
		}
	wait:
		for {
			select {
			case c := <-a.ctl:
				switch c.Type {
				case bridge.TypeOutputCleared:
					a.mu.Lock()
					a.cuts = append(a.cuts, phoneCut{i, a.frames})
					a.sentMs = append(a.sentMs, c.PlayedMs)
					a.mu.Unlock()
					break wait
				case bridge.TypeOutputStopped:
					a.mu.Lock()
					a.sentMs = append(a.sentMs, c.PlayedMs)
					a.mu.Unlock()
					break wait
				}
			case <-time.After(15 * time.Second):
				return
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-time.After(800 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

// result reads the run's figures off what the backend and the client
// saw: positions are frames on the input clock (the client's 20 ms
// frames, all delivered on loopback).
func (a *phoneAgent) result(t *testing.T, run phoneRun, onsets []int, echoPow []float64, userFrame []bool) phoneResult {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := phoneResult{replies: a.played}
	for _, cut := range a.cuts {
		// A clear counts as the echo's when no user onset came in the
		// 1.5 s before it.
		byUser := false
		for _, o := range onsets {
			if o <= cut.frame && cut.frame-o < 75 {
				byUser = true
			}
		}
		if !byUser {
			r.cutOff++
		}
	}
	for _, o := range onsets {
		d := -1
		for _, s := range a.starts {
			if s >= o && s-o < 50 {
				d = (s - o) * 20
				break
			}
		}
		if d < 0 {
			r.missed++
			continue
		}
		r.detected = append(r.detected, d)
	}
	// ERLE over the frames with echo and without the user: the whole
	// run's, and each reply's after the first (its frames up to the next
	// reply's start).
	erle := func(from, to int) float64 {
		var in, out float64
		for i := from; i < min(to, len(echoPow)); i++ {
			p := echoPow[i]
			if i >= len(a.pcm) || (i < len(userFrame) && userFrame[i]) || p < 1 {
				continue
			}
			in += p
			for j := 0; j+1 < len(a.pcm[i]); j += 2 {
				v := float64(int16(binary.LittleEndian.Uint16(a.pcm[i][j:])))
				out += v * v / float64(len(a.pcm[i])/2)
			}
		}
		if out > 0 {
			return 10 * math.Log10(in/out)
		}
		return 0
	}
	r.erle = erle(0, len(echoPow))
	if run.opus {
		r.erle = math.NaN() // the backend gets the client's Opus: no cleaned audio to measure
	}
	for k := 1; k < len(a.from) && !run.opus; k++ {
		to := len(echoPow)
		if k+1 < len(a.from) {
			to = a.from[k+1]
		}
		r.replyERLE = append(r.replyERLE, math.Round(10*erle(a.from[k], to))/10)
	}
	var sent, whole int64
	for k := 1; k < len(a.sentMs); k++ {
		sent += min(a.sentMs[k], replyMs(a.replies[k%len(a.replies)]))
		whole += replyMs(a.replies[k%len(a.replies)])
	}
	if whole > 0 {
		r.sent = float64(sent) / float64(whole)
	}
	t.Logf("run echo=%v cleaning=%s interrupt=%v: %d replies, %d speech starts, cut off by echo %d, interruptions heard after %v ms (missed %d), ERLE %.1f dB (replies after the first: %v), replies after the first sent before a cut %.0f%% (played_ms %v)", run.echo, run.cleaning, run.interrupt, r.replies, len(a.starts), r.cutOff, r.detected, r.missed, r.erle, r.replyERLE, 100*r.sent, a.sentMs)
	return r
}
