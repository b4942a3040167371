package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/pion/ice/v4"
	"github.com/pion/sdp/v3"
	"github.com/pion/webrtc/v4"
	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/chromium"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// baseOffer is an offer in the shape browsers send (values ours): BUNDLE
// of an audio and a data section, Opus at 111 among other codecs,
// session-level nothing but the group.
const baseOffer = "v=0\r\n" +
	"o=- 4611731400430051336 2 IN IP4 127.0.0.1\r\n" +
	"s=-\r\n" +
	"t=0 0\r\n" +
	"a=group:BUNDLE 0 1\r\n" +
	"a=extmap-allow-mixed\r\n" +
	"a=msid-semantic: WMS\r\n" +
	"m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126\r\n" +
	"c=IN IP4 0.0.0.0\r\n" +
	"a=rtcp:9 IN IP4 0.0.0.0\r\n" +
	"a=ice-ufrag:Qx7b\r\n" +
	"a=ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq9Te\r\n" +
	"a=ice-options:trickle\r\n" +
	"a=fingerprint:sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9\r\n" +
	"a=setup:actpass\r\n" +
	"a=mid:0\r\n" +
	"a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level\r\n" +
	"a=sendrecv\r\n" +
	"a=msid:- 5d0f3c4e-1b2a-4c3d-8e9f-a0b1c2d3e4f5\r\n" +
	"a=rtcp-mux\r\n" +
	"a=rtcp-rsize\r\n" +
	"a=rtpmap:111 opus/48000/2\r\n" +
	"a=rtcp-fb:111 transport-cc\r\n" +
	"a=fmtp:111 minptime=10;useinbandfec=1\r\n" +
	"a=rtpmap:63 red/48000/2\r\n" +
	"a=fmtp:63 111/111\r\n" +
	"a=rtpmap:9 G722/8000\r\n" +
	"a=rtpmap:0 PCMU/8000\r\n" +
	"a=rtpmap:8 PCMA/8000\r\n" +
	"a=rtpmap:13 CN/8000\r\n" +
	"a=rtpmap:110 telephone-event/48000\r\n" +
	"a=rtpmap:126 telephone-event/8000\r\n" +
	"a=ssrc:1180194416 cname:k3Jd9s0a1b2c3d4e\r\n" +
	"m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n" +
	"c=IN IP4 0.0.0.0\r\n" +
	"a=ice-ufrag:Qx7b\r\n" +
	"a=ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq9Te\r\n" +
	"a=ice-options:trickle\r\n" +
	"a=fingerprint:sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9\r\n" +
	"a=setup:actpass\r\n" +
	"a=mid:1\r\n" +
	"a=sctp-port:5000\r\n" +
	"a=max-message-size:262144\r\n"

// testParams returns answer parameters for tests: a fixed certificate
// fingerprint and the candidate 127.0.0.1:3478.
func testParams() AnswerParams {
	digest := make([]byte, 32)
	for i := range digest {
		digest[i] = byte(i * 7)
	}
	return AnswerParams{
		ICEUfrag:       "sbAnswerUfrag",
		ICEPwd:         "sbAnswerPasswordOf32Characters00",
		Fingerprint:    Fingerprint{Hash: "sha-256", Digest: digest},
		Setup:          "active",
		Candidate:      netip.MustParseAddrPort("127.0.0.1:3478"),
		AudioSSRC:      0x5b0a1d2e,
		CNAME:          "switchboard",
		StreamID:       "switchboard",
		TrackID:        "voice",
		SCTPPort:       5000,
		MaxMessageSize: 65536,
	}
}

func TestParseOfferBase(t *testing.T) {
	o, err := ParseOffer(baseOffer)
	if err != nil {
		t.Fatal(err)
	}
	if o.ICEUfrag != "Qx7b" || o.ICEPwd != "r2VxZ0vVNa6lAk1Y2vXkq9Te" {
		t.Errorf("credentials %q/%q", o.ICEUfrag, o.ICEPwd)
	}
	if len(o.Fingerprints) != 1 || o.Fingerprints[0].Hash != "sha-256" || len(o.Fingerprints[0].Digest) != 32 ||
		o.Fingerprints[0].Digest[0] != 0x0a || o.Fingerprints[0].Digest[31] != 0xf9 {
		t.Errorf("fingerprints %+v", o.Fingerprints)
	}
	if got, want := o.Fingerprints[0].String(), "sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9"; got != want {
		t.Errorf("fingerprint string %q, want %q", got, want)
	}
	if o.Setup != "actpass" || o.Audio != 0 || o.Data != 1 || !slices.Equal(o.Bundle, []string{"0", "1"}) || o.SCTPInit != nil {
		t.Errorf("setup %q audio %d data %d bundle %q sctp-init %x", o.Setup, o.Audio, o.Data, o.Bundle, o.SCTPInit)
	}
	a, d := o.Sections[0], o.Sections[1]
	if a.Kind != "audio" || a.Mid != "0" || a.Proto != "UDP/TLS/RTP/SAVPF" || a.Rejected || a.Direction != "sendrecv" ||
		a.OpusPT != 111 || a.OpusFmtp != "minptime=10;useinbandfec=1" {
		t.Errorf("audio section %+v", a)
	}
	if d.Kind != "application" || d.Mid != "1" || d.Proto != "UDP/DTLS/SCTP" || d.SCTPPort != 5000 || d.MaxMessageSize != 262144 {
		t.Errorf("data section %+v", d)
	}
}

// pionClient returns a Pion peer connection on loopback (webrtctest's), or
// one with SCTP SNAP enabled.
func pionClient(t *testing.T, snap bool) *webrtc.PeerConnection {
	t.Helper()
	if !snap {
		return webrtctest.PeerConnection(t)
	}
	var se webrtc.SettingEngine
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	se.EnableSctpSnap(true)
	pc, err := webrtc.NewAPI(webrtc.WithSettingEngine(se)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc
}

// sctpInitFromPion returns the a=sctp-init payload a SNAP-enabled Pion
// answerer writes for offer: a real SCTP INIT, as the peer package will
// send.
func sctpInitFromPion(t *testing.T, offer string) []byte {
	t.Helper()
	pc := pionClient(t, true)
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: offer}); err != nil {
		t.Fatal(err)
	}
	ans, err := pc.CreateAnswer(nil)
	if err != nil {
		t.Fatal(err)
	}
	var sd sdp.SessionDescription
	if err := sd.UnmarshalString(ans.SDP); err != nil {
		t.Fatal(err)
	}
	for _, m := range sd.MediaDescriptions {
		if v, ok := m.Attribute("sctp-init"); ok {
			o, err := ParseOffer(strings.Replace(offer, "a=sctp-port", "a=sctp-init:"+v+"\r\na=sctp-port", 1))
			if err != nil || o.SCTPInit == nil {
				t.Fatalf("Pion's a=sctp-init:%s: %v", v, err)
			}
			return o.SCTPInit
		}
	}
	t.Fatal("Pion's SNAP answer has no a=sctp-init")
	return nil
}

// TestAnswerPion answers offers from Pion clients and has each client take
// the answer.
func TestAnswerPion(t *testing.T) {
	cases := []struct {
		name string
		snap bool
		// setup adds transceivers and channels to the client.
		setup func(t *testing.T, pc *webrtc.PeerConnection)
		// want: the answer's m-sections, as "kind port-zero direction".
		audio, data int
		want        []string
		sends       bool
	}{
		{
			name:  "audio and data",
			setup: audioAndData(webrtc.RTPTransceiverDirectionSendrecv),
			audio: 0, data: 1, want: []string{"audio sendrecv", "application"}, sends: true,
		},
		{
			name: "audio only",
			setup: func(t *testing.T, pc *webrtc.PeerConnection) {
				addAudio(t, pc, webrtc.RTPTransceiverDirectionSendrecv)
			},
			audio: 0, data: -1, want: []string{"audio sendrecv"}, sends: true,
		},
		// The video sections are recvonly: a Pion client that sends a
		// track refuses any answer that rejects it (ErrUnsupportedCodec
		// from SetRemoteDescription, Pion's own answers included).
		{
			name: "video rejected",
			setup: func(t *testing.T, pc *webrtc.PeerConnection) {
				addAudio(t, pc, webrtc.RTPTransceiverDirectionSendrecv)
				addVideo(t, pc)
				addData(t, pc)
			},
			audio: 0, data: 2, want: []string{"audio sendrecv", "video rejected", "application"}, sends: true,
		},
		{
			name: "video first, second audio rejected",
			setup: func(t *testing.T, pc *webrtc.PeerConnection) {
				addVideo(t, pc)
				addAudio(t, pc, webrtc.RTPTransceiverDirectionSendrecv)
				addAudio(t, pc, webrtc.RTPTransceiverDirectionSendrecv)
				addData(t, pc)
			},
			audio: 1, data: 3, want: []string{"video rejected", "audio sendrecv", "audio rejected", "application"}, sends: true,
		},
		{
			name:  "recvonly audio",
			setup: audioAndData(webrtc.RTPTransceiverDirectionRecvonly),
			audio: 0, data: 1, want: []string{"audio sendonly", "application"}, sends: true,
		},
		{
			name:  "sendonly audio",
			setup: audioAndData(webrtc.RTPTransceiverDirectionSendonly),
			audio: 0, data: 1, want: []string{"audio recvonly", "application"}, sends: false,
		},
		{
			name:  "SNAP",
			snap:  true,
			setup: audioAndData(webrtc.RTPTransceiverDirectionSendrecv),
			audio: 0, data: 1, want: []string{"audio sendrecv", "application"}, sends: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc := pionClient(t, tc.snap)
			tc.setup(t, pc)
			offer := webrtctest.Offer(t, pc)
			o, err := ParseOffer(offer)
			if err != nil {
				t.Fatalf("ParseOffer: %v\n%s", err, offer)
			}
			if o.Audio != tc.audio || o.Data != tc.data {
				t.Fatalf("audio section %d, data section %d; want %d, %d", o.Audio, o.Data, tc.audio, tc.data)
			}
			checkOfferAgainstPion(t, pc, o)
			p := testParams()
			if tc.snap {
				if o.SCTPInit == nil {
					t.Fatal("a SNAP offer gave no SCTPInit")
				}
				p.SCTPInit = sctpInitFromPion(t, offer)
			} else if o.SCTPInit != nil {
				t.Fatalf("SCTPInit %x without SNAP", o.SCTPInit)
			}
			answer, err := Answer(o, p)
			if err != nil {
				t.Fatal(err)
			}
			checkAnswer(t, o, p, answer, tc.want, tc.sends)
			if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
				t.Fatalf("Pion refuses the answer: %v\n%s", err, answer)
			}
		})
	}
}

// audioAndData is a client setup that adds an audio transceiver in dir,
// then the data channel.
func audioAndData(dir webrtc.RTPTransceiverDirection) func(*testing.T, *webrtc.PeerConnection) {
	return func(t *testing.T, pc *webrtc.PeerConnection) {
		addAudio(t, pc, dir)
		addData(t, pc)
	}
}

func addAudio(t *testing.T, pc *webrtc.PeerConnection, dir webrtc.RTPTransceiverDirection) {
	t.Helper()
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio, webrtc.RTPTransceiverInit{Direction: dir}); err != nil {
		t.Fatal(err)
	}
}

func addVideo(t *testing.T, pc *webrtc.PeerConnection) {
	t.Helper()
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeVideo, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionRecvonly}); err != nil {
		t.Fatal(err)
	}
}

func addData(t *testing.T, pc *webrtc.PeerConnection) {
	t.Helper()
	if _, err := pc.CreateDataChannel(webrtctest.EventsLabel, nil); err != nil {
		t.Fatal(err)
	}
}

// checkOfferAgainstPion checks what ParseOffer read against what the Pion
// client says of itself: its credentials and its certificate.
func checkOfferAgainstPion(t *testing.T, pc *webrtc.PeerConnection, o *Offer) {
	t.Helper()
	ice, err := pc.SCTP().Transport().ICETransport().GetLocalParameters()
	if err != nil {
		t.Fatal(err)
	}
	if o.ICEUfrag != ice.UsernameFragment || o.ICEPwd != ice.Password {
		t.Errorf("credentials %q/%q, Pion's %q/%q", o.ICEUfrag, o.ICEPwd, ice.UsernameFragment, ice.Password)
	}
	fps, err := pc.GetConfiguration().Certificates[0].GetFingerprints()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range fps {
		for _, g := range o.Fingerprints {
			found = found || f.Algorithm == g.Hash && strings.EqualFold(f.Value, strings.SplitN(g.String(), " ", 2)[1])
		}
	}
	if !found {
		t.Errorf("fingerprints %v, Pion's certificate %v", o.Fingerprints, fps)
	}
	if o.Setup != "actpass" {
		t.Errorf("setup %q, Pion offers actpass", o.Setup)
	}
}

// checkAnswer parses answer and checks it against the rules of Answer's
// doc comment; want lists each m-section as "kind direction" or "kind
// rejected".
func checkAnswer(t *testing.T, o *Offer, p AnswerParams, answer string, want []string, sends bool) {
	t.Helper()
	var sd sdp.SessionDescription
	if err := sd.UnmarshalString(answer); err != nil {
		t.Fatalf("the answer does not parse: %v\n%s", err, answer)
	}
	if _, ok := sd.Attribute("ice-lite"); !ok {
		t.Errorf("no a=ice-lite\n%s", answer)
	}
	u, _ := sd.Attribute("ice-ufrag")
	pwd, _ := sd.Attribute("ice-pwd")
	fp, _ := sd.Attribute("fingerprint")
	if u != p.ICEUfrag || pwd != p.ICEPwd || fp != p.Fingerprint.String() {
		t.Errorf("session a=ice-ufrag:%s a=ice-pwd:%s a=fingerprint:%s; want %s, %s, %s", u, pwd, fp, p.ICEUfrag, p.ICEPwd, p.Fingerprint)
	}
	if !strings.HasSuffix(answer, "\r\n") || strings.Contains(strings.ReplaceAll(answer, "\r\n", ""), "\n") {
		t.Errorf("lines are not CRLF-terminated")
	}
	var got, group []string
	candidates := 0
	for i, m := range sd.MediaDescriptions {
		s := o.Sections[i]
		mid, _ := m.Attribute("mid")
		if m.MediaName.Media != s.Kind || mid != s.Mid {
			t.Errorf("m-section %d is %s mid %q; the offer's is %s mid %q", i, m.MediaName.Media, mid, s.Kind, s.Mid)
		}
		if m.MediaName.Port.Value == 0 {
			got = append(got, m.MediaName.Media+" rejected")
			if len(m.Attributes) != 2 || m.Attributes[1].Key != "setup" {
				t.Errorf("rejected m-section %d has attributes %v; want its mid and a=setup", i, m.Attributes)
			}
			continue
		}
		group = append(group, mid)
		if proto := strings.Join(m.MediaName.Protos, "/"); proto != s.Proto {
			t.Errorf("m-section %d profile %s, offered %s", i, proto, s.Proto)
		}
		for _, a := range m.Attributes {
			if a.Key == "candidate" {
				candidates++
				want := candidate(p.Candidate)
				if candidates == 2 {
					want = tcpCandidate(p.TCPCandidate)
				}
				if a.Value != want || len(group) != 1 {
					t.Errorf("m-section %d a=candidate:%s; want %s in the first served section only", i, a.Value, want)
				}
			}
		}
		_, eoc := m.Attribute("end-of-candidates")
		tagged := len(group) == 1
		if eoc != tagged {
			t.Errorf("m-section %d: a=end-of-candidates %v, want it in the first served section only", i, eoc)
		}
		wantPort, wantAddr := 9, "0.0.0.0"
		if tagged {
			wantPort, wantAddr = int(p.Candidate.Port()), p.Candidate.Addr().Unmap().String()
		}
		if m.MediaName.Port.Value != wantPort || m.ConnectionInformation == nil || m.ConnectionInformation.Address.Address != wantAddr {
			t.Errorf("m-section %d: port %d, c=%v; want %d and %s", i, m.MediaName.Port.Value, m.ConnectionInformation, wantPort, wantAddr)
		}
		if s, _ := m.Attribute("setup"); s != p.Setup {
			t.Errorf("m-section %d a=setup:%s", i, s)
		}
		switch m.MediaName.Media {
		case "audio":
			got = append(got, "audio "+direction(&sd, m))
			pt := strconv.Itoa(int(s.OpusPT))
			if !slices.Equal(m.MediaName.Formats, []string{pt}) {
				t.Errorf("audio formats %v, want [%s]", m.MediaName.Formats, pt)
			}
			for _, key := range []string{"extmap", "rtcp-fb"} {
				if _, ok := m.Attribute(key); ok {
					t.Errorf("audio has a=%s", key)
				}
			}
			if _, ok := m.Attribute("rtcp-mux"); !ok {
				t.Error("audio has no a=rtcp-mux")
			}
			if v, _ := m.Attribute("rtpmap"); v != pt+" opus/48000/2" {
				t.Errorf("a=rtpmap:%s", v)
			}
			if v, _ := m.Attribute("fmtp"); v != pt+" minptime=10;useinbandfec=1" {
				t.Errorf("a=fmtp:%s", v)
			}
			msid, hasMsid := m.Attribute("msid")
			ssrc, hasSSRC := m.Attribute("ssrc")
			if sends != hasMsid || sends != hasSSRC {
				t.Errorf("sends %v, but a=msid:%s a=ssrc:%s", sends, msid, ssrc)
			}
			if sends && (msid != p.StreamID+" "+p.TrackID || ssrc != strconv.FormatUint(uint64(p.AudioSSRC), 10)+" cname:"+p.CNAME) {
				t.Errorf("a=msid:%s a=ssrc:%s", msid, ssrc)
			}
			if v, ok := m.Attribute("ptime"); ok != (p.Ptime > 0) || ok && v != strconv.Itoa(p.Ptime) {
				t.Errorf("a=ptime:%s (present %v) with Ptime %d", v, ok, p.Ptime)
			}
		case "application":
			got = append(got, "application")
			if v, _ := m.Attribute("sctp-port"); v != "5000" {
				t.Errorf("a=sctp-port:%s", v)
			}
			init, hasInit := m.Attribute("sctp-init")
			if (p.SCTPInit != nil) != hasInit {
				t.Errorf("a=sctp-init:%s, our SCTPInit %x", init, p.SCTPInit)
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("answer sections %q, want %q\n%s", got, want, answer)
	}
	if wantN := 1 + btoi(p.TCPCandidate.IsValid()); candidates != wantN {
		t.Errorf("%d candidates, want %d", candidates, wantN)
	}
	g, _ := sd.Attribute("group")
	if o.Bundle != nil && g != "BUNDLE "+strings.Join(group, " ") {
		t.Errorf("a=group:%s, want BUNDLE of %q", g, group)
	}
}

func TestAnswerSNAPInitPassthrough(t *testing.T) {
	o, err := ParseOffer(strings.Replace(baseOffer, "a=sctp-port:5000", "a=sctp-init:AQIDBA==\r\na=sctp-port:5000", 1))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(o.SCTPInit, []byte{1, 2, 3, 4}) {
		t.Fatalf("SCTPInit %x", o.SCTPInit)
	}
	p := testParams()
	p.SCTPInit = []byte{5, 6, 7}
	answer, err := Answer(o, p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(answer, "a=sctp-init:BQYH\r\n") {
		t.Errorf("no a=sctp-init:BQYH\n%s", answer)
	}
	// Without the offer's, ours is not sent.
	o, err = ParseOffer(baseOffer)
	if err != nil {
		t.Fatal(err)
	}
	answer, err = Answer(o, p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(answer, "sctp-init") {
		t.Errorf("a=sctp-init answered to an offer without one\n%s", answer)
	}
}

// TestParseOfferErrors breaks one rule of ParseOffer per case and checks
// the error names what is wrong.
func TestParseOfferErrors(t *testing.T) {
	fp := "a=fingerprint:sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9\r\n"
	cases := []struct {
		name  string
		offer string
		want  string // a part of the error message
	}{
		{"empty", " \r\n", "empty"},
		{"not SDP", "hello", "does not parse"},
		{"no audio", regexp.MustCompile(`(?s)m=audio.*?(m=application)`).ReplaceAllString(baseOffer, "$1"), "no audio m-section"},
		{"audio rejected", strings.Replace(baseOffer, "m=audio 9", "m=audio 0", 1), "no audio m-section"},
		{"no Opus", strings.ReplaceAll(baseOffer, "opus/48000/2", "ISAC/16000"), "does not include Opus"},
		{"Opus at 16 kHz", strings.ReplaceAll(baseOffer, "opus/48000/2", "opus/16000/2"), "does not include Opus"},
		{"Opus not in the m= line", strings.Replace(baseOffer, "SAVPF 111 63", "SAVPF 63", 1), "does not include Opus"},
		{"plain RTP", strings.Replace(baseOffer, "UDP/TLS/RTP/SAVPF", "RTP/AVP", 1), "not DTLS-SRTP"},
		{"no rtcp-mux", strings.Replace(baseOffer, "a=rtcp-mux\r\n", "", 1), "a=rtcp-mux"},
		{"audio outside BUNDLE", strings.Replace(baseOffer, "BUNDLE 0 1", "BUNDLE 1", 1), "not in its BUNDLE group"},
		{"two credentials", strings.Replace(baseOffer, "a=ice-ufrag:Qx7b\r\na=ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq9Te\r\na=ice-options:trickle\r\na=fingerprint:sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9\r\na=setup:actpass\r\na=mid:1",
			"a=ice-ufrag:Zz9y\r\na=ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq9Te\r\na=ice-options:trickle\r\n"+fp+"a=setup:actpass\r\na=mid:1", 1), "RFC 8843 §7.1"},
		{"no credentials", regexp.MustCompile(`a=ice-(ufrag|pwd):[^\r]*\r\n`).ReplaceAllString(baseOffer, ""), "no a=ice-ufrag"},
		{"short ufrag", strings.ReplaceAll(baseOffer, "ice-ufrag:Qx7b", "ice-ufrag:Qx7"), "a=ice-ufrag:Qx7 is not 4-256"},
		{"ufrag with a colon", strings.ReplaceAll(baseOffer, "ice-ufrag:Qx7b", "ice-ufrag:Qx:7b"), "a=ice-ufrag:Qx:7b is not"},
		{"short pwd", strings.ReplaceAll(baseOffer, "ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq9Te", "ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq"), "a=ice-pwd is 21 characters"},
		{"no fingerprint", strings.ReplaceAll(baseOffer, fp, ""), "no a=fingerprint"},
		{"fingerprint hash", strings.Replace(baseOffer, "a=fingerprint:sha-256", "a=fingerprint:sha-3", 1), `hash function "sha-3"`},
		{"fingerprint length", strings.Replace(baseOffer, "E8:F9\r\n", "E8\r\n", 1), "digest has 31 colon-separated bytes, want 32"},
		{"fingerprint without colons", strings.Replace(baseOffer, "sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9",
			"sha-256 0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9", 1),
			"the sha-256 digest is written without colons: write its 32 bytes as hex pairs separated by colons (RFC 8122 §5): sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B"},
		{"fingerprint without colons, short", strings.Replace(baseOffer, "sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9",
			"sha-256 0a1b2c3d4e5f60718293a4b5c6d7e8f9", 1), "written without colons, and its 32 hex digits are not the 64 of 32 bytes"},
		{"audio and data in two BUNDLE groups", strings.Replace(baseOffer, "a=group:BUNDLE 0 1\r\n", "a=group:BUNDLE 0\r\na=group:BUNDLE 1\r\n", 1),
			`the offer has 2 BUNDLE groups, the audio (mid "0") in a=group:BUNDLE 0 and the data channel (mid "1") in a=group:BUNDLE 1`},
		{"fingerprint hex", strings.Replace(baseOffer, "E8:F9\r\n", "E8:G9\r\n", 1), `"G9" is not a hex byte`},
		{"fingerprint shape", strings.Replace(baseOffer, "a=fingerprint:sha-256 ", "a=fingerprint:sha-256", 1), "want \"<hash function>"},
		{"two roles", strings.Replace(baseOffer, "a=setup:actpass\r\na=mid:1", "a=setup:active\r\na=mid:1", 1), "one DTLS association needs one role"},
		{"holdconn", strings.ReplaceAll(baseOffer, "a=setup:actpass", "a=setup:holdconn"), "holdconn"},
		{"setup value", strings.ReplaceAll(baseOffer, "a=setup:actpass", "a=setup:both"), "a=setup:both is not"},
		{"duplicate mid", strings.Replace(baseOffer, "a=mid:1", "a=mid:0", 1), "share a=mid:0"},
		{"sctp-port", strings.Replace(baseOffer, "a=sctp-port:5000", "a=sctp-port:70000", 1), "a=sctp-port:70000"},
		{"max-message-size", strings.Replace(baseOffer, "a=max-message-size:262144", "a=max-message-size:-1", 1), "a=max-message-size:-1"},
		{"too many sections", baseOffer + strings.Repeat("m=video 0 UDP/TLS/RTP/SAVPF 96\r\n", maxSections-1), "at most 64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.offer == baseOffer {
				t.Fatal("the case does not change the offer")
			}
			o, err := ParseOffer(tc.offer)
			if err == nil {
				t.Fatalf("no error; offer %+v", o)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// Browser and GStreamer offers.
//
// The offers in testdata/*.sdp were captured from real clients by the
// tests below, run with -update-offers:
//
//	go test ./internal/peer -run 'TakesAnswer' -update-offers
//
// Each client loads testdata/offer.html (Chromium through chromedp with
// internal/testsupport/chromium's options, Firefox ESR as
// `firefox-esr --headless` with a fake microphone) or runs
// testdata/gst_offer.py (GStreamer webrtcbin, bundle-policy max-bundle),
// and makes two offers as a voice client does: its microphone's audio and
// an oai-events data channel ("audio"), and the same with a recvonly video
// transceiver ("video"). A test server on 127.0.0.1 answers each with
// Answer, the client sets the answer as its remote description and reports
// what it made of it, and the offers are written as
// testdata/<client>-<version>-<round>.sdp. The files were captured from
// Chromium 156, Firefox ESR 153 and GStreamer 1.22 (Debian's packages), on
// a machine with loopback only.

var updateOffers = flag.Bool("update-offers", false, "write the offers the TakesAnswer tests receive to testdata/<client>-<version>-<round>.sdp")

// browserParams are the answer parameters of the client tests: a
// max-message-size the clients do not use themselves, so that their
// reading of it shows.
func browserParams() AnswerParams {
	p := testParams()
	p.MaxMessageSize = 131072
	p.Ptime = 20
	return p
}

// roundResult is what a client reports of one round (testdata/offer.html,
// testdata/gst_offer.py).
type roundResult struct {
	Name           string `json:"name"`
	OK             bool   `json:"ok"`
	Error          string `json:"error"`
	SignalingState string `json:"signalingState"`
	Transceivers   []struct {
		Mid              string `json:"mid"`
		Kind             string `json:"kind"`
		CurrentDirection string `json:"currentDirection"`
	} `json:"transceivers"`
	SCTPMaxMessageSize int      `json:"sctpMaxMessageSize"`
	TrackStreams       []string `json:"trackStreams"`
}

// exchange is the test server a client posts its offers to: it serves
// testdata/offer.html at /, answers POST /offer?round=NAME with Answer
// (400 and the error when ParseOffer refuses the offer), and takes the
// page's results at POST /result.
type exchange struct {
	srv     *httptest.Server
	results chan []roundResult

	mu      sync.Mutex
	offers  map[string]string // round → offer
	answers map[string]string // round → answer
}

func newExchange(t *testing.T) *exchange {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("testdata", "offer.html"))
	if err != nil {
		t.Fatal(err)
	}
	x := &exchange{results: make(chan []roundResult, 1), offers: map[string]string{}, answers: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /favicon.ico", http.NotFound)
	mux.HandleFunc("POST /offer", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		round := r.URL.Query().Get("round")
		x.mu.Lock()
		x.offers[round] = string(body)
		x.mu.Unlock()
		o, err := ParseOffer(string(body))
		if err != nil {
			http.Error(w, "ParseOffer: "+err.Error(), http.StatusBadRequest)
			return
		}
		answer, err := Answer(o, browserParams())
		if err != nil {
			http.Error(w, "Answer: "+err.Error(), http.StatusInternalServerError)
			return
		}
		x.mu.Lock()
		x.answers[round] = answer
		x.mu.Unlock()
		w.Header().Set("Content-Type", "application/sdp")
		_, _ = io.WriteString(w, answer)
	})
	mux.HandleFunc("POST /result", func(w http.ResponseWriter, r *http.Request) {
		var res []roundResult
		if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case x.results <- res:
		default:
		}
	})
	x.srv = httptest.NewServer(mux)
	t.Cleanup(x.srv.Close)
	return x
}

// wait returns the page's results, or fails the test after timeout (a
// client that never reports).
func (x *exchange) wait(t *testing.T, timeout time.Duration) []roundResult {
	t.Helper()
	select {
	case res := <-x.results:
		return res
	case <-time.After(timeout):
		t.Fatalf("no results from the client within %v", timeout)
		return nil
	}
}

// check checks a client's rounds: each took the answer, its audio is
// negotiated sendrecv (the answer's direction seen from the client) with
// our stream, video is rejected, and the data channel's
// max-message-size is ours. browser is false for GStreamer, which does not
// report the SCTP transport's size or tracks before media flows. With
// -update-offers it writes each round's offer to
// testdata/<client>-<round>.sdp.
func (x *exchange) check(t *testing.T, client string, rounds []roundResult, browser bool) {
	t.Helper()
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(rounds) != 2 {
		t.Fatalf("%d rounds reported, want 2: %+v", len(rounds), rounds)
	}
	p := browserParams()
	for _, r := range rounds {
		offer, answer := x.offers[r.Name], x.answers[r.Name]
		if !r.OK {
			t.Errorf("round %s: %s\noffer:\n%s\nanswer:\n%s", r.Name, r.Error, offer, answer)
			continue
		}
		if r.SignalingState != "stable" {
			t.Errorf("round %s: signaling state %q after the answer", r.Name, r.SignalingState)
		}
		o, err := ParseOffer(offer)
		if err != nil {
			t.Fatalf("round %s: %v", r.Name, err)
		}
		// The audio is negotiated sendrecv, the answer's direction seen
		// from the client. A rejected video transceiver is stopped with
		// its mid cleared (Firefox), or gone (Chromium removes stopped
		// transceivers, W3C WebRTC §4.4.1.6); webrtcbin 1.22 clears its mid
		// and leaves its current-direction as offered.
		var audio []string
		for _, tr := range r.Transceivers {
			switch {
			case tr.Kind == "audio":
				audio = append(audio, tr.Mid+":"+tr.CurrentDirection)
			case tr.Kind == "video" && r.Name == "video" && tr.Mid == "" && (!browser || tr.CurrentDirection == "stopped"):
			default:
				t.Errorf("round %s: transceiver %+v", r.Name, tr)
			}
		}
		if want := []string{o.Sections[o.Audio].Mid + ":sendrecv"}; !slices.Equal(audio, want) {
			t.Errorf("round %s: audio transceivers (mid:currentDirection) %q, want %q\nanswer:\n%s", r.Name, audio, want, answer)
		}
		if browser {
			if r.SCTPMaxMessageSize != p.MaxMessageSize {
				t.Errorf("round %s: the SCTP transport's maxMessageSize is %d, the answer's a=max-message-size %d", r.Name, r.SCTPMaxMessageSize, p.MaxMessageSize)
			}
			if want := []string{"audio:" + p.StreamID}; !slices.Equal(r.TrackStreams, want) {
				t.Errorf("round %s: tracks (kind:streams) %q, want %q (a=msid)", r.Name, r.TrackStreams, want)
			}
		}
		if *updateOffers {
			name := filepath.Join("testdata", client+"-"+r.Name+".sdp")
			if err := os.WriteFile(name, []byte(offer), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", name)
		}
	}
}

// requireTool returns the first of names found in PATH; without one the
// test is skipped, except in CI (CI set), where a missing tool is an error.
func requireTool(t *testing.T, what string, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := what + " is not installed (scripts/deps.sh test installs it)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "; CI is set, and in CI a missing tool is an error")
	}
	t.Skip(msg)
	return ""
}

// majorVersion returns the first number in out ("Chromium 156.0…" → "156",
// "Mozilla Firefox 153.8.0esr" → "153"), keeping minor numbers when minor.
func majorVersion(out string, minor bool) string {
	m := regexp.MustCompile(`(\d+)\.(\d+)`).FindStringSubmatch(out)
	switch {
	case m == nil:
		return "unknown"
	case minor:
		return m[1] + "." + m[2]
	default:
		return m[1]
	}
}

// TestChromiumTakesAnswer has headless Chromium make the offers of
// testdata/offer.html and set Answer's answers (setRemoteDescription).
func TestChromiumTakesAnswer(t *testing.T) {
	bin := requireTool(t, "chromium", "chromium", "/usr/bin/chromium")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	client := "chromium-" + majorVersion(string(out), false)
	wav := filepath.Join(t.TempDir(), "silence.wav")
	if err := (&speech.Script{Rate: 48000, Samples: make([]int16, 48000)}).WriteWAV(wav); err != nil {
		t.Fatal(err)
	}
	x := newExchange(t)
	var output logbuf.Buffer
	allocCtx, allocCancel := chromedp.NewExecAllocator(context.Background(), chromium.Options(bin, wav, &output)...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer func() {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_ = chromedp.Cancel(cctx)
		ccancel()
		cancel()
		allocCancel()
		if t.Failed() {
			t.Logf("chromium output (tail):\n%s", output.Tail(8<<10))
		}
	}()
	if err := chromedp.Do(ctx, chromedp.Navigate(x.srv.URL)); err != nil {
		t.Fatal(err)
	}
	x.check(t, client, x.wait(t, 60*time.Second), true)
}

// firefoxPrefs give headless Firefox a fake microphone granted without a
// prompt, and keep it from reaching out to the network on its own.
var firefoxPrefs = map[string]any{
	"media.navigator.streams.fake":               true,
	"media.navigator.permission.disabled":        true,
	"browser.shell.checkDefaultBrowser":          false,
	"browser.aboutwelcome.enabled":               false,
	"app.update.auto":                            false,
	"datareporting.policy.dataSubmissionEnabled": false,
	"datareporting.healthreport.uploadEnabled":   false,
	"toolkit.telemetry.enabled":                  false,
	"network.captive-portal-service.enabled":     false,
	"network.connectivity-service.enabled":       false,
	"browser.safebrowsing.malware.enabled":       false,
	"browser.safebrowsing.phishing.enabled":      false,
	"extensions.update.enabled":                  false,
	"services.settings.server":                   "http://127.0.0.1:9/",
	"network.dns.disablePrefetch":                true,
}

// TestFirefoxTakesAnswer has headless Firefox ESR make the offers of
// testdata/offer.html and set Answer's answers.
func TestFirefoxTakesAnswer(t *testing.T) {
	bin := requireTool(t, "Firefox ESR", "firefox-esr", "firefox")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	client := "firefox-esr-" + majorVersion(string(out), false)
	profile := t.TempDir()
	var prefs strings.Builder
	for k, v := range firefoxPrefs {
		b, _ := json.Marshal(v)
		fmt.Fprintf(&prefs, "user_pref(%q, %s);\n", k, b)
	}
	if err := os.WriteFile(filepath.Join(profile, "user.js"), []byte(prefs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	x := newExchange(t)
	ctx, cancel := context.WithCancel(context.Background())
	var output logbuf.Buffer
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-remote", "--profile", profile, x.srv.URL)
	cmd.Env = append(os.Environ(), "HOME="+profile, "MOZ_CRASHREPORTER_DISABLE=1")
	cmd.Stdout, cmd.Stderr = &output, &output
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("firefox output:\n%s", output.String())
		}
	}()
	x.check(t, client, x.wait(t, 90*time.Second), true)
}

// TestGStreamerTakesAnswer has GStreamer's webrtcbin make offers and set
// Answer's answers (testdata/gst_offer.py).
func TestGStreamerTakesAnswer(t *testing.T) {
	py := requireTool(t, "python3", "/usr/bin/python3", "python3")
	check := `import gi; gi.require_version("Gst", "1.0"); gi.require_version("GstWebRTC", "1.0"); gi.require_version("GstSdp", "1.0")`
	if out, err := exec.Command(py, "-c", check).CombinedOutput(); err != nil {
		msg := fmt.Sprintf("GStreamer's Python bindings with webrtcbin are not installed (scripts/deps.sh test): %s", bytes.TrimSpace(out))
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	x := newExchange(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var stderr logbuf.Buffer
	cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "gst_offer.py"), x.srv.URL)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res struct {
		GStreamer string        `json:"gstreamer"`
		Rounds    []roundResult `json:"rounds"`
	}
	if jerr := json.Unmarshal(out, &res); err != nil || jerr != nil {
		t.Fatalf("gst_offer.py: %v, output %q (%v)\n%s", err, out, jerr, stderr.String())
	}
	x.check(t, "gstreamer-"+majorVersion(res.GStreamer, true), res.Rounds, false)
	if t.Failed() {
		t.Logf("gst_offer.py's stderr:\n%s", stderr.String())
	}
}

// TestSavedOffers answers the offers captured from Chromium, Firefox ESR
// and GStreamer (testdata/*.sdp, see above) and checks each answer's
// structure: every m-section answered in order with its mid, audio and
// data in BUNDLE, video rejected, Opus at the client's payload type.
func TestSavedOffers(t *testing.T) {
	type savedOffer struct {
		file     string
		opusPT   uint8
		opusFmtp string
		maxMsg   int // the offer's a=max-message-size
		want     []string
	}
	cases := []savedOffer{
		{"chromium-156-audio.sdp", 111, "minptime=10;useinbandfec=1", 262144, []string{"audio sendrecv", "application"}},
		{"chromium-156-video.sdp", 111, "minptime=10;useinbandfec=1", 262144, []string{"audio sendrecv", "video rejected", "application"}},
		{"firefox-esr-153-audio.sdp", 109, "maxplaybackrate=48000;stereo=1;useinbandfec=1", 1073741823, []string{"audio sendrecv", "application"}},
		{"firefox-esr-153-video.sdp", 109, "maxplaybackrate=48000;stereo=1;useinbandfec=1", 1073741823, []string{"audio sendrecv", "video rejected", "application"}},
		// webrtcbin: max-bundle (data and video bundle-only at port 0),
		// OPUS/48000 without a channel count, no a=max-message-size, and
		// an a=fmtp only once the encoder's caps are known.
		{"gstreamer-1.22-audio.sdp", 111, "", 65536, []string{"audio sendrecv", "application"}},
		{"gstreamer-1.22-video.sdp", 111, "sprop-stereo=0;sprop-maxcapturerate=48000", 65536, []string{"audio sendrecv", "video rejected", "application"}},
	}
	files, err := filepath.Glob(filepath.Join("testdata", "*.sdp"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !slices.ContainsFunc(cases, func(c savedOffer) bool { return c.file == filepath.Base(f) }) {
			t.Errorf("%s has no case in TestSavedOffers", f)
		}
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			o, err := ParseOffer(string(b))
			if err != nil {
				t.Fatal(err)
			}
			a, d := o.Sections[o.Audio], o.Sections[o.Data]
			if a.OpusPT != tc.opusPT || a.OpusFmtp != tc.opusFmtp || d.MaxMessageSize != tc.maxMsg || d.SCTPPort != 5000 {
				t.Errorf("Opus %d %q, max-message-size %d, sctp-port %d; want Opus %d %q, %d, 5000",
					a.OpusPT, a.OpusFmtp, d.MaxMessageSize, d.SCTPPort, tc.opusPT, tc.opusFmtp, tc.maxMsg)
			}
			if o.Setup != "actpass" || len(o.Fingerprints) != 1 || o.Fingerprints[0].Hash != "sha-256" {
				t.Errorf("setup %q, fingerprints %v", o.Setup, o.Fingerprints)
			}
			p := testParams()
			answer, err := Answer(o, p)
			if err != nil {
				t.Fatal(err)
			}
			checkAnswer(t, o, p, answer, tc.want, true)
		})
	}
}

// TestAnswerCandidate checks the one candidate and the BUNDLE tag's
// address lines for IPv4, IPv4-mapped IPv6 and IPv6 ingresses.
func TestAnswerCandidate(t *testing.T) {
	cases := []struct {
		ingress, candidate, conn, port string
	}{
		{"192.0.2.7:3478", " 1 udp 2130706431 192.0.2.7 3478 typ host", "c=IN IP4 192.0.2.7", "m=audio 3478 "},
		{"[::ffff:192.0.2.7]:3478", " 1 udp 2130706431 192.0.2.7 3478 typ host", "c=IN IP4 192.0.2.7", "m=audio 3478 "},
		{"[2001:db8::7]:443", " 1 udp 2130706431 2001:db8::7 443 typ host", "c=IN IP6 2001:db8::7", "m=audio 443 "},
	}
	o, err := ParseOffer(baseOffer)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.ingress, func(t *testing.T) {
			p := testParams()
			p.Candidate = netip.MustParseAddrPort(tc.ingress)
			answer, err := Answer(o, p)
			if err != nil {
				t.Fatal(err)
			}
			cand := regexp.MustCompile(`a=candidate:(\d+)( [^\r]*)\r\n`).FindStringSubmatch(answer)
			if cand == nil || cand[2] != tc.candidate {
				t.Errorf("candidate line %q, want a=candidate:<foundation>%s", cand, tc.candidate)
			}
			if !strings.Contains(answer, "\r\n"+tc.conn+"\r\n") || !strings.Contains(answer, "\r\n"+tc.port) {
				t.Errorf("no %q and %q\n%s", tc.conn, tc.port, answer)
			}
			checkAnswer(t, o, p, answer, []string{"audio sendrecv", "application"}, true)
		})
	}
}

// TestAnswerSetup checks the DTLS roles Answer allows against the offer's
// a=setup (RFC 4145 §4): the answer's must differ from an offered active
// or passive, and may be either for actpass or none.
func TestAnswerSetup(t *testing.T) {
	for _, offered := range []string{"actpass", "active", "passive", ""} {
		offer := strings.ReplaceAll(baseOffer, "a=setup:actpass\r\n", "")
		if offered != "" {
			offer = strings.ReplaceAll(baseOffer, "a=setup:actpass", "a=setup:"+offered)
		}
		o, err := ParseOffer(offer)
		if err != nil {
			t.Fatal(err)
		}
		if o.Setup != offered {
			t.Errorf("offered a=setup:%s, parsed %q", offered, o.Setup)
		}
		for _, ours := range []string{"active", "passive"} {
			p := testParams()
			p.Setup = ours
			answer, err := Answer(o, p)
			if ok := offered != ours; ok != (err == nil) {
				t.Errorf("offer a=setup:%q, ours %s: error %v", offered, ours, err)
			} else if err != nil && !strings.Contains(err.Error(), "the roles must differ") {
				t.Errorf("error %q does not say the roles must differ", err)
			} else if err == nil && strings.Count(answer, "a=setup:"+ours+"\r\n") != 2 {
				t.Errorf("answer has not a=setup:%s in both sections\n%s", ours, answer)
			}
		}
	}
}

// TestAnswerParamsErrors gives Answer one bad parameter per case.
func TestAnswerParamsErrors(t *testing.T) {
	cases := []struct {
		name   string
		change func(p *AnswerParams)
		want   string
	}{
		{"short ufrag", func(p *AnswerParams) { p.ICEUfrag = "abc" }, "our credentials"},
		{"pwd with a space", func(p *AnswerParams) { p.ICEPwd = "sbAnswerPassword Of32Characters0" }, "our credentials"},
		{"fingerprint hash", func(p *AnswerParams) { p.Fingerprint.Hash = "SHA-256" }, `fingerprint "SHA-256"`},
		{"fingerprint length", func(p *AnswerParams) { p.Fingerprint.Digest = p.Fingerprint.Digest[:20] }, "20-byte digest"},
		{"setup", func(p *AnswerParams) { p.Setup = "actpass" }, `setup "actpass": want active or passive`},
		{"no candidate", func(p *AnswerParams) { p.Candidate = netip.AddrPort{} }, "candidate invalid AddrPort"},
		{"port 0", func(p *AnswerParams) { p.Candidate = netip.MustParseAddrPort("127.0.0.1:0") }, "candidate 127.0.0.1:0"},
		{"unspecified", func(p *AnswerParams) { p.Candidate = netip.MustParseAddrPort("0.0.0.0:3478") }, "candidate 0.0.0.0:3478"},
		{"zone", func(p *AnswerParams) { p.Candidate = netip.MustParseAddrPort("[fe80::1%eth0]:3478") }, "without a zone"},
		{"stream id", func(p *AnswerParams) { p.StreamID = "" }, "msid"},
		{"track id", func(p *AnswerParams) { p.TrackID = "voice track" }, "msid"},
		{"no CNAME", func(p *AnswerParams) { p.CNAME = "" }, "CNAME is empty"},
		{"CNAME with a space", func(p *AnswerParams) { p.CNAME = "a b" }, "white space"},
		{"SCTP port", func(p *AnswerParams) { p.SCTPPort = 0 }, "SCTP port 0"},
		{"max message size", func(p *AnswerParams) { p.MaxMessageSize = -1 }, "max message size -1"},
		{"ptime", func(p *AnswerParams) { p.Ptime = -10 }, "ptime -10"},
	}
	o, err := ParseOffer(baseOffer)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := testParams()
			tc.change(&p)
			answer, err := Answer(o, p)
			if err == nil {
				t.Fatalf("no error\n%s", answer)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	if _, err := Answer(&Offer{Audio: -1, Data: -1}, testParams()); err == nil || !strings.Contains(err.Error(), "no audio section") {
		t.Errorf("an offer without audio: error %v", err)
	}
}

// TestParseOfferShapes covers offers that parse but are answered in part:
// the legacy SCTP form, an offer without BUNDLE, and an audio section at
// port 0 with a=bundle-only.
func TestParseOfferShapes(t *testing.T) {
	legacy := strings.Replace(strings.Replace(baseOffer,
		"m=application 9 UDP/DTLS/SCTP webrtc-datachannel", "m=application 9 DTLS/SCTP 5000", 1),
		"a=sctp-port:5000", "a=sctpmap:5000 webrtc-datachannel 1024", 1)
	// Without BUNDLE, the data section has credentials, a fingerprint and
	// a role of its own, which do not matter: it is not served.
	noBundle := strings.Replace(strings.Replace(strings.Replace(strings.Replace(baseOffer,
		"a=group:BUNDLE 0 1\r\n", "", 1),
		"a=ice-ufrag:Qx7b\r\na=ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq9Te\r\na=ice-options:trickle\r\na=fingerprint:sha-256 0A", "a=ice-ufrag:Zz9y\r\na=ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq9Te\r\na=ice-options:trickle\r\na=fingerprint:sha-256 0A", 2),
		"a=ice-ufrag:Zz9y", "a=ice-ufrag:Qx7b", 1),
		"a=setup:actpass\r\na=mid:1", "a=setup:active\r\na=mid:1", 1)
	if strings.Count(noBundle, "a=ice-ufrag:Zz9y") != 1 || strings.Count(noBundle, "a=setup:active") != 1 {
		t.Fatalf("the data section of the offer without BUNDLE has the audio's credentials or role:\n%s", noBundle)
	}
	bundleOnly := strings.Replace(strings.Replace(baseOffer, "BUNDLE 0 1", "BUNDLE 1 0", 1),
		"m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126\r\n", "m=audio 0 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126\r\na=bundle-only\r\n", 1)
	// Two BUNDLE groups, two transports: the audio's is served, the
	// other's section answered rejected.
	twoGroups := strings.Replace(baseOffer, "a=group:BUNDLE 0 1\r\n", "a=group:BUNDLE 0 1\r\na=group:BUNDLE 2\r\n", 1) +
		"m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=ice-ufrag:Vv8w\r\na=ice-pwd:r2VxZ0vVNa6lAk1Y2vXkq9Te\r\n" +
		"a=fingerprint:sha-256 0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9\r\n" +
		"a=setup:actpass\r\na=mid:2\r\na=sendrecv\r\na=rtcp-mux\r\na=rtpmap:96 VP8/90000\r\n"
	cases := []struct {
		name, offer string
		data        int
		want        []string
		lines       []string // in the answer
	}{
		{"video in a second BUNDLE group", twoGroups, 1, []string{"audio sendrecv", "application", "video rejected"},
			[]string{"a=group:BUNDLE 0 1\r\n", "m=video 0 UDP/TLS/RTP/SAVPF 0\r\n"}},
		{"legacy SCTP", legacy, -1, []string{"audio sendrecv", "application rejected"},
			[]string{"m=application 0 DTLS/SCTP 5000\r\n", "a=group:BUNDLE 0\r\n"}},
		{"no BUNDLE", noBundle, -1, []string{"audio sendrecv", "application rejected"},
			[]string{"m=application 0 UDP/DTLS/SCTP webrtc-datachannel\r\n"}},
		{"bundle-only audio", bundleOnly, 1, []string{"audio sendrecv", "application"},
			[]string{"m=audio 3478 UDP/TLS/RTP/SAVPF 111\r\n", "a=group:BUNDLE 0 1\r\n"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseOffer(tc.offer)
			if err != nil {
				t.Fatal(err)
			}
			if o.ICEUfrag != "Qx7b" || o.Setup != "actpass" {
				t.Errorf("credentials %q/…, setup %q; want the audio's, Qx7b/… and actpass", o.ICEUfrag, o.Setup)
			}
			if o.Audio != 0 || o.Data != tc.data || o.Sections[0].Rejected {
				t.Errorf("audio %d (rejected %v), data %d; want 0 (false), %d", o.Audio, o.Sections[0].Rejected, o.Data, tc.data)
			}
			answer, err := Answer(o, testParams())
			if err != nil {
				t.Fatal(err)
			}
			checkAnswer(t, o, testParams(), answer, tc.want, true)
			for _, l := range tc.lines {
				if !strings.Contains(answer, l) {
					t.Errorf("no %q\n%s", l, answer)
				}
			}
			if o.Bundle == nil && strings.Contains(answer, "a=group") {
				t.Errorf("a BUNDLE group answers an offer without one\n%s", answer)
			}
		})
	}
}

// FuzzParseOffer feeds ParseOffer arbitrary text: it never panics, and
// what it accepts Answer answers with one well-formed m-section per
// offered one.
func FuzzParseOffer(f *testing.F) {
	f.Add(baseOffer)
	files, _ := filepath.Glob(filepath.Join("testdata", "*.sdp"))
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(string(b))
		}
	}
	f.Fuzz(func(t *testing.T, offer string) {
		o, err := ParseOffer(offer)
		if err != nil {
			return
		}
		if o.Audio < 0 || o.Audio >= len(o.Sections) || o.Sections[o.Audio].Kind != "audio" || o.Sections[o.Audio].Rejected ||
			o.Data >= len(o.Sections) || o.Data >= 0 && o.Sections[o.Data].Kind != "application" ||
			len(o.Fingerprints) == 0 || o.ICEUfrag == "" || o.ICEPwd == "" {
			t.Fatalf("accepted offer %+v", o)
		}
		p := testParams()
		if o.Setup == "active" {
			p.Setup = "passive"
		}
		answer, err := Answer(o, p)
		if err != nil {
			t.Fatalf("Answer: %v", err)
		}
		var sd sdp.SessionDescription
		if err := sd.UnmarshalString(answer); err != nil {
			t.Fatalf("the answer does not parse: %v\n%s", err, answer)
		}
		if len(sd.MediaDescriptions) != len(o.Sections) {
			t.Fatalf("%d m-sections answer %d", len(sd.MediaDescriptions), len(o.Sections))
		}
	})
}

// BenchmarkParseOfferAnswer measures one session's SDP work on Chromium's
// offer: ParseOffer and Answer.
func BenchmarkParseOfferAnswer(b *testing.B) {
	offer, err := os.ReadFile(filepath.Join("testdata", "chromium-156-audio.sdp"))
	if err != nil {
		b.Fatal(err)
	}
	p := testParams()
	b.ReportAllocs()
	for b.Loop() {
		o, err := ParseOffer(string(offer))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Answer(o, p); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAnswerDirection answers each offered audio direction, at media and
// at session level (Firefox writes a session-level a=sendrecv).
func TestAnswerDirection(t *testing.T) {
	cases := []struct{ offered, answered string }{
		{"sendrecv", "sendrecv"}, {"sendonly", "recvonly"}, {"recvonly", "sendonly"}, {"inactive", "inactive"},
	}
	for _, tc := range cases {
		for _, level := range []string{"media", "session"} {
			t.Run(tc.offered+" "+level, func(t *testing.T) {
				offer := strings.Replace(baseOffer, "a=sendrecv\r\n", "a="+tc.offered+"\r\n", 1)
				if level == "session" {
					offer = strings.Replace(strings.Replace(baseOffer, "a=sendrecv\r\n", "", 1),
						"t=0 0\r\n", "t=0 0\r\na="+tc.offered+"\r\n", 1)
				}
				o, err := ParseOffer(offer)
				if err != nil {
					t.Fatal(err)
				}
				if o.Sections[0].Direction != tc.offered {
					t.Errorf("direction %q, offered %q", o.Sections[0].Direction, tc.offered)
				}
				p := testParams()
				answer, err := Answer(o, p)
				if err != nil {
					t.Fatal(err)
				}
				sends := tc.answered == "sendrecv" || tc.answered == "sendonly"
				checkAnswer(t, o, p, answer, []string{"audio " + tc.answered, "application"}, sends)
			})
		}
	}
}

// TestAnswerTCPCandidate: with a TCP ingress, the answer adds a passive
// TCP host candidate (RFC 6544) after the UDP one, at a lower priority,
// before a=end-of-candidates; Pion's ICE reads both.
func TestAnswerTCPCandidate(t *testing.T) {
	o, err := ParseOffer(baseOffer)
	if err != nil {
		t.Fatal(err)
	}
	p := testParams()
	p.Candidate = netip.MustParseAddrPort("192.0.2.7:3478")
	p.TCPCandidate = netip.MustParseAddrPort("192.0.2.7:443")
	answer, err := Answer(o, p)
	if err != nil {
		t.Fatal(err)
	}
	lines := regexp.MustCompile(`a=candidate:([^\r]*)\r\n`).FindAllStringSubmatch(answer, -1)
	if len(lines) != 2 || !strings.Contains(answer, lines[1][0]+"a=end-of-candidates\r\n") {
		t.Fatalf("candidate lines %q, want UDP then TCP then a=end-of-candidates\n%s", lines, answer)
	}
	if want := " 1 tcp 2124414975 192.0.2.7 443 typ host tcptype passive"; !strings.HasSuffix(lines[1][1], want) {
		t.Errorf("TCP candidate %q, want <foundation>%s", lines[1][1], want)
	}
	udp, err := ice.UnmarshalCandidate(lines[0][1])
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := ice.UnmarshalCandidate(lines[1][1])
	if err != nil {
		t.Fatal(err)
	}
	if tcp.NetworkType() != ice.NetworkTypeTCP4 || tcp.TCPType() != ice.TCPTypePassive || tcp.Port() != 443 || tcp.Type() != ice.CandidateTypeHost {
		t.Errorf("Pion reads the TCP candidate as %s", tcp)
	}
	if tcp.Priority() >= udp.Priority() || tcp.Foundation() == udp.Foundation() {
		t.Errorf("TCP priority %d, foundation %s; UDP %d, %s: want TCP lower, foundations apart", tcp.Priority(), tcp.Foundation(), udp.Priority(), udp.Foundation())
	}
	checkAnswer(t, o, p, answer, []string{"audio sendrecv", "application"}, true)

	p.TCPCandidate = netip.MustParseAddrPort("0.0.0.0:443")
	if _, err := Answer(o, p); err == nil || !strings.Contains(err.Error(), "TCP candidate") {
		t.Errorf("unspecified TCP candidate: %v", err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
