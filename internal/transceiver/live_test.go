package transceiver

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
)

// liveCall is a Pion client's call to a Direct-mode transceiver (clients
// send straight to its socket on loopback).
type liveCall struct {
	pc        *webrtc.PeerConnection
	dc        *webrtc.DataChannel // the client's oai-events channel
	answer    string
	session   string // the session URL
	connected chan struct{}
	dcOpen    chan struct{}
}

// directServer runs a Direct-mode transceiver: no relay, clients send to
// its socket.
func directServer(t *testing.T, mutate ...func(*Config)) (*Server, string) {
	t.Helper()
	return directServerLog(t, slog.New(slog.DiscardHandler), mutate...)
}

// directServerLog is directServer with the transceiver logging to log.
func directServerLog(t *testing.T, log *slog.Logger, mutate ...func(*Config)) (*Server, string) {
	t.Helper()
	s, api, _ := newTestServerLog(t, log, append([]func(*Config){func(c *Config) { c.Direct, c.Advertise = true, "" }}, mutate...)...)
	return s, api.URL
}

// dialLive offers from a new Pion client (audio and oai-events), with
// rewrite applied to the offer's text before the POST (nil for none),
// and applies the answer. It does not wait for the connection: see
// liveCall.connected.
func dialLive(t *testing.T, apiURL string, rewrite func(string) string) *liveCall {
	t.Helper()
	pc := webrtctest.PeerConnection(t)
	c := &liveCall{pc: pc, connected: make(chan struct{}), dcOpen: make(chan struct{})}
	var once, dcOnce = make(chan struct{}, 1), make(chan struct{}, 1)
	once <- struct{}{}
	dcOnce <- struct{}{}
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		if st == webrtc.PeerConnectionStateConnected {
			select {
			case <-once:
				close(c.connected)
			default:
			}
		}
	})
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
		t.Fatal(err)
	}
	dc, err := pc.CreateDataChannel(EventsLabel, nil)
	if err != nil {
		t.Fatal(err)
	}
	dc.OnOpen(func() {
		select {
		case <-dcOnce:
			close(c.dcOpen)
		default:
		}
	})
	c.dc = dc
	offer := webrtctest.Offer(t, pc)
	if rewrite != nil {
		offer = rewrite(offer)
	}
	resp, err := http.Post(apiURL+"/v1/calls", "application/sdp", strings.NewReader(offer))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("offer: status %d: %s", resp.StatusCode, body)
	}
	c.answer, c.session = string(body), apiURL+resp.Header.Get("Location")
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: c.answer}); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitFor waits for ch, failing the test if it has not happened within
// d: a liveness bound for a test that would otherwise hang, not a
// latency assertion.
func waitFor(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s did not happen within %v", what, d)
	}
}

// backendFunc runs a bridge backend that hands each accepted session to
// serve, on the handler's goroutine, and returns its URL. serve owns sc.
func backendFunc(t *testing.T, serve func(sc *bridge.ServerConn)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{})
		if err != nil {
			return
		}
		serve(sc)
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/bridge"
}
