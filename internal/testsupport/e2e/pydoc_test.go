package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// TestBridgeDocPythonPCMBackend runs the Python PCM backend printed in
// docs/bridge.md §9, as written (only its port is changed), behind a real
// transceiver: a client's response.create brings the whole reply, paced,
// and its response.cancel clears it with the played time reported.
func TestBridgeDocPythonPCMBackend(t *testing.T) {
	python := ""
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import websockets").Run() == nil {
			python = p
			break
		}
	}
	if python == "" {
		const msg = "python3 with websockets is not installed (Debian: apt-get install python3-websockets); the doc example test needs it"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	doc, err := os.ReadFile("../../../docs/bridge.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(doc), "```python\n")
	if len(blocks) < 3 {
		t.Fatal("docs/bridge.md has no second Python example")
	}
	src := blocks[2][:strings.Index(blocks[2], "```")]
	const serve = `websockets.serve(session, "0.0.0.0", 8080,`
	if !strings.Contains(src, serve) {
		t.Fatalf("the example no longer serves with %s", serve)
	}

	// reply.wav: 3 s of speech.wav at 24 kHz.
	dir := t.TempDir()
	w, err := callclient.LoadWAV(speech)
	if err != nil {
		t.Fatal(err)
	}
	var pcm []byte
	for i := 0; i+1 < len(w.Samples) && len(pcm) < 3*24000*2; i += 2 {
		pcm = binary.LittleEndian.AppendUint16(pcm, uint16(int16((int(w.Samples[i])+int(w.Samples[i+1]))/2)))
	}
	if err := os.WriteFile(filepath.Join(dir, "reply.wav"), wavFile(pcm, 24000), 0o644); err != nil {
		t.Fatal(err)
	}
	// The example binds a fixed port: the test picks one that was free a
	// moment ago, and another process may take it before Python binds it.
	// Then Python exits ("address already in use") while a dial would reach
	// the other process, so the backend is ready when the port answers as
	// a websockets server does, and a lost port is tried again with another.
	var out *logbuf.Buffer
	var port int
	for attempt := 1; ; attempt++ {
		var busy bool
		port, out, busy = startPythonBackend(t, python, dir, src, serve)
		if !busy {
			break
		}
		if attempt == 5 {
			t.Fatalf("the Python backend lost its port %d times:\n%s", attempt, out.String())
		}
	}

	s := startPCMStack(t, nil, func(c *transceiver.Config) { c.BackendURL = fmt.Sprintf("ws://127.0.0.1:%d/", port) })
	c := dialClient(t, s.calls)
	c.send(map[string]string{"type": "response.create"})
	waitEvents(t, c, "output_audio_buffer.started")
	if ev := c.eventTypes(); ev[0]["response_id"] != "resp_1" {
		t.Errorf("started event %v, want response_id resp_1", ev[0])
	}
	time.Sleep(time.Second)
	c.send(map[string]string{"type": "response.cancel"})
	waitEvents(t, c, "output_audio_buffer.started", "output_audio_buffer.cleared")
	// The reply's last packets and the clear's silence tail (not counted
	// as played) may still be on their way when the event has come.
	rx, _ := withoutClearTail(t, waitClearTail(t, c, 0))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "interrupted after") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("client: %d packets (%d ms); backend printed: %s", len(rx), 20*len(rx), strings.TrimSpace(out.String()))
	var played int
	if _, err := fmt.Sscanf(out.String()[strings.Index(out.String(), "interrupted after"):], "interrupted after %d ms", &played); err != nil {
		t.Fatalf("backend output %q: %v", out.String(), err)
	}
	if d := played - 20*len(rx); d < -20 || d > 20 {
		t.Errorf("the backend was told %d ms played, the client received %d ms", played, 20*len(rx))
	}
	if played < 800 || played > 1500 {
		t.Errorf("played %d ms of a reply cancelled after about 1 s", played)
	}
}

// wavFile wraps 16-bit mono PCM in a WAV header.
func wavFile(pcm []byte, rate int) []byte {
	var b bytes.Buffer
	le := binary.LittleEndian
	b.WriteString("RIFF")
	_ = binary.Write(&b, le, uint32(36+len(pcm)))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(rate), uint32(rate * 2), uint16(2), uint16(16)} {
		_ = binary.Write(&b, le, v)
	}
	b.WriteString("data")
	_ = binary.Write(&b, le, uint32(len(pcm)))
	b.Write(pcm)
	return b.Bytes()
}

// startPythonBackend runs the example src in dir on a loopback port that
// was free a moment ago (put in place of serve) and waits up to 10 s for
// it to answer. busy reports that Python exited because the port had been
// taken meanwhile; the test fails on any other failure.
func startPythonBackend(t *testing.T, python, dir, src, serve string) (port int, out *logbuf.Buffer, busy bool) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port = ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	src = strings.Replace(src, serve, fmt.Sprintf(`websockets.serve(session, "127.0.0.1", %d,`, port), 1)
	if err := os.WriteFile(filepath.Join(dir, "backend.py"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out = &logbuf.Buffer{}
	cmd := exec.CommandContext(ctx, python, "-u", "backend.py")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, out, out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() { cancel(); <-exited }
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case <-exited:
			cancel()
			if strings.Contains(strings.ToLower(out.String()), "address already in use") {
				return port, out, true
			}
			t.Fatalf("the Python backend exited at start:\n%s", out.String())
		default:
		}
		if isWebsocketsServer(port) {
			t.Cleanup(func() {
				stop()
				if t.Failed() {
					t.Logf("backend output:\n%s", out.String())
				}
			})
			return port, out, false
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("the Python backend does not listen on %d:\n%s", port, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isWebsocketsServer reports whether a plain GET to port is answered by
// Python's websockets library (its Server header), and not by whichever
// process might have taken the port.
func isWebsocketsServer(port int) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return strings.Contains(resp.Header.Get("Server"), "websockets")
}
