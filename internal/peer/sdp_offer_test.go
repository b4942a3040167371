package peer

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pion/sdp/v3"
)

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
