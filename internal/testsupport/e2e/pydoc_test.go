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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	speechgen "github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// TestBridgeDocPythonBackends runs the two Python backends printed in
// docs/bridge.md §9 exactly as printed (they read HOST and PORT from the
// environment; nothing in them is edited) behind a real transceiver:
//
//   - the echo backend: `switchboard call`'s client gets its audio and its
//     data-channel ping back;
//   - the conversational backend, driven by turn detection at the edge as
//     §9 says: a client speaks and pauses, and the whole reply comes, paced;
//     it speaks over the reply, and the edge cuts it, and the backend is
//     told how much was played, which is what the client received.
//
// The PCM example used to wait for a response.create that no client
// sends, bound 8080 (the transceiver's own port in the README) and had to
// have its port edited to run here.
func TestBridgeDocPythonBackends(t *testing.T) {
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
	section := string(doc)
	section = section[strings.Index(section, "## 9. Writing a backend"):strings.Index(section, "## 10. Go API")]
	blocks := strings.Split(section, "```python\n")
	if len(blocks) != 3 {
		t.Fatalf("docs/bridge.md §9 has %d Python examples, want 2", len(blocks)-1)
	}
	echoSrc := blocks[1][:strings.Index(blocks[1], "```")]
	pcmSrc := blocks[2][:strings.Index(blocks[2], "```")]
	for _, src := range []string{echoSrc, pcmSrc} {
		// What §9 promises of them, which the test relies on.
		if !strings.Contains(src, `os.environ.get("PORT", "8081")`) {
			t.Fatalf("an example no longer reads PORT with the default 8081:\n%s", src)
		}
	}

	t.Run("echo", func(t *testing.T) {
		dir := t.TempDir()
		port, out := startPythonBackend(t, python, dir, echoSrc)
		// The transceiver's default -backend path, as §9 says.
		s := startPCMStack(t, nil, func(c *transceiver.Config) { c.BackendURL = fmt.Sprintf("ws://127.0.0.1:%d/v1/bridge", port) })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rep, err := callclient.Run(ctx, callclient.Options{URL: s.calls, AudioPath: speech, Duration: 2 * time.Second})
		if err != nil || !rep.AudioEchoed || !rep.DataChannelEchoed {
			t.Fatalf("call through the echo example: %v\n%s\nbackend printed:\n%s", err, rep, out.String())
		}
		if !strings.Contains(out.String(), "session start") || !strings.Contains(out.String(), `'client_addr'`) {
			t.Errorf("the echo example printed %q, want its session start with the client_addr metadata", out.String())
		}
	})

	t.Run("conversational", func(t *testing.T) {
		speechgen.Require(t)
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
		port, out := startPythonBackend(t, python, dir, pcmSrc)
		s := startPCMStack(t, nil, func(c *transceiver.Config) { c.BackendURL = fmt.Sprintf("ws://127.0.0.1:%d/v1/bridge", port) })
		c := dialClient(t, s.calls)

		script, err := speechgen.NewScript(48000, 400, 0, "Hello there, how are you doing today?", "Wait, stop right there please.")
		if err != nil {
			t.Fatal(err)
		}
		second := script.Utterances[1]
		enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1275)
		silence := make([]int16, 960)
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
		sendSpan := func(fromMs, toMs int) {
			for i := fromMs * 48; i+960 <= toMs*48; i += 960 {
				send(script.Samples[i : i+960])
			}
		}
		// The first utterance, then silence until 1 s of the reply has come.
		sendSpan(0, second.StartMs)
		for i := 0; i < 500 && len(c.received()) < 50; i++ {
			send(silence)
		}
		if len(c.received()) < 50 {
			t.Fatalf("no reply after the first utterance: %d packets; backend printed:\n%s", len(c.received()), out.String())
		}
		// The second utterance over the reply. The edge cuts the reply at
		// its onset; by the utterance's end the cut reply and the clear's
		// silence tail have long reached the client, and the next reply
		// cannot have started (the turn ends 500 ms of silence later).
		sendSpan(second.StartMs, second.EndMs)
		rx, tail := withoutClearTail(t, c.received())
		if tail < clearTailPackets {
			t.Errorf("the client's packets end in %d of the clear's silence packets, want %d", tail, clearTailPackets)
		}
		for range 50 {
			send(silence)
		}
		want := []string{"input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "output_audio_buffer.started",
			"input_audio_buffer.speech_started", "output_audio_buffer.cleared", "input_audio_buffer.speech_stopped"}
		var got []string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			got = got[:0]
			for _, ev := range c.eventTypes() {
				if typ, _ := ev["type"].(string); strings.HasPrefix(typ, "output_audio_buffer.") || strings.HasPrefix(typ, "input_audio_buffer.") {
					got = append(got, typ)
				}
			}
			if len(got) >= len(want) && slices.Equal(got[:len(want)], want) {
				break
			}
		}
		if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
			t.Fatalf("client events %q, want them to begin %q", got, want)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), "interrupted after") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		printed := out.String()
		t.Logf("client: %d reply packets (%d ms) before the cut; backend printed:\n%s", len(rx), 20*len(rx), strings.TrimSpace(printed))
		for _, want := range []string{"the user started talking at", "the user stopped talking at", "; replying", "interrupted after"} {
			if !strings.Contains(printed, want) {
				t.Fatalf("the backend did not print %q:\n%s", want, printed)
			}
		}
		var played int
		if _, err := fmt.Sscanf(printed[strings.Index(printed, "interrupted after"):], "interrupted after %d ms", &played); err != nil {
			t.Fatalf("backend output %q: %v", printed, err)
		}
		if d := played - 20*len(rx); d < -20 || d > 20 {
			t.Errorf("the backend was told %d ms played, the client received %d ms", played, 20*len(rx))
		}
	})
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

// startPythonBackend runs the example src, as it is, in dir on a
// loopback port that was free a moment ago (HOST and PORT in its
// environment), and waits up to 10 s for it to answer. Another process may
// take the port before Python binds it; then Python exits ("address
// already in use") and it is tried again on another port, up to 5 times.
func startPythonBackend(t *testing.T, python, dir, src string) (port int, out *logbuf.Buffer) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "backend.py"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		ctx, cancel := context.WithCancel(context.Background())
		out = &logbuf.Buffer{}
		cmd := exec.CommandContext(ctx, python, "backend.py")
		cmd.Dir, cmd.Stdout, cmd.Stderr = dir, out, out
		cmd.Env = append(os.Environ(), "HOST=127.0.0.1", fmt.Sprintf("PORT=%d", port))
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() { cancel(); <-exited }
		busy := false
	wait:
		for deadline := time.Now().Add(10 * time.Second); ; {
			select {
			case <-exited:
				cancel()
				if !strings.Contains(strings.ToLower(out.String()), "address already in use") {
					t.Fatalf("the Python backend exited at start:\n%s", out.String())
				}
				busy = true
				break wait
			default:
			}
			if isWebsocketsServer(port) {
				t.Cleanup(func() {
					stop()
					if t.Failed() {
						t.Logf("backend output:\n%s", out.String())
					}
				})
				return port, out
			}
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("the Python backend does not listen on %d:\n%s", port, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if busy && attempt == 5 {
			t.Fatalf("the Python backend lost its port %d times:\n%s", attempt, out.String())
		}
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
