package agent_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startEcho serves the echo agent at /v1/bridge. done receives once per
// finished ServeHTTP call.
func startEcho(t *testing.T) (url string, done <-chan struct{}, logs *logbuf.Buffer) {
	t.Helper()
	logs = &logbuf.Buffer{}
	h := agent.NewEcho(slog.New(slog.NewTextHandler(logs, nil)))
	ch := make(chan struct{}, 16)
	mux := http.NewServeMux()
	mux.Handle("/v1/bridge", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ch <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/bridge", ch, logs
}

func waitDone(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("echo handler did not return")
	}
}

func TestEcho(t *testing.T) {
	tests := []struct {
		name     string
		finish   func(ctx context.Context, c *bridge.Conn) error
		wantLogs []string
	}{
		{
			name:     "transceiver ends",
			finish:   func(ctx context.Context, c *bridge.Conn) error { return c.End(ctx, bridge.ReasonClientHangup) },
			wantLogs: []string{"session start", "session_id=sess-1", "format=opus/48000/2", "session end", "reason=client_hangup", "audio_frames=20", "events=1"},
		},
		{
			name:     "connection drops",
			finish:   func(ctx context.Context, c *bridge.Conn) error { return c.Close() },
			wantLogs: []string{"session start", "session end", "reason=connection_closed"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, done, logs := startEcho(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := bridge.Dial(ctx, url, bridge.SessionStart{SessionID: "sess-1", Metadata: map[string]string{"k": "v"}})
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer c.Close()
			for i := range 20 {
				f := bridge.AudioFrame{Seq: uint16(i), Timestamp: uint32(i * 960), Payload: []byte{0xfc, byte(i)}}
				if err := c.SendAudio(ctx, f); err != nil {
					t.Fatalf("SendAudio: %v", err)
				}
				m, err := c.Recv(ctx)
				if err != nil {
					t.Fatalf("Recv: %v", err)
				}
				if m.Audio == nil || m.Audio.Seq != f.Seq || m.Audio.Timestamp != f.Timestamp || !bytes.Equal(m.Audio.Payload, f.Payload) {
					t.Fatalf("echo of %+v = %+v", f, m)
				}
			}
			ev := `{"type":"session.update","session":{"voice":"alloy"}}`
			if err := c.SendEvent(ctx, []byte(ev)); err != nil {
				t.Fatalf("SendEvent: %v", err)
			}
			if m, err := c.Recv(ctx); err != nil || string(m.Event) != ev {
				t.Fatalf("echo of event = %+v, %v", m, err)
			}
			if err := tt.finish(ctx, c); err != nil {
				t.Fatalf("finish: %v", err)
			}
			waitDone(t, done)
			out := logs.String()
			for _, w := range tt.wantLogs {
				if !strings.Contains(out, w) {
					t.Errorf("logs lack %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestEchoHandshakeFailure(t *testing.T) {
	url, done, logs := startEcho(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{bridge.Subprotocol}})
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"hello","version":1,"audio_formats":["pcm16/24000/1"]}`)); err != nil {
		t.Fatal(err)
	}
	_, _, err = ws.Read(ctx)
	if got := websocket.CloseStatus(err); got != bridge.CloseFormat {
		t.Fatalf("close = %d (%v), want %d", got, err, bridge.CloseFormat)
	}
	waitDone(t, done)
	if out := logs.String(); !strings.Contains(out, "bridge handshake failed") {
		t.Errorf("logs lack the handshake failure:\n%s", out)
	}
}

// TestEchoPCM: with a PCM format the agent picks it and sends frames back
// unchanged but for the concealed flag, which is the transceiver's.
func TestEchoPCM(t *testing.T) {
	if _, err := agent.NewEchoConfig(agent.EchoConfig{Format: "pcm16/44100/1"}); err == nil {
		t.Fatal("NewEchoConfig accepted pcm16/44100/1")
	}
	h, err := agent.NewEchoConfig(agent.EchoConfig{Logger: slog.New(slog.DiscardHandler), Format: bridge.FormatPCM16k})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bridge.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), bridge.SessionStart{SessionID: "pcm"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Format() != bridge.FormatPCM16k {
		t.Fatalf("format %q, want %q", c.Format(), bridge.FormatPCM16k)
	}
	f := bridge.AudioFrame{Seq: 7, Timestamp: 320, Payload: make([]byte, 640), Concealed: true}
	f.Payload[0] = 0x7f
	if err := c.SendAudio(ctx, f); err != nil {
		t.Fatal(err)
	}
	m, err := c.Recv(ctx)
	if err != nil || m.Audio == nil || m.Audio.Seq != 7 || m.Audio.Timestamp != 320 || !bytes.Equal(m.Audio.Payload, f.Payload) || m.Audio.Concealed {
		t.Fatalf("echo = %+v, %v", m.Audio, err)
	}
	_ = c.End(ctx, bridge.ReasonClientHangup)
}
