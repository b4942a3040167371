package transceiver

import (
	"net/http"
	"sync"
	"testing"

	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
)

// offerCall posts pc's offer, once its candidates are gathered, to
// api/v1/calls, fails the test unless the answer comes with 201 Created,
// sets the answer as pc's remote description and returns it.
func offerCall(t *testing.T, api string, pc *webrtc.PeerConnection) string {
	t.Helper()
	resp := post(t, api+"/v1/calls", "application/sdp", webrtctest.Offer(t, pc))
	answer := readAll(t, resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("offer: %s: %s", resp.Status, answer)
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
		t.Fatal(err)
	}
	return answer
}

// eventsClient is a Pion client with an audio transceiver and the
// oai-events data channel, which it returns.
func eventsClient(t *testing.T) (*webrtc.PeerConnection, *webrtc.DataChannel) {
	t.Helper()
	pc := webrtctest.PeerConnection(t)
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
		t.Fatal(err)
	}
	events, err := pc.CreateDataChannel(webrtctest.EventsLabel, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pc, events
}

// whenConnected returns a channel closed the first time pc's connection
// state is connected.
func whenConnected(pc *webrtc.PeerConnection) <-chan struct{} {
	connected := make(chan struct{})
	var once sync.Once
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		if st == webrtc.PeerConnectionStateConnected {
			once.Do(func() { close(connected) })
		}
	})
	return connected
}

// addOpusTrack adds to pc a local Opus track (48 kHz, stereo as SDP
// names Opus, RFC 7587 §7) that the test writes RTP packets to.
func addOpusTrack(t *testing.T, pc *webrtc.PeerConnection) *webrtc.TrackLocalStaticRTP {
	t.Helper()
	track, err := webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "client")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.AddTrack(track); err != nil {
		t.Fatal(err)
	}
	return track
}

// serveAudio is a backend's side of one bridge connection: it hands each
// audio frame to audio (valid until audio returns; audio may reply on
// sc), answers the transceiver's end with the same reason, and returns,
// closing sc, once the connection fails, the end is answered, or audio
// returns an error.
func serveAudio(t *testing.T, sc *bridge.ServerConn, audio func(*bridge.AudioFrame) error) {
	defer sc.Close()
	for {
		m, err := sc.Recv(t.Context())
		switch {
		case err != nil:
			return
		case m.Audio != nil:
			if audio(m.Audio) != nil {
				return
			}
		case m.End != nil:
			_ = sc.End(t.Context(), m.End.Reason)
			return
		}
	}
}
