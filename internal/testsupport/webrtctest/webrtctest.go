// Package webrtctest has what tests across packages need from a Pion
// client: a peer connection on loopback and a complete offer from it.
package webrtctest

import (
	"testing"

	"github.com/pion/webrtc/v4"
)

// EventsLabel is the data channel Switchboard bridges (oai-events).
const EventsLabel = "oai-events"

// PeerConnection returns a Pion peer connection that gathers IPv4 host
// candidates, loopback included; it is closed when the test ends.
func PeerConnection(t testing.TB) *webrtc.PeerConnection {
	t.Helper()
	var se webrtc.SettingEngine
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	pc, err := webrtc.NewAPI(webrtc.WithSettingEngine(se)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc
}

// Offer sets a complete offer (ICE gathering done, as an ICE-lite server
// needs) as pc's local description and returns its SDP.
func Offer(t testing.TB, pc *webrtc.PeerConnection) string {
	t.Helper()
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	done := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	<-done
	return pc.LocalDescription().SDP
}

// AudioOffer returns a complete offer from a new peer connection with a
// sendrecv audio transceiver if audio is set, and an oai-events data channel
// if events is set.
func AudioOffer(t testing.TB, audio, events bool) string {
	t.Helper()
	pc := PeerConnection(t)
	if audio {
		if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
			t.Fatal(err)
		}
	}
	if events {
		if _, err := pc.CreateDataChannel(EventsLabel, nil); err != nil {
			t.Fatal(err)
		}
	}
	return Offer(t, pc)
}
