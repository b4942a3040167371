package bridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// serve starts a loopback HTTP server running h and returns its ws://
// URL. Cleanup waits until every handler call has returned (hijacked
// connections are not tracked by httptest).
func serve(t testing.TB, h http.Handler) string {
	t.Helper()
	var wg sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wg.Add(1)
		defer wg.Done()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("handlers still running 15 s after the test")
		}
	})
	return "ws" + srv.URL[len("http"):]
}

func echoURL(t *testing.T) string {
	return serve(t, agent.NewEcho(slog.New(slog.NewTextHandler(io.Discard, nil))))
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, url string) *bridge.Conn {
	t.Helper()
	c, err := bridge.Dial(testCtx(t), url, bridge.SessionStart{SessionID: "s1"})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestHandshake(t *testing.T) {
	type result struct {
		start  bridge.SessionStart
		format string
		err    error
	}
	got := make(chan result, 1)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{Formats: []string{"l16/8000/1", bridge.FormatOpus}})
		if err != nil {
			got <- result{err: err}
			return
		}
		defer sc.Close()
		got <- result{start: sc.Session(), format: sc.Format()}
		_, _ = sc.Recv(context.Background()) // until the client closes
	}))
	start := bridge.SessionStart{SessionID: "sess-42", Metadata: map[string]string{"remote": "192.0.2.1:5000", "ua": "test"},
		Session: []byte(`{"instructions":"Be brief.","voice":"marin","turn_detection":{"type":"server_vad"}}`)}
	c, err := bridge.Dial(testCtx(t), url, start)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	if c.Format() != bridge.FormatOpus {
		t.Errorf("client Format = %q, want %q", c.Format(), bridge.FormatOpus)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("Accept: %v", r.err)
	}
	if r.format != bridge.FormatOpus {
		t.Errorf("server Format = %q, want %q", r.format, bridge.FormatOpus)
	}
	if r.start.SessionID != start.SessionID || fmt.Sprint(r.start.Metadata) != fmt.Sprint(start.Metadata) ||
		string(r.start.Session) != string(start.Session) {
		t.Errorf("Session = %+v, want %+v", r.start, start)
	}
}

// TestDialSessionNotObject: session.start's "session" can only be a JSON
// object; Dial refuses anything else before connecting.
func TestDialSessionNotObject(t *testing.T) {
	for _, s := range []string{`[1]`, `"x"`, `{"a":`, `null`, ` `} {
		if _, err := bridge.Dial(testCtx(t), "ws://127.0.0.1:1/", bridge.SessionStart{SessionID: "s", Session: []byte(s)}); err == nil || !strings.Contains(err.Error(), "JSON object") {
			t.Errorf("Session %q: %v, want an error naming a JSON object", s, err)
		}
	}
}

func TestDialEmptySessionID(t *testing.T) {
	if _, err := bridge.Dial(testCtx(t), "ws://127.0.0.1:1/", bridge.SessionStart{}); err == nil {
		t.Fatal("Dial with empty session id succeeded")
	}
}

func TestAudioRoundTripEcho(t *testing.T) {
	c := dial(t, echoURL(t))
	ctx := testCtx(t)
	const n = 100
	frames := make([]bridge.AudioFrame, n)
	for i := range frames {
		payload := make([]byte, i*13%400) // includes an empty payload
		for j := range payload {
			payload[j] = byte(i + j)
		}
		frames[i] = bridge.AudioFrame{
			Seq:       uint16(65500 + i),                   // wraps
			Timestamp: uint32(0xffffffff - 960*50 + 960*i), // wraps
			Payload:   payload,
		}
	}
	errc := make(chan error, 1)
	go func() {
		for _, f := range frames {
			if err := c.SendAudio(ctx, f); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i, want := range frames {
		m, err := c.Recv(ctx)
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if m.Audio == nil || m.Event != nil || m.End != nil {
			t.Fatalf("Recv %d: got %+v, want audio only", i, m)
		}
		got := *m.Audio
		if got.Seq != want.Seq || got.Timestamp != want.Timestamp || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("frame %d: got seq=%d ts=%d len=%d, want seq=%d ts=%d len=%d",
				i, got.Seq, got.Timestamp, len(got.Payload), want.Seq, want.Timestamp, len(want.Payload))
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("SendAudio: %v", err)
	}
	if err := c.End(ctx, bridge.ReasonClientHangup); err != nil {
		t.Fatalf("End: %v", err)
	}
}

func TestEventRoundTripEcho(t *testing.T) {
	tests := []struct {
		name string
		data string
	}{
		{name: "json event", data: `{"type":"response.create","response":{"modalities":["audio"]}}`},
		{name: "empty", data: ""},
		{name: "plain text", data: "hello"},
		{name: "escapes", data: "quote \" backslash \\ newline \n tab \t nul \x00 bell \x07"},
		{name: "unicode", data: "façade ✓ 😀 \u2028"},
		{name: "large", data: string(bytes.Repeat([]byte("x"), 200_000))},
	}
	c := dial(t, echoURL(t))
	ctx := testCtx(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := c.SendEvent(ctx, []byte(tt.data)); err != nil {
				t.Fatalf("SendEvent: %v", err)
			}
			m, err := c.Recv(ctx)
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			if m.Event == nil || m.Audio != nil || m.End != nil {
				t.Fatalf("got %+v, want an event only", m)
			}
			if string(m.Event) != tt.data {
				t.Fatalf("event = %q, want %q", m.Event, tt.data)
			}
		})
	}
	if err := c.SendEvent(ctx, []byte{0xff, 0xfe}); !errors.Is(err, bridge.ErrInvalidEvent) {
		t.Fatalf("SendEvent(invalid UTF-8) = %v, want ErrInvalidEvent", err)
	}
}

// TestConcurrentSends sends audio and events from several goroutines at
// once (run with -race) and checks the echo returns all of them.
func TestConcurrentSends(t *testing.T) {
	c := dial(t, echoURL(t))
	ctx := testCtx(t)
	const senders, perSender = 4, 50
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range perSender {
				var err error
				if s%2 == 0 {
					err = c.SendAudio(ctx, bridge.AudioFrame{Seq: uint16(s*1000 + i), Payload: []byte{byte(s), byte(i)}})
				} else {
					err = c.SendEvent(ctx, fmt.Appendf(nil, `{"s":%d,"i":%d}`, s, i))
				}
				if err != nil {
					t.Errorf("send: %v", err)
					return
				}
			}
		})
	}
	seen := map[string]bool{}
	for range senders * perSender {
		m, err := c.Recv(ctx)
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		switch {
		case m.Audio != nil:
			f := m.Audio
			if len(f.Payload) != 2 || uint16(f.Payload[0])*1000+uint16(f.Payload[1]) != f.Seq {
				t.Fatalf("corrupt frame %+v", *f)
			}
			seen[fmt.Sprint("a", f.Seq)] = true
		case m.Event != nil:
			seen[string(m.Event)] = true
		}
	}
	wg.Wait()
	if len(seen) != senders*perSender {
		t.Fatalf("got %d distinct messages, want %d", len(seen), senders*perSender)
	}
}

func TestSessionEnd(t *testing.T) {
	tests := []struct {
		name      string
		serverEnd bool // the backend ends; otherwise the transceiver does
	}{
		{name: "transceiver ends", serverEnd: false},
		{name: "backend ends", serverEnd: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			serverGot := make(chan bridge.Message, 1)
			serverErr := make(chan error, 1)
			url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sc, err := bridge.Accept(w, r, bridge.AcceptOptions{})
				if err != nil {
					serverErr <- err
					return
				}
				defer sc.Close()
				ctx := context.Background()
				if tt.serverEnd {
					serverErr <- sc.End(ctx, bridge.ReasonDone)
					return
				}
				m, err := sc.Recv(ctx)
				if err != nil {
					serverErr <- err
					return
				}
				serverGot <- m
				serverErr <- sc.End(ctx, "ignored: peer ended")
			}))
			c := dial(t, url)
			ctx := testCtx(t)
			if tt.serverEnd {
				m, err := c.Recv(ctx)
				if err != nil {
					t.Fatalf("Recv: %v", err)
				}
				if m.End == nil || m.End.Reason != bridge.ReasonDone {
					t.Fatalf("Recv = %+v, want End{%q}", m, bridge.ReasonDone)
				}
				if err := c.End(ctx, "ignored"); err != nil {
					t.Fatalf("End after peer end: %v", err)
				}
			} else {
				if err := c.End(ctx, bridge.ReasonICEFailed); err != nil {
					t.Fatalf("End: %v", err)
				}
				m := <-serverGot
				if m.End == nil || m.End.Reason != bridge.ReasonICEFailed {
					t.Fatalf("server Recv = %+v, want End{%q}", m, bridge.ReasonICEFailed)
				}
			}
			if err := <-serverErr; err != nil {
				t.Fatalf("server: %v", err)
			}
			// Idempotent, and the connection is closed afterwards.
			if err := c.End(ctx, "again"); err != nil {
				t.Fatalf("second End: %v", err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if _, err := c.Recv(ctx); !errors.Is(err, bridge.ErrClosed) {
				t.Fatalf("Recv after End = %v, want ErrClosed", err)
			}
			if err := c.SendAudio(ctx, bridge.AudioFrame{}); !errors.Is(err, bridge.ErrClosed) {
				t.Fatalf("SendAudio after End = %v, want ErrClosed", err)
			}
		})
	}
}

// TestConnectionDrop checks that an abrupt Close on either side
// unblocks the other side's Recv with ErrClosed.
func TestConnectionDrop(t *testing.T) {
	tests := []struct {
		name       string
		serverDrop bool
	}{
		{name: "transceiver drops", serverDrop: false},
		{name: "backend drops", serverDrop: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			serverErr := make(chan error, 1)
			url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sc, err := bridge.Accept(w, r, bridge.AcceptOptions{})
				if err != nil {
					serverErr <- err
					return
				}
				defer sc.Close()
				if tt.serverDrop {
					serverErr <- sc.Close()
					return
				}
				_, err = sc.Recv(context.Background())
				serverErr <- err
			}))
			c := dial(t, url)
			if tt.serverDrop {
				if _, err := c.Recv(testCtx(t)); !errors.Is(err, bridge.ErrClosed) {
					t.Fatalf("Recv = %v, want ErrClosed", err)
				}
				if err := <-serverErr; err != nil {
					t.Fatalf("server Close: %v", err)
				}
				return
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := <-serverErr; !errors.Is(err, bridge.ErrClosed) {
				t.Fatalf("server Recv = %v, want ErrClosed", err)
			}
		})
	}
}

func TestFormatMismatch(t *testing.T) {
	acceptErr := make(chan error, 1)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := bridge.Accept(w, r, bridge.AcceptOptions{Formats: []string{"l16/8000/1"}})
		acceptErr <- err
	}))
	_, err := bridge.Dial(testCtx(t), url, bridge.SessionStart{SessionID: "s1"})
	if !errors.Is(err, bridge.ErrFormat) {
		t.Fatalf("Dial = %v, want ErrFormat", err)
	}
	if err := <-acceptErr; !errors.Is(err, bridge.ErrFormat) {
		t.Fatalf("Accept = %v, want ErrFormat", err)
	}
}

// rawServer serves a hand-written backend: it accepts the WebSocket with
// subprotocol proto, then runs script.
func rawServer(t *testing.T, proto string, script func(ctx context.Context, ws *websocket.Conn)) string {
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opts := &websocket.AcceptOptions{}
		if proto != "" {
			opts.Subprotocols = []string{proto}
		}
		ws, err := websocket.Accept(w, r, opts)
		if err != nil {
			t.Errorf("raw accept: %v", err)
			return
		}
		defer ws.CloseNow()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		script(ctx, ws)
	}))
}

func writeJSON(ctx context.Context, ws *websocket.Conn, s string) error {
	return ws.Write(ctx, websocket.MessageText, []byte(s))
}

// readUntilClose reads until the peer closes and returns its close code.
func readUntilClose(ctx context.Context, ws *websocket.Conn) websocket.StatusCode {
	for {
		if _, _, err := ws.Read(ctx); err != nil {
			return websocket.CloseStatus(err)
		}
	}
}

func TestDialVersionMismatch(t *testing.T) {
	tests := []struct {
		name      string
		proto     string
		answer    string
		wantClose websocket.StatusCode
	}{
		{name: "no subprotocol", proto: "", wantClose: bridge.CloseVersion},
		{name: "hello version 2", proto: bridge.Subprotocol, answer: `{"type":"hello","version":2,"audio_format":"opus/48000/2"}`, wantClose: bridge.CloseVersion},
		{name: "hello without version", proto: bridge.Subprotocol, answer: `{"type":"hello","audio_format":"opus/48000/2"}`, wantClose: bridge.CloseVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			closed := make(chan websocket.StatusCode, 1)
			url := rawServer(t, tt.proto, func(ctx context.Context, ws *websocket.Conn) {
				if tt.answer != "" {
					if _, _, err := ws.Read(ctx); err != nil { // hello
						t.Errorf("read hello: %v", err)
					}
					_ = writeJSON(ctx, ws, tt.answer)
				}
				closed <- readUntilClose(ctx, ws)
			})
			_, err := bridge.Dial(testCtx(t), url, bridge.SessionStart{SessionID: "s1"})
			if !errors.Is(err, bridge.ErrVersion) {
				t.Fatalf("Dial = %v, want ErrVersion", err)
			}
			if got := <-closed; got != tt.wantClose {
				t.Fatalf("backend saw close %d, want %d", got, tt.wantClose)
			}
		})
	}
}

func TestDialBadAnswer(t *testing.T) {
	tests := []struct {
		name      string
		answer    string
		wantErr   error
		wantClose websocket.StatusCode
	}{
		{name: "format not offered", answer: `{"type":"hello","version":1,"audio_format":"pcm16/8000/1"}`, wantErr: bridge.ErrFormat, wantClose: bridge.CloseFormat},
		{name: "not json", answer: `hello`, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "event before hello", answer: `{"type":"event","data":"x"}`, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			closed := make(chan websocket.StatusCode, 1)
			url := rawServer(t, bridge.Subprotocol, func(ctx context.Context, ws *websocket.Conn) {
				_, _, _ = ws.Read(ctx)
				_ = writeJSON(ctx, ws, tt.answer)
				closed <- readUntilClose(ctx, ws)
			})
			_, err := bridge.Dial(testCtx(t), url, bridge.SessionStart{SessionID: "s1"})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Dial = %v, want %v", err, tt.wantErr)
			}
			if got := <-closed; got != tt.wantClose {
				t.Fatalf("backend saw close %d, want %d", got, tt.wantClose)
			}
		})
	}
}

// TestAcceptErrors drives Accept with a hand-written transceiver.
func TestAcceptErrors(t *testing.T) {
	tests := []struct {
		name      string
		msgs      []string
		wantErr   error
		wantClose websocket.StatusCode
	}{
		{name: "hello version 2", msgs: []string{`{"type":"hello","version":2,"audio_formats":["opus/48000/2"]}`}, wantErr: bridge.ErrVersion, wantClose: bridge.CloseVersion},
		{name: "no common format", msgs: []string{`{"type":"hello","version":1,"audio_formats":["pcm16/24000/1"]}`}, wantErr: bridge.ErrFormat, wantClose: bridge.CloseFormat},
		{name: "malformed hello", msgs: []string{`{"type":`}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "session.start first", msgs: []string{`{"type":"session.start","session_id":"x"}`}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{
			name:      "session.start without id",
			msgs:      []string{`{"type":"hello","version":1,"audio_formats":["opus/48000/2"]}`, `{"type":"session.start"}`},
			wantErr:   bridge.ErrProtocol,
			wantClose: websocket.StatusProtocolError,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			acceptErr := make(chan error, 1)
			url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, err := bridge.Accept(w, r, bridge.AcceptOptions{HandshakeTimeout: 5 * time.Second})
				acceptErr <- err
			}))
			ctx := testCtx(t)
			ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{bridge.Subprotocol}})
			if err != nil {
				t.Fatalf("raw dial: %v", err)
			}
			defer ws.CloseNow()
			for _, m := range tt.msgs {
				if err := writeJSON(ctx, ws, m); err != nil {
					t.Fatalf("write: %v", err)
				}
			}
			if got := readUntilClose(ctx, ws); got != tt.wantClose {
				t.Errorf("transceiver saw close %d, want %d", got, tt.wantClose)
			}
			if err := <-acceptErr; !errors.Is(err, tt.wantErr) {
				t.Fatalf("Accept = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestAcceptWithoutSubprotocol(t *testing.T) {
	acceptErr := make(chan error, 1)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := bridge.Accept(w, r, bridge.AcceptOptions{})
		acceptErr <- err
	}))
	_, resp, err := websocket.Dial(testCtx(t), url, nil)
	if err == nil {
		t.Fatal("raw dial without subprotocol succeeded")
	}
	if resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("response = %v, want 400", resp)
	}
	if err := <-acceptErr; !errors.Is(err, bridge.ErrVersion) {
		t.Fatalf("Accept = %v, want ErrVersion", err)
	}
}

// TestRecvPeerMessages feeds hand-written messages to Conn.Recv after a
// valid handshake: unknown types and frame kinds are ignored and
// counted; malformed messages are a protocol error closed with 1002.
func TestRecvPeerMessages(t *testing.T) {
	type frame struct {
		binary bool
		b      []byte
	}
	text := func(s string) frame { return frame{b: []byte(s)} }
	bin := func(b ...byte) frame { return frame{binary: true, b: b} }
	tests := []struct {
		name        string
		send        []frame
		wantEvent   string // when no error: the message Recv returns is this event
		wantErr     error
		wantIgnored uint64
		wantClose   websocket.StatusCode // when wantErr: close code the backend sees
	}{
		{name: "unknown type ignored", send: []frame{text(`{"type":"stats","rtt_ms":3}`), text(`{"type":"event","data":"ok"}`)}, wantEvent: "ok", wantIgnored: 1},
		{name: "unknown kind ignored", send: []frame{bin(0x7f, 1, 2), text(`{"type":"event","data":"ok"}`)}, wantEvent: "ok", wantIgnored: 1},
		{name: "unknown members ignored", send: []frame{text(`{"type":"event","data":"ok","extra":{"a":1}}`)}, wantEvent: "ok"},
		{name: "not json", send: []frame{text(`not json`)}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "json array", send: []frame{text(`[1,2]`)}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "missing type", send: []frame{text(`{"data":"x"}`)}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "event data object", send: []frame{text(`{"type":"event","data":{"a":1}}`)}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "event without data", send: []frame{text(`{"type":"event"}`)}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "hello again", send: []frame{text(`{"type":"hello","version":1,"audio_format":"opus/48000/2"}`)}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "short audio frame", send: []frame{bin(0x01, 0, 0, 1)}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
		{name: "empty binary", send: []frame{bin()}, wantErr: bridge.ErrProtocol, wantClose: websocket.StatusProtocolError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			closed := make(chan websocket.StatusCode, 1)
			url := rawServer(t, bridge.Subprotocol, func(ctx context.Context, ws *websocket.Conn) {
				_, _, _ = ws.Read(ctx) // hello
				_ = writeJSON(ctx, ws, `{"type":"hello","version":1,"audio_format":"opus/48000/2"}`)
				_, _, _ = ws.Read(ctx) // session.start
				for _, f := range tt.send {
					typ := websocket.MessageText
					if f.binary {
						typ = websocket.MessageBinary
					}
					if err := ws.Write(ctx, typ, f.b); err != nil {
						t.Errorf("raw write: %v", err)
					}
				}
				closed <- readUntilClose(ctx, ws)
			})
			c := dial(t, url)
			ctx := testCtx(t)
			m, err := c.Recv(ctx)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Recv = %+v, %v; want error %v", m, err, tt.wantErr)
			}
			if got := c.Ignored(); got != tt.wantIgnored {
				t.Errorf("Ignored = %d, want %d", got, tt.wantIgnored)
			}
			if tt.wantErr != nil {
				if got := <-closed; got != tt.wantClose {
					t.Fatalf("backend saw close %d, want %d", got, tt.wantClose)
				}
				return
			}
			if string(m.Event) != tt.wantEvent {
				t.Fatalf("event = %q, want %q", m.Event, tt.wantEvent)
			}
			_ = c.Close()
			<-closed
		})
	}
}

// TestWireExamples pins the JSON a v1 peer sees, as documented in
// docs/bridge.md.
func TestWireExamples(t *testing.T) {
	got := make(chan string, 8)
	url := rawServer(t, bridge.Subprotocol, func(ctx context.Context, ws *websocket.Conn) {
		_, b, _ := ws.Read(ctx)
		got <- string(b)
		_ = writeJSON(ctx, ws, `{"type":"hello","version":1,"audio_format":"opus/48000/2"}`)
		for range 3 {
			_, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			got <- string(b)
		}
		readUntilClose(ctx, ws)
	})
	c, err := bridge.Dial(testCtx(t), url, bridge.SessionStart{SessionID: "sess-1", Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	if err := c.SendEvent(ctx, []byte(`{"type":"x"}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.End(ctx, bridge.ReasonShutdown); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"type":"hello","version":1,"audio_formats":["opus/48000/2","pcm16/24000/1","pcm16/16000/1"]}`,
		`{"type":"session.start","session_id":"sess-1","metadata":{"k":"v"}}`,
		`{"type":"event","data":"{\"type\":\"x\"}"}`,
		`{"type":"session.end","reason":"shutdown"}`,
	}
	for i, w := range want {
		g := <-got
		if g != w {
			t.Errorf("message %d = %s, want %s", i, g, w)
		}
		if !json.Valid([]byte(g)) {
			t.Errorf("message %d is not valid JSON", i)
		}
	}
}

// TestAudioPathAllocs measures a whole audio round trip through the
// echo agent (client SendAudio, agent Recv+SendAudio, client Recv).
// AllocsPerRun counts allocations in every goroutine. The context has no
// Done channel: with a cancellable one, the WebSocket library allocates a
// context.AfterFunc per read and write.
func TestAudioPathAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation count")
	}
	t.Run("v1", func(t *testing.T) { audioPathAllocs(t, dial(t, echoURL(t))) })
	t.Run("v2", func(t *testing.T) {
		p := newPool(t, echoURL(t), 0)
		audioPathAllocs(t, poolDial(t, p, "s1"))
		if p.Conns() != 1 {
			t.Fatalf("the session is not on a v2 connection")
		}
	})
}

func audioPathAllocs(t *testing.T, c *bridge.Conn) {
	ctx := context.Background()
	f := bridge.AudioFrame{Seq: 1, Timestamp: 960, Payload: make([]byte, 120)}
	roundTrip := func() {
		f.Seq++
		if err := c.SendAudio(ctx, f); err != nil {
			t.Fatal(err)
		}
		m, err := c.Recv(ctx)
		if err != nil || m.Audio == nil || m.Audio.Seq != f.Seq {
			t.Fatalf("Recv = %+v, %v", m, err)
		}
	}
	for range 10 {
		roundTrip() // warm up buffers
	}
	allocs := testing.AllocsPerRun(200, roundTrip)
	t.Logf("%.2f allocs per audio round trip", allocs)
	if allocs > 0 {
		t.Errorf("audio round trip: %.2f allocs, want 0", allocs)
	}
}

// TestEndUnblocksStalledSend: a backend that stops reading blocks a send
// made with context.Background() once the socket buffers are full; End
// with a bounded context must close the connection, fail that send with
// ErrClosed and return, instead of waiting for the send's write lock for
// as long as the backend stalls.
func TestEndUnblocksStalledSend(t *testing.T) {
	release := make(chan struct{})
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{})
		if err != nil {
			t.Errorf("Accept: %v", err)
			return
		}
		defer sc.Close()
		<-release // never reads
	}))
	defer close(release)
	c := dial(t, url)
	var sent atomic.Int64
	sendErr := make(chan error, 1)
	go func() {
		f := bridge.AudioFrame{Payload: make([]byte, 256<<10)}
		for {
			if err := c.SendAudio(context.Background(), f); err != nil {
				sendErr <- err
				return
			}
			sent.Add(1)
		}
	}()
	// Wait until the sender is stuck: no progress for a while.
	for last := int64(-1); ; {
		time.Sleep(200 * time.Millisecond)
		n := sent.Load()
		if n == last {
			break
		}
		last = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.End(ctx, bridge.ReasonShutdown); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("End = %v, want ErrClosed", err)
	}
	if err := <-sendErr; !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("stalled SendAudio = %v, want ErrClosed", err)
	}
	if err := c.SendAudio(context.Background(), bridge.AudioFrame{}); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("SendAudio after End = %v, want ErrClosed", err)
	}
}
