package peer

import (
	"bytes"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
)

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
