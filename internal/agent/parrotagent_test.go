package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// pcmFrames returns n 20 ms frames at 24 kHz: a 300 Hz tone when loud,
// else digital silence.
func pcmFrames(n int, loud bool) []byte {
	b := make([]byte, 0, n*960)
	for i := range n * 480 {
		v := 0.0
		if loud {
			v = 9000 * math.Sin(2*math.Pi*300*float64(i)/24000)
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(int16(v)))
	}
	return b
}

// TestParrotAgentBridge plays the transceiver's side of the bridge against
// the parrot agent: its hello asks for PCM and turn detection; after a
// speech stop it sends the utterance back in one burst, tagged, without
// the quiet before the sound; when the user talks over it, it leaves the
// clear to the edge (interrupt_response) and sends nothing.
func TestParrotAgentBridge(t *testing.T) {
	h, err := NewParrotAgent(ParrotAgentConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bridge.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/bridge", bridge.SessionStart{SessionID: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Format() != bridge.FormatPCM24k {
		t.Errorf("format %q, want %q", c.Format(), bridge.FormatPCM24k)
	}
	var td vad.TurnDetection
	if err := json.Unmarshal(c.TurnDetection(), &td); err != nil || td != vad.DefaultTurnDetection() {
		t.Errorf("hello turn_detection %s (%v), want OpenAI's defaults", c.TurnDetection(), err)
	}

	// 0.5 s of silence, 1 s of "speech", 0.5 s of silence; the edge saw
	// the start at 200 ms (prefix padding) and the stop at 2000 ms.
	var ts uint32
	send := func(pcm []byte) {
		for off := 0; off < len(pcm); off += 960 {
			if err := c.SendAudio(ctx, bridge.AudioFrame{Timestamp: ts, Payload: pcm[off : off+960]}); err != nil {
				t.Fatal(err)
			}
			ts += 480
		}
	}
	send(pcmFrames(25, false))
	speech := pcmFrames(50, true)
	send(speech)
	send(pcmFrames(25, false))
	ctl := func(typ string, ms int64) {
		if err := c.SendControl(ctx, bridge.Control{Type: typ, AudioMs: ms}); err != nil {
			t.Fatal(err)
		}
	}
	ctl(bridge.TypeInputSpeechStarted, 200)
	ctl(bridge.TypeInputSpeechStopped, 2000)

	var reply []byte
	var tags []string
	for len(reply) < len(speech) {
		m, err := c.Recv(ctx)
		if err != nil {
			t.Fatalf("recv after %d bytes of reply: %v", len(reply), err)
		}
		switch {
		case m.Control != nil && m.Control.Type == bridge.TypeOutputResponse:
			tags = append(tags, m.Control.ID)
		case m.Control != nil:
			t.Errorf("unexpected %+v", m.Control)
		case m.Audio != nil:
			reply = append(reply, m.Audio.Payload...)
		}
	}
	if len(tags) != 1 || tags[0] != "resp_sb_1" {
		t.Errorf("response tags %q, want [resp_sb_1]", tags)
	}
	// The reply is the sound, from 2 ms (48 samples) before its first
	// sample at −40 dBFS (the sine's second), to the speech's end: the
	// padding's quiet start is trimmed.
	want := append(make([]byte, 2*47), speech...)
	if !bytes.Equal(reply, want) {
		t.Errorf("reply is %d bytes, want the %d bytes of speech after 2 ms of quiet", len(reply), len(want))
	}

	// The user talks over the reply: the edge clears; the parrot must
	// not send output.clear (a clear of the emptied queue is an error).
	ctl(bridge.TypeInputSpeechStarted, 2100)
	if err := c.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputCleared, PlayedMs: 400}); err != nil {
		t.Fatal(err)
	}
	if err := c.End(ctx, bridge.ReasonClientHangup); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := c.Recv(ctx)
		if err != nil {
			break
		}
		if m.Control != nil || m.Audio != nil {
			t.Errorf("after the interruption the parrot sent %+v", m)
		}
	}
}

// TestTrimLeadingQuiet: a reply starts 2 ms before its first sample at
// −40 dBFS, those 2 ms faded in from zero (no click where the quiet was
// cut), the rest as it was; the input is not modified.
func TestTrimLeadingQuiet(t *testing.T) {
	const rate, lead = 24000, 48            // 2 ms at 24 kHz
	pcm := func(samples ...[2]int) []byte { // runs of {count, value}
		var b []byte
		for _, r := range samples {
			for range r[0] {
				b = binary.LittleEndian.AppendUint16(b, uint16(int16(r[1])))
			}
		}
		return b
	}
	ramp := func(v int) []byte { // lead samples of v faded in
		var b []byte
		for k := range lead {
			b = binary.LittleEndian.AppendUint16(b, uint16(int16(v*k/lead)))
		}
		return b
	}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tt := range []struct {
		name string
		in   []byte
		want []byte
	}{
		{"quiet then sound", pcm([2]int{240, 0}, [2]int{100, 5000}), pcm([2]int{lead, 0}, [2]int{100, 5000})},
		{"a quiet hum before the sound: faded in", pcm([2]int{240, 300}, [2]int{100, -5000}), cat(ramp(300), pcm([2]int{100, -5000}))},
		{"the sound at once: its start faded in", pcm([2]int{100, 5000}), cat(ramp(5000), pcm([2]int{100 - lead, 5000}))},
		{"sound 1 ms in: all kept", pcm([2]int{24, 300}, [2]int{100, 5000}), cat(ramp(300)[:2*24], ramp(5000)[2*24:], pcm([2]int{100 - 24, 5000}))},
		{"just under −40 dBFS is quiet", pcm([2]int{240, 327}), nil},
		{"empty", nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := bytes.Clone(tt.in)
			got := trimLeadingQuiet(in, rate)
			if !bytes.Equal(got, tt.want) {
				t.Errorf("got %d bytes %v…, want %d bytes %v…", len(got), head(got), len(tt.want), head(tt.want))
			}
			if !bytes.Equal(in, tt.in) {
				t.Error("the input was modified")
			}
		})
	}
}

func head(b []byte) []byte { return b[:min(len(b), 16)] }

// TestQuietLead: the quiet lead a TraceReply reports is the time before
// the first 10 ms block at −45 dBFS RMS or more, in whole blocks.
func TestQuietLead(t *testing.T) {
	const rate = 24000
	block := rate / 100 // samples per 10 ms
	pcm := func(levels ...int16) []byte {
		var b []byte
		for _, l := range levels {
			for range block {
				b = append(b, byte(l), byte(uint16(l)>>8))
			}
		}
		return b
	}
	for _, tc := range []struct {
		name string
		pcm  []byte
		want int64
	}{
		{"sound at once", pcm(3000, 3000), 0},
		{"two quiet blocks", pcm(0, 100, 3000), 20},
		{"just under −45 dBFS", pcm(183, 3000), 10}, // 183/32768 = −45.06 dBFS
		{"just over −45 dBFS", pcm(185, 3000), 0},
		{"all quiet: its length", pcm(0, 0, 0), 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := quietLeadMs(tc.pcm, rate); got != tc.want {
				t.Errorf("quietLeadMs = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestParrotRefusesClientEvents: the parrot answers a client's event with
// an "error" event that names it (as OpenAI's Realtime API answers events
// it does not handle), so that a client learns at once that nothing will
// echo; text that is no event gets nothing, and a session sends at most
// maxRefusals such errors.
func TestParrotRefusesClientEvents(t *testing.T) {
	h, err := NewParrotAgent(ParrotAgentConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bridge.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/bridge", bridge.SessionStart{SessionID: "p2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, ev := range []string{`not json`, `{"id":"x"}`, `{"type":"ping","event_id":"evt_1","id":"abc"}`} {
		if err := c.SendEvent(ctx, []byte(ev)); err != nil {
			t.Fatal(err)
		}
	}
	for range maxRefusals + 4 {
		if err := c.SendEvent(ctx, []byte(`{"type":"ping"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Read until half a second passes without a message.
	var errs []map[string]any
	for {
		rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		m, err := c.Recv(rctx)
		rcancel()
		if err != nil {
			break
		}
		if m.Event != nil {
			var e map[string]any
			if err := json.Unmarshal(m.Event, &e); err != nil {
				t.Fatalf("event %q is not JSON", m.Event)
			}
			errs = append(errs, e)
		}
	}
	if len(errs) != maxRefusals {
		t.Fatalf("%d error events, want %d: %v", len(errs), maxRefusals, errs)
	}
	e, _ := errs[0]["error"].(map[string]any)
	if errs[0]["type"] != "error" || e["code"] != "unsupported_event" || e["event_id"] != "evt_1" ||
		!strings.Contains(e["message"].(string), `"ping"`) || !strings.Contains(e["message"].(string), "-mode echo") {
		t.Errorf("first error event %v", errs[0])
	}
}

// TestParrotAgentReplyDelay: with ReplyDelay and an early pause, the
// parrot answers input.speech_paused that long after it, and not again at
// the stop; a pause withdrawn (input.speech_resumed) before the delay is
// over gets no reply at all.
func TestParrotAgentReplyDelay(t *testing.T) {
	td := vad.DefaultTurnDetection()
	td.PauseDurationMs = 200
	const delay = 300 * time.Millisecond
	h, err := NewParrotAgent(ParrotAgentConfig{Logger: slog.New(slog.DiscardHandler), TurnDetection: &td, ReplyDelay: delay})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bridge.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/bridge", bridge.SessionStart{SessionID: "p3"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ts uint32
	send := func(pcm []byte) {
		for off := 0; off < len(pcm); off += 960 {
			if err := c.SendAudio(ctx, bridge.AudioFrame{Timestamp: ts, Payload: pcm[off : off+960]}); err != nil {
				t.Fatal(err)
			}
			ts += 480
		}
	}
	ctl := func(typ string, ms int64) {
		if err := c.SendControl(ctx, bridge.Control{Type: typ, AudioMs: ms}); err != nil {
			t.Fatal(err)
		}
	}
	// The messages, read in the background (a Recv whose context ends
	// closes the connection).
	type msg struct {
		kind string
		at   time.Time
	}
	msgs := make(chan msg, 1024)
	go func() {
		defer close(msgs)
		for {
			m, err := c.Recv(context.Background())
			if err != nil {
				return
			}
			kind := "other"
			switch {
			case m.Audio != nil:
				kind = "audio"
			case m.Control != nil:
				kind = m.Control.Type
			}
			msgs <- msg{kind, time.Now()}
		}
	}()
	// next returns the next message's kind and how long after the call it
	// came, or "" after wait without one.
	next := func(wait time.Duration) (string, time.Duration) {
		start := time.Now()
		select {
		case m := <-msgs:
			return m.kind, m.at.Sub(start)
		case <-time.After(wait):
			return "", 0
		}
	}
	// A pause withdrawn after 100 ms: nothing is sent.
	send(pcmFrames(25, false))
	send(pcmFrames(50, true))
	send(pcmFrames(10, false))
	ctl(bridge.TypeInputSpeechStarted, 200)
	ctl(bridge.TypeInputSpeechPaused, 1700)
	time.Sleep(delay / 3)
	ctl(bridge.TypeInputSpeechResumed, 1800)
	if kind, _ := next(2 * delay); kind != "" {
		t.Fatalf("got %s after a withdrawn pause, want nothing", kind)
	}
	// The same utterance goes on and pauses again: the reply comes the
	// delay after the pause, and the stop adds nothing.
	send(pcmFrames(25, true))
	send(pcmFrames(10, false))
	ctl(bridge.TypeInputSpeechPaused, 2400)
	kind, after := next(2 * delay)
	if kind != bridge.TypeOutputResponse || after < delay-20*time.Millisecond {
		t.Fatalf("after the pause: %s in %v, want output.response after about %v", kind, after, delay)
	}
	var n int
	for {
		kind, _ := next(100 * time.Millisecond)
		if kind != "audio" {
			break
		}
		n++
	}
	if n == 0 {
		t.Fatal("no reply audio after its tag")
	}
	ctl(bridge.TypeInputSpeechStopped, 2700)
	if kind, _ := next(2 * delay); kind != "" {
		t.Fatalf("got %s after the stop of a turn answered at its pause, want nothing", kind)
	}
}
