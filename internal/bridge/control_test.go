package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/coder/websocket"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// TestControlRoundTrip sends every control message both ways and checks
// the PCM formats, the concealed flag and the hello option.
func TestControlRoundTrip(t *testing.T) {
	type got struct {
		msgs []bridge.Message
		err  error
	}
	backendGot := make(chan got, 1)
	toTransceiver := []bridge.Control{
		{Type: bridge.TypeOutputResponse, ID: "resp_1"},
		{Type: bridge.TypeOutputMark, Name: "m1"},
		{Type: bridge.TypeOutputClear},
		{Type: bridge.TypeInputTurnDetection, TurnDetection: json.RawMessage(`{"type":"server_vad","silence_duration_ms":300}`)},
		{Type: bridge.TypeInputTurnDetection, TurnDetection: json.RawMessage(`null`)},
	}
	toBackend := []bridge.Control{
		{Type: bridge.TypeInputSpeechStarted, AudioMs: 0},
		{Type: bridge.TypeInputSpeechStopped, AudioMs: 2340},
		{Type: bridge.TypeInputSpeechPaused, AudioMs: 2040},
		{Type: bridge.TypeInputSpeechResumed, AudioMs: 2100},
		{Type: bridge.TypeInputTimeoutTriggered, AudioMs: 9000},
		{Type: bridge.TypeOutputPaused, PlayedMs: 640},
		{Type: bridge.TypeOutputResumed, PlayedMs: 640},
		{Type: bridge.TypeOutputStarted},
		{Type: bridge.TypeOutputMark, Name: "m1"},
		{Type: bridge.TypeOutputMark, Name: "m2", Cleared: true},
		{Type: bridge.TypeOutputCleared, PlayedMs: 0},
		{Type: bridge.TypeOutputStopped, PlayedMs: 1260},
		{Type: bridge.TypeError, Code: bridge.ErrCodeQueueFull, Message: "full"},
	}
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{Formats: []string{bridge.FormatPCM16k}, NoOutputAudioBufferEvents: true,
			NoInputAudioBufferEvents: true, TurnDetection: json.RawMessage(`{"type":"server_vad","interrupt_response":false}`)})
		if err != nil {
			backendGot <- got{err: err}
			return
		}
		defer sc.Close()
		ctx := context.Background()
		for _, c := range toTransceiver {
			if err := sc.SendControl(ctx, c); err != nil {
				backendGot <- got{err: err}
				return
			}
		}
		var g got
		for range len(toBackend) + 1 {
			m, err := sc.Recv(ctx)
			if err != nil {
				g.err = err
				break
			}
			if m.Audio != nil {
				a := *m.Audio
				a.Payload = append([]byte(nil), a.Payload...)
				m.Audio = &a
			}
			g.msgs = append(g.msgs, m)
		}
		backendGot <- g
		_, _ = sc.Recv(ctx)
	}))
	ctx := testCtx(t)
	c := dial(t, url)
	if c.Format() != bridge.FormatPCM16k || bridge.SampleRate(c.Format()) != 16000 {
		t.Fatalf("format %q (rate %d), want %q at 16000", c.Format(), bridge.SampleRate(c.Format()), bridge.FormatPCM16k)
	}
	if c.OutputAudioBufferEvents() {
		t.Error("OutputAudioBufferEvents() = true, the backend's hello said false")
	}
	if c.InputAudioBufferEvents() {
		t.Error("InputAudioBufferEvents() = true, the backend's hello said false")
	}
	if got := string(c.TurnDetection()); got != `{"type":"server_vad","interrupt_response":false}` {
		t.Errorf("TurnDetection() = %s, want the hello's object", got)
	}
	for _, want := range toTransceiver {
		m, err := c.Recv(ctx)
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if m.Control == nil || !reflect.DeepEqual(*m.Control, want) {
			t.Fatalf("Recv = %+v, want control %+v", m, want)
		}
	}
	if err := c.SendAudio(ctx, bridge.AudioFrame{Seq: 1, Timestamp: 320, Payload: []byte{1, 2}, Concealed: true}); err != nil {
		t.Fatal(err)
	}
	for _, ctl := range toBackend {
		if err := c.SendControl(ctx, ctl); err != nil {
			t.Fatal(err)
		}
	}
	g := <-backendGot
	if g.err != nil {
		t.Fatal(g.err)
	}
	if a := g.msgs[0].Audio; a == nil || !a.Concealed || a.Seq != 1 || a.Timestamp != 320 {
		t.Fatalf("backend got %+v first, want the concealed frame", g.msgs[0])
	}
	for i, want := range toBackend {
		if m := g.msgs[i+1]; m.Control == nil || !reflect.DeepEqual(*m.Control, want) {
			t.Errorf("backend message %d = %+v, want %+v", i, m.Control, want)
		}
	}
	if err := c.SendControl(ctx, bridge.Control{Type: "output.bogus"}); err == nil {
		t.Error("SendControl of an unknown type succeeded")
	}
	if err := c.SendControl(ctx, bridge.Control{Type: bridge.TypeInputTurnDetection, TurnDetection: json.RawMessage(`"server_vad"`)}); err == nil {
		t.Error("SendControl of a turn_detection that is a string succeeded")
	}
}

// TestControlMalformed: a control message without its required member is a
// protocol error (1002).
func TestControlMalformed(t *testing.T) {
	for _, msg := range []string{
		`{"type":"output.mark"}`,
		`{"type":"output.mark","name":5}`,
		`{"type":"output.response"}`,
		`{"type":"output.cleared"}`,
		`{"type":"input.speech_started"}`,
		`{"type":"input.speech_stopped","audio_ms":"5"}`,
		`{"type":"input.speech_paused"}`,
		`{"type":"input.speech_resumed","audio_ms":1.5}`,
		`{"type":"input.timeout_triggered"}`,
		`{"type":"output.paused"}`,
		`{"type":"output.resumed","played_ms":null}`,
		`{"type":"input.turn_detection"}`,
		`{"type":"input.turn_detection","turn_detection":"server_vad"}`,
	} {
		t.Run(msg, func(t *testing.T) {
			closed := make(chan websocket.StatusCode, 1)
			url := rawServer(t, bridge.Subprotocol, func(ctx context.Context, ws *websocket.Conn) {
				_, _, _ = ws.Read(ctx)
				_ = writeJSON(ctx, ws, `{"type":"hello","version":1,"audio_format":"pcm16/24000/1"}`)
				_, _, _ = ws.Read(ctx) // session.start
				_ = writeJSON(ctx, ws, msg)
				closed <- readUntilClose(ctx, ws)
			})
			c := dial(t, url)
			if c.Format() != bridge.FormatPCM24k {
				t.Fatalf("format %q", c.Format())
			}
			if !c.OutputAudioBufferEvents() || !c.InputAudioBufferEvents() || c.TurnDetection() != nil {
				t.Error("hello without the members: want both event kinds on and no turn detection")
			}
			if _, err := c.Recv(testCtx(t)); !errors.Is(err, bridge.ErrProtocol) {
				t.Fatalf("Recv = %v, want ErrProtocol", err)
			}
			if code := <-closed; code != websocket.StatusProtocolError {
				t.Fatalf("backend saw close %d, want 1002", code)
			}
		})
	}
}

// TestNothingAfterEnd: once End has sent session.end, other sends fail
// with ErrClosed instead of following it on the wire.
func TestNothingAfterEnd(t *testing.T) {
	c := dial(t, echoURL(t))
	ctx := testCtx(t)
	if err := c.End(ctx, bridge.ReasonShutdown); err != nil {
		t.Fatal(err)
	}
	if err := c.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputStarted}); !errors.Is(err, bridge.ErrClosed) {
		t.Fatalf("SendControl after End = %v, want ErrClosed", err)
	}
	if err := c.SendAudio(ctx, bridge.AudioFrame{Payload: []byte{1}}); !errors.Is(err, bridge.ErrClosed) {
		t.Fatalf("SendAudio after End = %v, want ErrClosed", err)
	}
}
