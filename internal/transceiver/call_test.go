package transceiver

import (
	"net/http"
	"sync"
	"testing"

	"github.com/pion/webrtc/v4"

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
