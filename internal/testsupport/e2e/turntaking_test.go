package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/webrtc/v4/pkg/media"
	dto "github.com/prometheus/client_model/go"
	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	speechgen "github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// The turn-taking tests (issue 25): a Pion client speaks a script in real
// time, and a scripted PCM backend that asked for turn detection with the
// edge's turn-taking options reacts to the turn messages as a real one
// would: it prepares a reply at the early pause, or answers the stop.

// recBackend is a scripted PCM backend that records every control message
// with the audio frames received before it and its arrival time, and
// reacts to each through react, on its reader's goroutine.
type recBackend struct {
	sc    *bridge.ServerConn
	react func(b *recBackend, ctl bridge.Control)

	mu      sync.Mutex
	frames  int
	msgs    []recMsg
	replies int
	got     chan struct{}
}

type recMsg struct {
	frames int       // audio frames received before it
	at     time.Time // arrival
	ctl    bridge.Control
}

func (b *recBackend) serve() {
	ctx := context.Background()
	for {
		m, err := b.sc.Recv(ctx)
		if err != nil {
			return
		}
		switch {
		case m.Audio != nil:
			b.mu.Lock()
			b.frames++
			b.mu.Unlock()
		case m.Control != nil:
			b.mu.Lock()
			b.msgs = append(b.msgs, recMsg{b.frames, time.Now(), *m.Control})
			b.mu.Unlock()
			select {
			case b.got <- struct{}{}:
			default:
			}
			if b.react != nil {
				b.react(b, *m.Control)
			}
		case m.End != nil:
			_ = b.sc.End(ctx, m.End.Reason)
			return
		}
	}
}

// reply sends pcm (24 kHz) in one burst as a new response, resp_<n>, with
// a mark mark_<n> after it, and returns n.
func (b *recBackend) reply(pcm []byte) int {
	b.mu.Lock()
	b.replies++
	n := b.replies
	b.mu.Unlock()
	ctx := context.Background()
	_ = b.sc.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputResponse, ID: fmt.Sprint("resp_", n)})
	for off := 0; off < len(pcm); off += 64 << 10 {
		_ = b.sc.SendAudio(ctx, bridge.AudioFrame{Payload: pcm[off:min(len(pcm), off+64<<10)]})
	}
	_ = b.sc.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputMark, Name: fmt.Sprint("mark_", n)})
	return n
}

func (b *recBackend) messages() []recMsg {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.msgs)
}

// wait waits up to 10 s for a control message that ok accepts and
// returns it; it fails t with every message so far if none comes.
func (b *recBackend) wait(t *testing.T, what string, ok func(recMsg) bool) recMsg {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for _, m := range b.messages() {
			if ok(m) {
				return m
			}
		}
		select {
		case <-b.got:
		case <-deadline:
			b.log(t)
			t.Fatalf("backend: no %s", what)
		}
	}
}

// waitType waits for the n-th (from 1) control message of type typ.
func (b *recBackend) waitType(t *testing.T, typ string, n int) recMsg {
	t.Helper()
	seen := 0
	return b.wait(t, fmt.Sprintf("%s #%d", typ, n), func(m recMsg) bool {
		if m.ctl.Type == typ {
			seen++
		}
		return m.ctl.Type == typ && seen == n
	})
}

// types returns the types of the control messages received, in order,
// output.mark as output.mark:<name>[:cleared].
func (b *recBackend) types() []string {
	var out []string
	for _, m := range b.messages() {
		typ := m.ctl.Type
		if typ == bridge.TypeOutputMark {
			typ += ":" + m.ctl.Name
			if m.ctl.Cleared {
				typ += ":cleared"
			}
		}
		out = append(out, typ)
	}
	return out
}

func (b *recBackend) log(t *testing.T) {
	t.Helper()
	start := time.Time{}
	for _, m := range b.messages() {
		if start.IsZero() {
			start = m.at
		}
		t.Logf("backend +%5d ms, after %4d frames: %s audio_ms %d played_ms %d %s", m.at.Sub(start).Milliseconds(), m.frames, m.ctl.Type, m.ctl.AudioMs, m.ctl.PlayedMs, m.ctl.Name)
	}
}

// startTurnTaking starts the PCM stack (24 kHz) with a backend asking for
// td, connects a client, and serves the backend session with a
// recBackend reacting with react. mutate (nil: none) changes the
// transceiver's configuration.
func startTurnTaking(t *testing.T, td vad.TurnDetection, react func(*recBackend, bridge.Control), mutate func(*transceiver.Config)) (*pcmStack, *testClient, *recBackend) {
	t.Helper()
	raw, _ := json.Marshal(td)
	s, c, sc := dialPCM24k(t, raw, mutate)
	b := &recBackend{sc: sc, react: react, got: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() { defer close(done); b.serve() }()
	t.Cleanup(func() { _ = sc.Close(); <-done })
	return s, c, b
}

// dialPCM24k starts a PCM stack whose scripted backend takes 24 kHz PCM
// with turnDetection (raw JSON), dials one client, and returns the
// backend's connection of its session.
func dialPCM24k(t *testing.T, turnDetection json.RawMessage, mutate func(*transceiver.Config)) (*pcmStack, *testClient, *bridge.ServerConn) {
	t.Helper()
	return dialFormat(t, bridge.FormatPCM24k, turnDetection, mutate)
}

// dialFormat is dialPCM24k with a backend that asks for format.
func dialFormat(t *testing.T, format string, turnDetection json.RawMessage, mutate func(*transceiver.Config)) (*pcmStack, *testClient, *bridge.ServerConn) {
	t.Helper()
	be := &scripted{opts: bridge.AcceptOptions{Formats: []string{format}, TurnDetection: turnDetection}, conns: make(chan *bridge.ServerConn, 1)}
	s := startPCMStack(t, be, mutate)
	c := dialClient(t, s.calls)
	select {
	case sc := <-be.conns:
		return s, c, sc
	case <-time.After(10 * time.Second):
		t.Fatal("no backend session")
		return nil, nil, nil
	}
}

// mic sends 48 kHz speech to the client's track as Opus, one 20 ms packet
// per tick of a real-time ticker, and remembers when it sent each.
type mic struct {
	t      *testing.T
	c      *testClient
	enc    *opus.Encoder
	tick   *time.Ticker
	buf    []byte
	sentAt []time.Time // when packet i was sent (its audio is at i×20 ms on the input clock)
}

func newMic(t *testing.T, c *testClient) *mic {
	enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	m := &mic{t: t, c: c, enc: enc, tick: time.NewTicker(20 * time.Millisecond), buf: make([]byte, 1275)}
	t.Cleanup(m.tick.Stop)
	return m
}

// send sends samples, whole 20 ms packets (a short end is padded with
// silence).
func (m *mic) send(samples []int16) {
	for off := 0; off < len(samples); off += 960 {
		frame := samples[off:min(len(samples), off+960)]
		if len(frame) < 960 {
			frame = append(slices.Clone(frame), make([]int16, 960-len(frame))...)
		}
		n, err := m.enc.Encode(frame, m.buf)
		if err != nil {
			m.t.Fatal(err)
		}
		<-m.tick.C
		if err := m.c.track.WriteSample(media.Sample{Data: m.buf[:n], Duration: 20 * time.Millisecond}); err != nil {
			m.t.Fatal(err)
		}
		m.sentAt = append(m.sentAt, time.Now())
	}
}

// silence sends ms of silence.
func (m *mic) silence(ms int) { m.send(make([]int16, ms*48)) }

// silenceUntil sends silence until done reports true, at most maxMs; it
// reports whether done did.
func (m *mic) silenceUntil(maxMs int, done func() bool) bool {
	for range maxMs / 20 {
		if done() {
			return true
		}
		m.silence(20)
	}
	return done()
}

// say sends one utterance of sc (48 kHz).
func (m *mic) say(sc *speechgen.Script, i int) {
	u := sc.Utterances[i]
	m.send(sc.Samples[u.StartMs*48 : u.EndMs*48])
}

// askAndListen says sc's first utterance after 400 ms of silence, then
// sends silence until a second of b's reply has reached the client.
func (m *mic) askAndListen(sc *speechgen.Script, b *recBackend) {
	m.t.Helper()
	m.silence(400)
	m.say(sc, 0)
	if !m.silenceUntil(3000, func() bool { return len(replyPackets(m.t, m.c)) >= 50 }) {
		m.t.Fatalf("the reply did not play: backend got %q", b.types())
	}
}

// clockMs is the input clock's position of the next packet, ms.
func (m *mic) clockMs() int { return len(m.sentAt) * 20 }

// replyPackets returns the client's packets of reply audio: all but the
// silence a clear or a pause sends after the reply (ClearTailPacket).
func replyPackets(t *testing.T, c *testClient) []rxPacket {
	t.Helper()
	silence, err := transceiver.ClearTailPacket()
	if err != nil {
		t.Fatal(err)
	}
	var out []rxPacket
	for _, p := range c.received() {
		if string(p.payload) != string(silence) {
			out = append(out, p)
		}
	}
	return out
}

// clientEvents returns the client's oai-events of the given types (all
// when none), in order.
func clientEventsOf(c *testClient, types ...string) []map[string]any {
	var out []map[string]any
	for _, ev := range c.eventTypes() {
		if typ, _ := ev["type"].(string); len(types) == 0 || slices.Contains(types, typ) {
			out = append(out, ev)
		}
	}
	return out
}

// typesOf lists the "type" of each event.
func typesOf(evs []map[string]any) []string {
	var out []string
	for _, ev := range evs {
		typ, _ := ev["type"].(string)
		out = append(out, typ)
	}
	return out
}

// utterances makes a 48 kHz script of utterances back to back, for a mic
// to say one at a time: texts for espeak-ng, "(cough)" for a 200 ms
// cough-like burst (speech.Cough).
func utterances(t *testing.T, parts ...string) *speechgen.Script {
	t.Helper()
	speechgen.Require(t)
	sc := &speechgen.Script{Rate: 48000}
	for _, p := range parts {
		var err error
		if p == "(cough)" {
			err = sc.Cough(200)
		} else {
			err = sc.Say(p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return sc
}

// tentativeTurns is turn detection with the early pause at 200 ms.
func tentativeTurns() vad.TurnDetection {
	td := vad.DefaultTurnDetection()
	td.PauseDurationMs = 200
	return td
}

// TestTentativeTurnReplyPlaysOnStop: with pause_duration_ms, the backend
// gets input.speech_paused 200 ms after the speech ends, 300 ms before
// input.speech_stopped, and sends its reply at once. The edge holds it:
// nothing reaches the client before the stop; at the stop it plays at
// once, whole, and the client's events are those of a reply that
// answered the stop.
func TestTentativeTurnReplyPlaysOnStop(t *testing.T) {
	sc := utterances(t, "Hello there, how are you doing today?")
	reply := tone(time.Second)
	var replyAt time.Time
	s, c, b := startTurnTaking(t, tentativeTurns(), func(b *recBackend, ctl bridge.Control) {
		if ctl.Type == bridge.TypeInputSpeechPaused {
			replyAt = time.Now()
			b.reply(reply)
		}
	}, nil)
	m := newMic(t, c)
	m.silence(400)
	m.say(sc, 0)
	m.silenceUntil(2000, func() bool { return len(replyPackets(t, c)) >= 50 })
	stop := b.waitType(t, bridge.TypeInputSpeechStopped, 1)
	b.waitType(t, bridge.TypeOutputStopped, 1)
	b.log(t)
	paused := b.waitType(t, bridge.TypeInputSpeechPaused, 1)
	want := []string{bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechPaused, bridge.TypeInputSpeechStopped, bridge.TypeOutputStarted, "output.mark:mark_1", bridge.TypeOutputStopped}
	if got := b.types(); !slices.Equal(got, want) {
		t.Fatalf("backend messages %q, want %q", got, want)
	}
	if d := stop.ctl.AudioMs - paused.ctl.AudioMs; d != vad.DefaultSilenceDurationMs-200 {
		t.Errorf("speech_paused at %d ms, speech_stopped at %d: want the stop %d ms after the pause", paused.ctl.AudioMs, stop.ctl.AudioMs, vad.DefaultSilenceDurationMs-200)
	}
	rx := replyPackets(t, c)
	if len(rx) != 50 {
		t.Errorf("the client got %d reply packets, want 50 (1 s, whole)", len(rx))
	}
	// The reply was ready 300 ms before the stop and held: its first
	// packet left when the stop did, not before.
	first := rx[0].at
	t.Logf("reply sent by the backend %d ms before the stop reached it; its first packet reached the client %+d ms from the stop", stop.at.Sub(replyAt).Milliseconds(), first.Sub(stop.at).Milliseconds())
	if stop.at.Sub(replyAt) < 200*time.Millisecond {
		t.Fatalf("the backend sent its reply only %v before the stop: nothing was held", stop.at.Sub(replyAt))
	}
	// Not before the stop (the packet and the message leave together;
	// either may arrive first), and at once after it (a bound a loaded
	// machine's scheduling stays within, well under the 300 ms the reply
	// was held).
	if first.Before(stop.at.Add(-20*time.Millisecond)) || first.After(stop.at.Add(150*time.Millisecond)) {
		t.Errorf("the held reply's first packet reached the client %v from the stop; want it sent with the stop (−20 to +150 ms)", first.Sub(stop.at))
	}
	if ms := b.waitType(t, bridge.TypeOutputStopped, 1).ctl.PlayedMs; ms != 1000 {
		t.Errorf("output.stopped played_ms %d, want 1000", ms)
	}
	got := typesOf(clientEventsOf(c, "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "output_audio_buffer.started"))
	if want := []string{"input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "output_audio_buffer.started"}; !slices.Equal(got, want) {
		t.Errorf("client events %q, want %q", got, want)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_held_replies_total", "played"); v != 1 {
		t.Errorf("held_replies_total{played} = %v, want 1", v)
	}
	// The turn's latencies: the backend's reply came 200 ms after the
	// speech end (at the early pause), the first packet left at the stop,
	// 500 ms after it.
	for _, h := range []struct {
		stage    string
		min, max float64
	}{{"backend", 0.19, 0.45}, {"client", 0.49, 0.75}} {
		if n, v := histogramSample(t, s.reg, "switchboard_transceiver_turn_reply_seconds", h.stage); n != 1 || v < h.min || v > h.max {
			t.Errorf("turn_reply_seconds{stage=%s}: %d samples, %.3f s; want one from %v to %v s", h.stage, n, v, h.min, h.max)
		}
	}
}

// histogramSample returns the sample count and sum of the histogram name
// whose labels include the value label ("" for one without labels).
func histogramSample(t *testing.T, reg interface {
	Gather() ([]*dto.MetricFamily, error)
}, name, label string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetValue() == label
			}
			if match {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	t.Fatalf("no histogram %s{%s}", name, label)
	return 0, 0
}

// TestTentativeTurnDiscarded: the user pauses mid-sentence for 350 ms
// (past the early pause, short of the silence window) and goes on. The
// backend's reply to that tentative turn is discarded when the speech
// resumes: the backend is told (input.speech_resumed, its mark back
// cleared), and nothing of it reaches the client; the reply to the
// sentence's real end plays.
func TestTentativeTurnDiscarded(t *testing.T) {
	sc := utterances(t, "I would like to book a table", "for two at seven tonight.")
	s, c, b := startTurnTaking(t, tentativeTurns(), func(b *recBackend, ctl bridge.Control) {
		if ctl.Type == bridge.TypeInputSpeechPaused {
			b.reply(tone(time.Second))
		}
	}, nil)
	m := newMic(t, c)
	m.silence(400)
	m.say(sc, 0)
	m.silence(350) // the user goes on: a pause, not the end of the turn
	resumeAt := m.clockMs()
	m.say(sc, 1)
	m.silenceUntil(2500, func() bool { return len(replyPackets(t, c)) >= 50 })
	m.silence(300)
	b.waitType(t, bridge.TypeOutputStopped, 1)
	b.log(t)
	want := []string{
		bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechPaused, "output.mark:mark_1:cleared", bridge.TypeInputSpeechResumed,
		bridge.TypeInputSpeechPaused, bridge.TypeInputSpeechStopped, bridge.TypeOutputStarted, "output.mark:mark_2", bridge.TypeOutputStopped,
	}
	if got := b.types(); !slices.Equal(got, want) {
		t.Fatalf("backend messages %q, want %q", got, want)
	}
	resumed := b.waitType(t, bridge.TypeInputSpeechResumed, 1)
	if got := resumed.ctl.AudioMs; got < int64(resumeAt)-40 || got > int64(resumeAt)+100 {
		t.Errorf("speech_resumed audio_ms %d; the speech went on at %d ms", got, resumeAt)
	}
	rx := replyPackets(t, c)
	if len(rx) != 50 {
		t.Errorf("the client got %d reply packets, want 50: the second reply alone", len(rx))
	}
	var responses []string
	for _, ev := range clientEventsOf(c, "output_audio_buffer.started") {
		r, _ := ev["response_id"].(string)
		responses = append(responses, r)
	}
	if !slices.Equal(responses, []string{"resp_2"}) {
		t.Errorf("output_audio_buffer.started for responses %q, want resp_2 alone", responses)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_held_replies_total", "discarded"); v != 1 {
		t.Errorf("held_replies_total{discarded} = %v, want 1", v)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_held_replies_total", "played"); v != 1 {
		t.Errorf("held_replies_total{played} = %v, want 1", v)
	}
}

// resumingTurns is turn detection with resume_false_interruption.
func resumingTurns() vad.TurnDetection {
	td := vad.DefaultTurnDetection()
	td.ResumeFalseInterruption = true
	return td
}

// replyOnStop answers every speech stop that is a turn with reply: one
// not preceded by output.resumed (the stop of a cough or a backchannel).
func replyOnStop(reply []byte) func(*recBackend, bridge.Control) {
	backchannel := false
	return func(b *recBackend, ctl bridge.Control) {
		switch ctl.Type {
		case bridge.TypeInputSpeechStarted, bridge.TypeOutputCleared:
			backchannel = false
		case bridge.TypeOutputResumed:
			backchannel = true
		case bridge.TypeInputSpeechStopped:
			if !backchannel {
				b.reply(reply)
			}
		}
	}
}

// TestFalseInterruptionResumes: with resume_false_interruption, a cough
// and then a short backchannel ("Yeah.") over the agent's reply each
// pause it at once and let it resume where it paused: the backend gets
// output.paused and output.resumed with the same played_ms and no clear,
// the client switchboard.output_audio_buffer.paused / .resumed, and the
// whole reply reaches the client, none of it lost.
func TestFalseInterruptionResumes(t *testing.T) {
	sc := utterances(t, "Tell me about the weather tomorrow.", "(cough)", "Yeah.")
	const replyMs = 5000
	s, c, b := startTurnTaking(t, resumingTurns(), replyOnStop(tone(replyMs*time.Millisecond)), nil)
	m := newMic(t, c)
	m.askAndListen(sc, b)
	// Then the cough; a second more, the backchannel.
	m.say(sc, 1)
	m.silence(1000)
	m.say(sc, 2)
	m.silenceUntil(8000, func() bool { return slices.Contains(b.types(), bridge.TypeOutputStopped) })
	b.waitType(t, bridge.TypeOutputStopped, 1)
	b.log(t)
	want := []string{
		bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped, bridge.TypeOutputStarted,
		bridge.TypeInputSpeechStarted, bridge.TypeOutputPaused, bridge.TypeOutputResumed, bridge.TypeInputSpeechStopped,
		bridge.TypeInputSpeechStarted, bridge.TypeOutputPaused, bridge.TypeOutputResumed, bridge.TypeInputSpeechStopped,
		"output.mark:mark_1", bridge.TypeOutputStopped,
	}
	if got := b.types(); !slices.Equal(got, want) {
		t.Fatalf("backend messages %q, want %q", got, want)
	}
	for i := 1; i <= 2; i++ {
		p, r := b.waitType(t, bridge.TypeOutputPaused, i), b.waitType(t, bridge.TypeOutputResumed, i)
		if p.ctl.PlayedMs != r.ctl.PlayedMs || p.ctl.PlayedMs <= 0 || p.ctl.PlayedMs >= replyMs {
			t.Errorf("interruption %d: paused at played_ms %d, resumed at %d; want the same point within the reply", i, p.ctl.PlayedMs, r.ctl.PlayedMs)
		}
		t.Logf("interruption %d: the reply paused %d ms into it, for %d ms", i, p.ctl.PlayedMs, r.at.Sub(p.at).Milliseconds())
	}
	if ms := b.waitType(t, bridge.TypeOutputStopped, 1).ctl.PlayedMs; ms != replyMs {
		t.Errorf("output.stopped played_ms %d, want the whole reply, %d", ms, replyMs)
	}
	if rx := replyPackets(t, c); len(rx) != replyMs/20 {
		t.Errorf("the client got %d reply packets, want %d: the whole reply", len(rx), replyMs/20)
	}
	got := typesOf(clientEventsOf(c, "switchboard.output_audio_buffer.paused", "switchboard.output_audio_buffer.resumed", "output_audio_buffer.cleared"))
	if want := []string{"switchboard.output_audio_buffer.paused", "switchboard.output_audio_buffer.resumed", "switchboard.output_audio_buffer.paused", "switchboard.output_audio_buffer.resumed"}; !slices.Equal(got, want) {
		t.Errorf("client events %q, want %q", got, want)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_interruptions_total", "resumed"); v != 2 {
		t.Errorf("interruptions_total{resumed} = %v, want 2", v)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_output_clears_total", "turn"); v != 0 {
		t.Errorf("output_clears_total{turn} = %v, want 0", v)
	}
}

// TestRealInterruptionClears: with resume_false_interruption, a real
// interruption over the reply pauses it at once (no more than a frame of
// it reaches the client after the frame the onset was detected on), then,
// once it has the voiced speech of a turn, clears it: output.cleared's
// played_ms is what was sent before the pause, exactly the reply audio
// the client received.
func TestRealInterruptionClears(t *testing.T) {
	sc := utterances(t, "Tell me about the weather tomorrow.", "Wait, stop right there please.")
	// One reply, to the first turn: what the client receives is its part.
	s, c, b := startTurnTaking(t, resumingTurns(), func(b *recBackend, ctl bridge.Control) {
		if ctl.Type == bridge.TypeInputSpeechStopped && b.replies == 0 {
			b.reply(tone(6 * time.Second))
		}
	}, nil)
	m := newMic(t, c)
	m.askAndListen(sc, b)
	m.say(sc, 1)
	m.silence(1000)
	cleared := b.waitType(t, bridge.TypeOutputCleared, 1)
	onset := b.waitType(t, bridge.TypeInputSpeechStarted, 2)
	paused := b.waitType(t, bridge.TypeOutputPaused, 1)
	b.log(t)
	time.Sleep(200 * time.Millisecond) // the reply's packets in flight are in
	want := []string{
		bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped, bridge.TypeOutputStarted,
		bridge.TypeInputSpeechStarted, bridge.TypeOutputPaused, "output.mark:mark_1:cleared", bridge.TypeOutputCleared,
	}
	if got := b.types(); len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Fatalf("backend messages %q, want %q first", got, want)
	}
	rx := replyPackets(t, c)
	if cleared.ctl.PlayedMs != paused.ctl.PlayedMs || cleared.ctl.PlayedMs != int64(len(rx))*20 {
		t.Errorf("output.cleared played_ms %d, output.paused %d, the client received %d ms of the reply: want all three equal",
			cleared.ctl.PlayedMs, paused.ctl.PlayedMs, len(rx)*20)
	}
	detected := m.sentAt[onset.frames-1]
	after := 0
	for _, p := range rx {
		if p.at.After(detected) {
			after++
		}
	}
	t.Logf("paused %d ms into the reply; cleared %d ms after the onset was reported; %d reply packets after the detecting frame",
		paused.ctl.PlayedMs, cleared.at.Sub(onset.at).Milliseconds(), after)
	if after > 2 {
		t.Errorf("%d reply packets reached the client after the frame the onset was detected on; want at most 2", after)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_interruptions_total", "cleared"); v != 1 {
		t.Errorf("interruptions_total{cleared} = %v, want 1", v)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_interruptions_total", "resumed"); v != 0 {
		t.Errorf("interruptions_total{resumed} = %v, want 0", v)
	}
	// The onset to the edge's pause: the detector's delay in a quiet room.
	if n, v := histogramSample(t, s.reg, "switchboard_transceiver_interruption_quiet_seconds", ""); n != 1 || v <= 0 || v > 0.3 {
		t.Errorf("interruption_quiet_seconds: %d samples, %.3f s; want one under 300 ms", n, v)
	}
}

// TestIdleTimeout: with idle_timeout_ms, a session where nobody talks gets
// input.timeout_triggered (the client OpenAI's
// input_audio_buffer.timeout_triggered) once, the timeout after turn
// detection started; then after the user's turn and the agent's reply,
// once more, the timeout after the reply's audio ended: not after the
// speech, and not again while the quiet goes on.
func TestIdleTimeout(t *testing.T) {
	sc := utterances(t, "Hello there.")
	td := vad.DefaultTurnDetection()
	td.IdleTimeoutMs = 1500
	const replyMs = 800
	_, c, b := startTurnTaking(t, td, replyOnStop(tone(replyMs*time.Millisecond)), nil)
	m := newMic(t, c)
	m.silence(2500)
	m.say(sc, 0)
	m.silenceUntil(5000, func() bool { return len(clientEventsOf(c, "input_audio_buffer.timeout_triggered")) >= 2 })
	m.silence(2000) // a second timeout would come in this
	b.log(t)
	want := []string{
		bridge.TypeInputTimeoutTriggered,
		bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped, bridge.TypeOutputStarted, "output.mark:mark_1", bridge.TypeOutputStopped,
		bridge.TypeInputTimeoutTriggered,
	}
	if got := b.types(); !slices.Equal(got, want) {
		t.Fatalf("backend messages %q, want %q", got, want)
	}
	first, second := b.waitType(t, bridge.TypeInputTimeoutTriggered, 1), b.waitType(t, bridge.TypeInputTimeoutTriggered, 2)
	// The first: 1.5 s after the client's first packet.
	if after := first.at.Sub(m.sentAt[0]); after < 1300*time.Millisecond || after > 1900*time.Millisecond {
		t.Errorf("first timeout %v after the client's first packet, want about 1.5 s", after)
	}
	// The second: the timeout after the reply's audio ended, which was
	// the run's grace (200 ms) before output.stopped.
	stopped := b.waitType(t, bridge.TypeOutputStopped, 1)
	audioEnd := stopped.at.Add(-playoutGrace)
	after := second.at.Sub(audioEnd)
	t.Logf("second timeout %v after the reply's audio ended (timeout 1.5 s)", after.Round(time.Millisecond))
	if after < 1200*time.Millisecond || after > 1900*time.Millisecond {
		t.Errorf("second timeout %v after the reply's audio ended; want about 1.5 s (the speech ended %d ms before the reply did)", after, replyMs+vad.DefaultSilenceDurationMs)
	}
	evs := clientEventsOf(c, "input_audio_buffer.timeout_triggered")
	if len(evs) != 2 {
		t.Fatalf("client timeout events %v, want 2", evs)
	}
	// The positions: the quiet stretch on the input clock, which runs
	// with the client's packets (a loaded machine delays some).
	for _, ev := range evs {
		start, _ := ev["audio_start_ms"].(float64)
		end, _ := ev["audio_end_ms"].(float64)
		if id, _ := ev["item_id"].(string); !strings.HasPrefix(id, "item_sb_") || end-start < 1000 || end-start > 2000 {
			t.Errorf("client event %v: want an item_id and audio_end_ms − audio_start_ms about 1500", ev)
		}
	}
	if end, _ := evs[1]["audio_end_ms"].(float64); int64(end) != second.ctl.AudioMs {
		t.Errorf("client event %v, backend audio_ms %d: want the same position", evs[1], second.ctl.AudioMs)
	}
}

// playoutGrace is the run's grace after its last audio (docs/bridge.md
// §6.2): output.stopped comes that long after the reply's audio ended.
const playoutGrace = 200 * time.Millisecond

// TestPausedReplyClearedByBackend: with resume_false_interruption, speech
// over the reply pauses it, and the backend then clears the reply itself
// (it cuts its reply on input.speech_started, as many do). When that
// speech goes on to have the voiced time of a turn there is nothing left
// to clear: the edge sends no second output.cleared (the client no second
// output_audio_buffer.cleared), as a speech start with no run clears
// nothing (docs/bridge.md §4.8).
func TestPausedReplyClearedByBackend(t *testing.T) {
	sc := utterances(t, "Tell me about the weather tomorrow.", "Wait, stop right there please.")
	s, c, b := startTurnTaking(t, resumingTurns(), func(b *recBackend, ctl bridge.Control) {
		switch {
		case ctl.Type == bridge.TypeInputSpeechStopped && b.replies == 0:
			b.reply(tone(6 * time.Second))
		case ctl.Type == bridge.TypeOutputPaused:
			_ = b.sc.SendControl(context.Background(), bridge.Control{Type: bridge.TypeOutputClear})
		}
	}, nil)
	m := newMic(t, c)
	m.askAndListen(sc, b)
	m.say(sc, 1)
	m.silence(1000)
	b.waitType(t, bridge.TypeInputSpeechStopped, 2)
	time.Sleep(200 * time.Millisecond) // a second clear's messages would be in
	b.log(t)
	want := []string{
		bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped, bridge.TypeOutputStarted,
		bridge.TypeInputSpeechStarted, bridge.TypeOutputPaused, "output.mark:mark_1:cleared", bridge.TypeOutputCleared,
		bridge.TypeInputSpeechStopped,
	}
	if got := b.types(); !slices.Equal(got, want) {
		t.Fatalf("backend messages %q, want %q", got, want)
	}
	if got := typesOf(clientEventsOf(c, "output_audio_buffer.cleared")); len(got) != 1 {
		t.Errorf("client events %q, want one output_audio_buffer.cleared", got)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_output_clears_total", "turn"); v != 0 {
		t.Errorf("output_clears_total{turn} = %v, want 0: the backend cleared the reply", v)
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_output_clears_total", "backend"); v != 1 {
		t.Errorf("output_clears_total{backend} = %v, want 1", v)
	}
}

// TestTurnSwitchMidUtteranceReplyLatency: a backend that changes its
// turn detection while the user is talking gets input.speech_stopped at
// once, at the current position (docs/bridge.md §4.8), and answers it;
// the turn's latencies count from that moment: never negative, never
// from a moment still to come.
func TestTurnSwitchMidUtteranceReplyLatency(t *testing.T) {
	sc := utterances(t, "Tell me about the weather tomorrow and the day after that.")
	raw, _ := json.Marshal(vad.DefaultTurnDetection())
	s, c, b := startTurnTaking(t, vad.DefaultTurnDetection(), func(b *recBackend, ctl bridge.Control) {
		switch {
		case ctl.Type == bridge.TypeInputSpeechStarted && b.replies == 0:
			_ = b.sc.SendControl(context.Background(), bridge.Control{Type: bridge.TypeInputTurnDetection, TurnDetection: raw})
		case ctl.Type == bridge.TypeInputSpeechStopped && b.replies == 0:
			b.reply(tone(300 * time.Millisecond))
		}
	}, nil)
	m := newMic(t, c)
	m.silence(400)
	m.say(sc, 0)
	m.silenceUntil(3000, func() bool { return len(replyPackets(t, c)) > 0 })
	m.silence(200)
	b.log(t)
	stop := b.waitType(t, bridge.TypeInputSpeechStopped, 1)
	if stop.frames >= len(m.sentAt) {
		t.Fatalf("the first stop came after %d of %d packets: not mid-utterance", stop.frames, len(m.sentAt))
	}
	for _, stage := range []string{"backend", "client"} {
		if n, v := histogramSample(t, s.reg, "switchboard_transceiver_turn_reply_seconds", stage); n < 1 || v < 0 || v > float64(n)*0.5 {
			t.Errorf("turn_reply_seconds{stage=%s}: %d samples summing to %.3f s; want each from 0 to 0.5 s (the reply answered the stop at once)", stage, n, v)
		}
	}
}
