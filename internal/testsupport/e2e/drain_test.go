package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// dialed is a bare Pion client connected through a stack.
type dialed struct {
	pc         *webrtc.PeerConnection
	dc         *webrtc.DataChannel // oai-events, open
	msgs       <-chan string       // messages received on dc
	dtlsClosed <-chan struct{}     // closed when DTLS closes
	session    string              // absolute session URL (Location)
	etag       string              // the POST's ETag
}

// dial connects a bare Pion client with audio and an oai-events channel
// through the stack and returns it once the channel is open.
func dial(t *testing.T, s *stack) dialed {
	t.Helper()
	pc := webrtctest.PeerConnection(t)
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
		t.Fatal(err)
	}
	dc, err := pc.CreateDataChannel(transceiver.EventsLabel, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan string, 16)
	open := make(chan struct{})
	dc.OnOpen(func() { close(open) })
	dc.OnMessage(func(m webrtc.DataChannelMessage) { msgs <- string(m.Data) })
	dtlsClosed := make(chan struct{})
	var once sync.Once
	pc.SCTP().Transport().OnStateChange(func(st webrtc.DTLSTransportState) {
		if st == webrtc.DTLSTransportStateClosed {
			once.Do(func() { close(dtlsClosed) })
		}
	})
	resp, err := http.Post(s.signaling.URL+"/v1/calls", "application/sdp", strings.NewReader(webrtctest.Offer(t, pc)))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("offer: %d %s", resp.StatusCode, answer)
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(answer)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-open:
	case <-time.After(10 * time.Second):
		t.Fatal("data channel did not open")
	}
	return dialed{pc: pc, dc: dc, msgs: msgs, dtlsClosed: dtlsClosed,
		session: s.signaling.URL + resp.Header.Get("Location"), etag: resp.Header.Get("ETag")}
}

// TestDrain: a draining transceiver refuses new sessions with 503 and
// Retry-After and fails /ready, keeps live sessions up to the bound, then
// ends them cleanly: session.end event and DTLS close to the client,
// session.end to the backend.
func TestDrain(t *testing.T) {
	var logs logbuf.Buffer
	s := startStackWithLog(t, 3, slog.New(slog.NewJSONHandler(&logs, nil)))
	c := dial(t, s)
	msgs, dtlsClosed := c.msgs, c.dtlsClosed

	// The drain's bound is reached when the checks below are done (cancel):
	// a fixed 1.5 s bound ran out first on a loaded machine, ending the
	// live session before the test looked at it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drained := make(chan int, 1)
	go func() { drained <- s.trx.Drain(ctx) }()

	// While draining: not ready, no new sessions, the live one stays up.
	deadline := time.Now().Add(10 * time.Second)
	for s.trx.Ready() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	r, err := http.Get(s.signaling.URL + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/ready while draining: %d", r.StatusCode)
	}
	resp, err := http.Post(s.signaling.URL+"/v1/calls", "application/sdp", strings.NewReader("v=0"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("offer while draining: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if s.trx.Sessions() != 1 {
		t.Fatalf("live session was not kept during the drain")
	}

	// At the bound, the session is ended cleanly.
	cancel()
	if n := <-drained; n != 1 {
		t.Fatalf("drain ended %d sessions, want 1", n)
	}
	select {
	case m := <-msgs:
		var ev struct{ Type, Reason string }
		if err := json.Unmarshal([]byte(m), &ev); err != nil || ev.Type != transceiver.EndEventType || ev.Reason != "shutdown" {
			t.Fatalf("client got %q, want a %s event with reason shutdown", m, transceiver.EndEventType)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("client got no session end event")
	}
	select {
	case <-dtlsClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("client's DTLS transport did not close")
	}
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"reason":"shutdown"`) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), `"msg":"session end"`) || !strings.Contains(logs.String(), `"reason":"shutdown"`) {
		t.Fatalf("backend was not told the session ended for shutdown; logs:\n%s", logs.String())
	}
}
