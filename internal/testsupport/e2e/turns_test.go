package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	speechgen "github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// turnBackend is a scripted PCM backend that asks for turn detection in
// its hello, counts the audio frames it receives, and records each
// control message with the number of frames that came before it: a
// position on the input clock that needs no wall clock.
type turnBackend struct {
	mu     sync.Mutex
	frames int
	msgs   []turnMsg
	got    chan struct{} // a control message arrived
}

type turnMsg struct {
	frames int // audio frames received before the message
	ctl    bridge.Control
}

func (b *turnBackend) serve(t *testing.T, sc *bridge.ServerConn, reply []byte) {
	ctx := context.Background()
	replied := false
	for {
		m, err := sc.Recv(ctx)
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
			b.msgs = append(b.msgs, turnMsg{b.frames, *m.Control})
			b.mu.Unlock()
			select {
			case b.got <- struct{}{}:
			default:
			}
			// The reply: one burst after the first utterance.
			if m.Control.Type == bridge.TypeInputSpeechStopped && !replied {
				replied = true
				_ = sc.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputResponse, ID: "resp_1"})
				for off := 0; off < len(reply); off += 64 << 10 {
					_ = sc.SendAudio(ctx, bridge.AudioFrame{Payload: reply[off:min(len(reply), off+64<<10)]})
				}
			}
		case m.End != nil:
			_ = sc.End(ctx, m.End.Reason)
			return
		}
	}
}

func (b *turnBackend) messages() []turnMsg {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]turnMsg(nil), b.msgs...)
}

// waitTurns waits up to 5 s for the backend to have n or more
// input.speech_started / input.speech_stopped controls, and returns those
// messages in arrival order; it fails t with every message so far if they
// do not all arrive.
func (b *turnBackend) waitTurns(t *testing.T, n int) []turnMsg {
	t.Helper()
	var turns []turnMsg
	deadline := time.After(5 * time.Second)
	for len(turns) < n {
		select {
		case <-b.got:
		case <-deadline:
			t.Fatalf("backend messages: %+v", b.messages())
		}
		turns = turns[:0]
		for _, m := range b.messages() {
			if m.ctl.Type == bridge.TypeInputSpeechStarted || m.ctl.Type == bridge.TypeInputSpeechStopped {
				turns = append(turns, m)
			}
		}
	}
	return turns
}

// waitTurnsNow returns how many turn messages the backend has had.
func (b *turnBackend) waitTurnsNow() int {
	n := 0
	for _, m := range b.messages() {
		if m.ctl.Type == bridge.TypeInputSpeechStarted || m.ctl.Type == bridge.TypeInputSpeechStopped {
			n++
		}
	}
	return n
}

// TestTurnDetectionBargeIn: a Pion client speaks, pauses, and speaks again
// over the agent's reply. The backend (PCM, turn detection asked for in
// its hello) gets input.speech_started / input.speech_stopped in order,
// then input.speech_started and the barge-in's output.cleared; the reply
// stops at the client within one frame of the frame that the onset was
// detected on; played_ms is the reply audio the client received; the
// client gets OpenAI's input_audio_buffer.speech_* events.
func TestTurnDetectionBargeIn(t *testing.T) {
	speechgen.Require(t)
	script, err := speechgen.NewScript(48000, 400, 0, "Hello there, how are you doing today?", "Wait, stop right there please.")
	if err != nil {
		t.Fatal(err)
	}
	first, second := script.Utterances[0], script.Utterances[1]
	s, c, tb := startTurnSession(t, bridge.FormatPCM24k, tone(6*time.Second), nil)

	enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1275)
	silence := make([]int16, 960)
	var sentAt []time.Time // when the client sent input frame i
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	send := func(pcm []int16) {
		n, err := enc.Encode(pcm, buf)
		if err != nil {
			t.Fatal(err)
		}
		<-tick.C
		if err := c.track.WriteSample(media.Sample{Data: buf[:n], Duration: 20 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		sentAt = append(sentAt, time.Now())
	}
	sendSpan := func(fromMs, toMs int) {
		for i := fromMs * 48; i+960 <= toMs*48; i += 960 {
			send(script.Samples[i : i+960])
		}
	}
	// The first utterance and the pause after it, until 1 s of the reply
	// has reached the client (bounded: the test fails below if it never
	// comes).
	sendSpan(0, second.StartMs) // the script has no pause: it is sent here
	for i := 0; i < 500 && len(c.received()) < 50; i++ {
		send(silence)
	}
	if len(c.received()) < 50 {
		t.Fatalf("the reply did not play: %d packets after the first utterance; backend got %+v", len(c.received()), tb.messages())
	}
	// The second utterance, over the reply, then a pause.
	secondAt := len(sentAt) * 20 // its first frame on the input clock, ms
	sendSpan(second.StartMs, second.EndMs)
	for range 50 {
		send(silence)
	}
	deadline := time.After(5 * time.Second)
	for len(tb.messages()) < 6 {
		select {
		case <-tb.got:
		case <-deadline:
			t.Fatalf("backend messages: %+v", tb.messages())
		}
	}
	// The barge-in's clear came well before the last message; its silence
	// tail, the last packets it sends, has then reached the client with
	// the reply's packets before it (a fixed 300 ms used to stand for it).
	received := waitClearTail(t, c, 0)

	msgs := tb.messages()
	var turns []turnMsg
	var cleared *turnMsg
	for i, m := range msgs {
		t.Logf("backend: after %4d frames: %+v", m.frames, m.ctl)
		switch m.ctl.Type {
		case bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped:
			turns = append(turns, m)
		case bridge.TypeOutputCleared:
			if cleared == nil {
				cleared = &msgs[i]
			}
		}
	}
	want := []string{bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped, bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped}
	if len(turns) != len(want) {
		t.Fatalf("turn messages %+v, want %v", turns, want)
	}
	for i, m := range turns {
		if m.ctl.Type != want[i] {
			t.Fatalf("turn message %d is %s, want %s", i, m.ctl.Type, want[i])
		}
		if i > 0 && m.ctl.AudioMs < turns[i-1].ctl.AudioMs {
			t.Errorf("audio_ms goes back: %d after %d", m.ctl.AudioMs, turns[i-1].ctl.AudioMs)
		}
	}
	// Positions on the input clock: the starts lie around the onsets (the
	// prefix padding before them), the first stop after the speech ended.
	pad := int64(vad.DefaultPrefixPaddingMs)
	for i, on := range []int64{int64(first.StartMs), int64(secondAt)} {
		got := turns[2*i].ctl.AudioMs + pad
		if got < on-100 || got > on+200 {
			t.Errorf("utterance %d starts at %d ms; speech_started audio_ms %d + padding %d = %d, want within -100/+200 ms", i+1, on, turns[2*i].ctl.AudioMs, pad, got)
		}
	}
	if stop := turns[1].ctl.AudioMs - vad.DefaultSilenceDurationMs; stop < int64(first.EndMs)-100 || stop > int64(first.EndMs)+200 {
		t.Errorf("utterance 1 ends at %d ms; speech_stopped audio_ms %d − silence %d = %d", first.EndMs, turns[1].ctl.AudioMs, vad.DefaultSilenceDurationMs, stop)
	}

	// Barge-in: output.cleared after the second start, without the
	// backend asking.
	if cleared == nil {
		t.Fatal("no output.cleared: the reply was not cut")
	}
	onset := turns[2]
	if cleared.frames < onset.frames || slicesIndex(msgs, *cleared) < slicesIndex(msgs, onset) {
		t.Errorf("output.cleared (after %d frames) came before input.speech_started (after %d)", cleared.frames, onset.frames)
	}
	rx, tail := withoutClearTail(t, received)
	if tail != clearTailPackets {
		t.Errorf("the barge-in's clear sent %d silence packets after the reply, want %d (docs/bridge.md §6.3)", tail, clearTailPackets)
	}
	if got := int64(len(rx)) * 20; cleared.ctl.PlayedMs != got {
		t.Errorf("played_ms %d, but the client received %d ms of the reply", cleared.ctl.PlayedMs, got)
	}
	if cleared.ctl.PlayedMs <= 1000 || cleared.ctl.PlayedMs >= 6000 {
		t.Errorf("played_ms %d: want the part of the 6 s reply before the interruption", cleared.ctl.PlayedMs)
	}
	// The onset was detected on input frame onset.frames-1 (the message
	// follows the frame that caused it). Reply packets that reached the
	// client after the client had sent that frame: the one in flight on
	// the clock's tick, and at most one more sent while the frame crossed
	// the relay.
	detected := sentAt[onset.frames-1]
	after := 0
	for _, p := range rx {
		if p.at.After(detected) {
			after++
		}
	}
	t.Logf("onset detected on input frame %d (%d ms after the second utterance began); reply packets received after the client sent it: %d; played_ms %d",
		onset.frames-1, (onset.frames-1)*20-secondAt, after, cleared.ctl.PlayedMs)
	if after > 2 {
		t.Errorf("%d reply packets reached the client after the frame the onset was detected on; want at most 2 (one frame)", after)
	}

	// The client's OpenAI events.
	waitAudioBufferEvents(t, c, "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "output_audio_buffer.started",
		"input_audio_buffer.speech_started", "output_audio_buffer.cleared", "input_audio_buffer.speech_stopped")
	for _, ev := range c.eventTypes() {
		switch ev["type"] {
		case "input_audio_buffer.speech_started":
			if _, ok := ev["audio_start_ms"].(float64); !ok || ev["item_id"] == "" || ev["event_id"] == "" {
				t.Errorf("speech_started event %v: want audio_start_ms, item_id, event_id", ev)
			}
		case "input_audio_buffer.speech_stopped":
			if _, ok := ev["audio_end_ms"].(float64); !ok || ev["item_id"] == "" || ev["event_id"] == "" {
				t.Errorf("speech_stopped event %v: want audio_end_ms, item_id, event_id", ev)
			}
		}
	}
	if v := counterValue(t, s.reg, "switchboard_transceiver_output_clears_total", "turn"); v != 1 {
		t.Errorf("clears{source=turn} = %v, want 1", v)
	}
}

func slicesIndex(msgs []turnMsg, m turnMsg) int {
	for i, x := range msgs {
		if x.frames == m.frames && x.ctl.Type == m.ctl.Type && x.ctl.AudioMs == m.ctl.AudioMs && x.ctl.PlayedMs == m.ctl.PlayedMs {
			return i
		}
	}
	return -1
}

// waitAudioBufferEvents waits until the client's input_audio_buffer.* and
// output_audio_buffer.* events are exactly want, in order.
func waitAudioBufferEvents(t *testing.T, c *testClient, want ...string) {
	t.Helper()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		got = got[:0]
		for _, ev := range c.eventTypes() {
			if typ, _ := ev["type"].(string); strings.HasPrefix(typ, "output_audio_buffer.") || strings.HasPrefix(typ, "input_audio_buffer.") {
				got = append(got, typ)
			}
		}
		if slices.Equal(got, want) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("client events %q, want %q", got, want)
}

// TestTurnDetectionAcrossDTX: the client stops sending for 2 s after an
// utterance, as with Opus DTX (the RTP timestamp jumps, the sequence
// numbers do not). The stop is placed where the speech ended (plus the
// silence window), not where the packets resumed, and sent in the gap,
// when the window ran out (the edge's wall-time fallback); the next
// utterance's start is on the input clock that includes the gap. It runs
// with 20 ms client packets and, at -ptime 10, 10 ms ones (the detector
// then on 10 ms frames, its wall-time silence in 10 ms steps).
func TestTurnDetectionAcrossDTX(t *testing.T) {
	speechgen.Require(t)
	for _, ptime := range []int{20, 10} {
		t.Run(strconv.Itoa(ptime), func(t *testing.T) { turnsAcrossDTX(t, ptime) })
	}
}

func turnsAcrossDTX(t *testing.T, ptime int) {
	script, err := speechgen.NewScript(48000, 400, 0, "Hello there, how are you doing today?", "Fine, thanks.")
	if err != nil {
		t.Fatal(err)
	}
	first, second := script.Utterances[0], script.Utterances[1]
	_, c, tb := startTurnSession(t, bridge.FormatPCM16k, nil, func(cfg *transceiver.Config) { cfg.Ptime = ptime })

	enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1275)
	pkt := ptime * 48 // samples per packet at 48 kHz
	packet := time.Duration(ptime) * time.Millisecond
	tick := time.NewTicker(packet)
	defer tick.Stop()
	clockMs := 0 // the input clock of the next frame
	send := func(pcm []int16, dur time.Duration) {
		n, err := enc.Encode(pcm, buf)
		if err != nil {
			t.Fatal(err)
		}
		<-tick.C
		if err := c.track.WriteSample(media.Sample{Data: buf[:n], Duration: dur}); err != nil {
			t.Fatal(err)
		}
		clockMs += int(dur / time.Millisecond)
	}
	const gap = 2 * time.Second
	// The first utterance, then what an Opus DTX encoder does: 200 ms of
	// silence sent (libopus enters DTX after 10 silent frames), the last
	// of which carries the gap, so the next packet's timestamp jumps by
	// it.
	silence := make([]int16, pkt)
	for i := 0; i+pkt <= first.EndMs*48; i += pkt {
		send(script.Samples[i:i+pkt], packet)
	}
	for i := range 200 / ptime {
		dur := packet
		if i == 200/ptime-1 {
			dur += gap
		}
		send(silence, dur)
	}
	time.Sleep(gap)
	for range 500 / ptime {
		send(silence, packet)
	}
	secondAt := clockMs
	for i := second.StartMs * 48; i+pkt <= second.EndMs*48; i += pkt {
		send(script.Samples[i:i+pkt], packet)
	}
	for range 800 / ptime {
		send(silence, packet)
	}
	turns := tb.waitTurns(t, 4)
	for _, m := range turns {
		t.Logf("backend: after %4d frames: %s audio_ms %d", m.frames, m.ctl.Type, m.ctl.AudioMs)
	}
	want := []string{bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped, bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped}
	for i, m := range turns[:4] {
		if m.ctl.Type != want[i] {
			t.Fatalf("turn message %d is %s, want %s", i, m.ctl.Type, want[i])
		}
	}
	// The first stop: speech end + the silence window, inside the gap.
	if stop := turns[1].ctl.AudioMs - vad.DefaultSilenceDurationMs; stop < int64(first.EndMs)-100 || stop > int64(first.EndMs)+100 {
		t.Errorf("utterance 1 ends at %d ms; speech_stopped audio_ms %d − silence = %d, want within ±100 ms (not at the end of the gap)", first.EndMs, turns[1].ctl.AudioMs, stop)
	}
	// It was sent in the gap, when the silence window ran out on wall
	// time, before any frame after the gap: not when the packets resumed.
	if got, before := turns[1].frames, first.EndMs/20+10; got > before {
		t.Errorf("speech_stopped came after %d frames, want it before the first frame after the gap (%d frames before it)", got, before)
	}
	// The second start on the input clock, gap included.
	if got := turns[2].ctl.AudioMs + vad.DefaultPrefixPaddingMs; got < int64(secondAt)-100 || got > int64(secondAt)+200 {
		t.Errorf("utterance 2 starts at %d ms on the input clock; speech_started audio_ms %d + padding = %d", secondAt, turns[2].ctl.AudioMs, got)
	}
}

// startTurnSession starts the PCM stack with a backend asking for format
// and the default turn detection, connects a client, and serves the
// backend session with a turnBackend that sends reply (nil: none).
// mutate (nil: none) changes the transceiver's configuration. The
// session ends with the test.
func startTurnSession(t *testing.T, format string, reply []byte, mutate func(*transceiver.Config)) (*pcmStack, *testClient, *turnBackend) {
	t.Helper()
	td, _ := json.Marshal(vad.DefaultTurnDetection())
	be := &scripted{opts: bridge.AcceptOptions{Formats: []string{format}, TurnDetection: td}, conns: make(chan *bridge.ServerConn, 1)}
	s := startPCMStack(t, be, mutate)
	c := dialClient(t, s.calls)
	var sc *bridge.ServerConn
	select {
	case sc = <-be.conns:
	case <-time.After(10 * time.Second):
		t.Fatal("no backend session")
	}
	tb := &turnBackend{got: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() { defer close(done); tb.serve(t, sc, reply) }()
	t.Cleanup(func() { _ = sc.Close(); <-done })
	return s, c, tb
}

// TestTurnDetectionTenMsPackets: at -ptime 10 a client sends 10 ms
// packets, and the transceiver's detector hears each as it is decoded, in
// 10 ms frames, while the backend gets 20 ms frames. Over three
// utterances the backend gets starts and stops in order, placed around
// the speech, and every stop is sent as soon as the packet that ends its
// silence window is in: with the backend's frames up to its audio_ms, or,
// for a stop that falls in the middle of a frame (audio_ms an odd
// multiple of 10), up to 10 ms before it, that frame's first half, which
// a 20 ms detector would have waited for the next packet to complete.
//
// The client paces its packets on a wall-clock ticker. When the ticker
// stalls (a loaded machine) for as long as the transceiver waits before
// it runs the silence window on wall time (turnsIdleGrace, 100 ms), the
// detector hears silence the client never sent, and the positions that
// follow are not the script's: such a run proves nothing either way, so
// it is run again on a new session (tenMsAttempts in all); every check
// holds on a run without a stall.
func TestTurnDetectionTenMsPackets(t *testing.T) {
	speechgen.Require(t)
	script, err := speechgen.NewScript(48000, 400, 900, "Hello there, how are you doing today?", "Fine, thanks.", "Book a table for two tonight.")
	if err != nil {
		t.Fatal(err)
	}
	var gaps []time.Duration
	for i := range tenMsAttempts {
		var gap time.Duration
		t.Run(fmt.Sprintf("attempt%d", i+1), func(t *testing.T) { gap = tenMsPackets(t, script) })
		if gap < tenMsStall {
			return // checked (passed or failed)
		}
		gaps = append(gaps, gap)
	}
	t.Fatalf("the client's packet ticker stalled for %v (≥ %v) in each of %d runs: nothing was checked", gaps, tenMsStall, tenMsAttempts)
}

const (
	// tenMsStall is the gap between two of the client's packets that
	// makes a TestTurnDetectionTenMsPackets run void: half the
	// transceiver's turnsIdleGrace (100 ms), the other half left for the
	// path from the client to the detector, which can delay a packet
	// further than its predecessor.
	tenMsStall = 50 * time.Millisecond
	// tenMsAttempts bounds the runs of TestTurnDetectionTenMsPackets.
	tenMsAttempts = 4
)

// tenMsPackets is one run of TestTurnDetectionTenMsPackets: it plays
// script at -ptime 10 and returns the largest gap between two of the
// client's packets; when that is at least tenMsStall it checks nothing
// more.
func tenMsPackets(t *testing.T, script *speechgen.Script) time.Duration {
	_, c, tb := startTurnSession(t, bridge.FormatPCM24k, nil, func(cfg *transceiver.Config) { cfg.Ptime = 10 })
	enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1275)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var last time.Time
	var gap time.Duration
	for i := 0; i+480 <= len(script.Samples); i += 480 {
		n, err := enc.Encode(script.Samples[i:i+480], buf)
		if err != nil {
			t.Fatal(err)
		}
		<-tick.C
		now := time.Now()
		if !last.IsZero() {
			gap = max(gap, now.Sub(last))
		}
		last = now
		if err := c.track.WriteSample(media.Sample{Data: buf[:n], Duration: 10 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("largest gap between the client's packets: %v", gap)
	if gap >= tenMsStall {
		t.Logf("the client's packet ticker stalled (≥ %v): this run is void", tenMsStall)
		return gap
	}
	want := 2 * len(script.Utterances)
	turns := tb.waitTurns(t, want)
	odd := 0
	for i, m := range turns {
		t.Logf("backend: after %4d frames (%d ms): %s audio_ms %d", m.frames, m.frames*20, m.ctl.Type, m.ctl.AudioMs)
		u := script.Utterances[i/2]
		if wantType := []string{bridge.TypeInputSpeechStarted, bridge.TypeInputSpeechStopped}[i%2]; m.ctl.Type != wantType {
			t.Fatalf("turn message %d is %s, want %s", i, m.ctl.Type, wantType)
		}
		if m.ctl.Type == bridge.TypeInputSpeechStarted {
			if got := m.ctl.AudioMs + vad.DefaultPrefixPaddingMs; got < int64(u.StartMs)-100 || got > int64(u.StartMs)+200 {
				t.Errorf("utterance %d starts at %d ms; speech_started audio_ms %d + padding = %d", i/2+1, u.StartMs, m.ctl.AudioMs, got)
			}
			continue
		}
		if end := m.ctl.AudioMs - vad.DefaultSilenceDurationMs; end < int64(u.EndMs)-100 || end > int64(u.EndMs)+40 {
			t.Errorf("utterance %d ends at %d ms; speech_stopped audio_ms %d − silence = %d", i/2+1, u.EndMs, m.ctl.AudioMs, end)
		}
		held := int64(m.frames) * 20
		switch {
		case m.ctl.AudioMs%20 == 10 && held == m.ctl.AudioMs-10:
			odd++ // sent with the first half of the frame
		case m.ctl.AudioMs%20 == 0 && held == m.ctl.AudioMs:
		default:
			t.Errorf("speech_stopped audio_ms %d came with the backend's frames up to %d ms: want the first packet that holds its position", m.ctl.AudioMs, held)
		}
	}
	if odd == 0 {
		t.Errorf("no stop fell in the middle of a 20 ms frame: the 10 ms grid is not shown (stops %+v)", turns)
	}
	return 0
}

// TestTurnDetectionSenderStall: the client's packets stop for 600 ms in
// the middle of an utterance and then come on with their timestamps
// unbroken, as from a stalled sender or a network that held them. That is
// not DTX (an encoder stops only after it has coded silence,
// vad.DTXLead), so the utterance goes on: one start and one stop, the stop
// at the speech's end plus the silence window, not in the stall.
func TestTurnDetectionSenderStall(t *testing.T) {
	speechgen.Require(t)
	script, err := speechgen.NewScript(48000, 400, 0, "Hello there, how are you doing today?")
	if err != nil {
		t.Fatal(err)
	}
	utt := script.Utterances[0]
	_, c, tb := startTurnSession(t, bridge.FormatPCM16k, nil, nil)
	enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1275)
	const pkt = 960 // 20 ms at 48 kHz
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	send := func(pcm []int16) {
		n, err := enc.Encode(pcm, buf)
		if err != nil {
			t.Fatal(err)
		}
		<-tick.C
		if err := c.track.WriteSample(media.Sample{Data: buf[:n], Duration: 20 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	stallAt := (utt.StartMs + (utt.EndMs-utt.StartMs)/2) * 48 / pkt * pkt // mid-speech
	for i := 0; i+pkt <= utt.EndMs*48; i += pkt {
		if i == stallAt {
			time.Sleep(600 * time.Millisecond)
		}
		send(script.Samples[i : i+pkt])
	}
	silence := make([]int16, pkt)
	for range 800 / 20 {
		send(silence)
	}
	turns := tb.waitTurns(t, 2)
	time.Sleep(100 * time.Millisecond) // a stray third message, if any, is in
	for _, m := range tb.messages() {
		t.Logf("backend: after %4d frames: %s audio_ms %d", m.frames, m.ctl.Type, m.ctl.AudioMs)
	}
	if turns[0].ctl.Type != bridge.TypeInputSpeechStarted || turns[1].ctl.Type != bridge.TypeInputSpeechStopped {
		t.Fatalf("turn messages %s, %s; want started, stopped", turns[0].ctl.Type, turns[1].ctl.Type)
	}
	if stop := turns[1].ctl.AudioMs - vad.DefaultSilenceDurationMs; stop < int64(utt.EndMs)-100 || stop > int64(utt.EndMs)+100 {
		t.Errorf("the utterance ends at %d ms (stalled at %d ms); speech_stopped audio_ms %d − silence = %d, want within ±100 ms", utt.EndMs, stallAt/48, turns[1].ctl.AudioMs, stop)
	}
	if got := tb.waitTurnsNow(); got != 2 {
		t.Errorf("%d turn messages, want 2: the stall ended the utterance", got)
	}
}
