package sdpfrag

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rfc8840Example is the shape of the fragment in RFC 8840 §4.4 and RFC 9725
// §4.3.1 (values ours).
const rfc8840Example = "a=ice-options:trickle ice2\r\n" +
	"a=group:BUNDLE 0\r\n" +
	"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" +
	"a=mid:0\r\n" +
	"a=ice-ufrag:EsAw\r\n" +
	"a=ice-pwd:P2uYro0UCOQ4zxjKXaWCBui1\r\n" +
	"a=candidate:1387637174 1 udp 2122260223 192.0.2.1 61764 typ host generation 0 ufrag EsAw\r\n" +
	"a=candidate:3471623853 1 udp 2122194687 198.51.100.2 61765 typ host generation 0 ufrag EsAw\r\n" +
	"a=end-of-candidates\r\n"

func TestParseExample(t *testing.T) {
	f, err := Parse(rfc8840Example)
	if err != nil {
		t.Fatal(err)
	}
	want := Fragment{
		Ufrag: "EsAw", Pwd: "P2uYro0UCOQ4zxjKXaWCBui1",
		MLine: "audio 9 UDP/TLS/RTP/SAVPF 111", Mid: "0",
		Candidates: []string{
			"candidate:1387637174 1 udp 2122260223 192.0.2.1 61764 typ host generation 0 ufrag EsAw",
			"candidate:3471623853 1 udp 2122194687 198.51.100.2 61765 typ host generation 0 ufrag EsAw",
		},
		EndOfCandidates: true,
	}
	if f.Ufrag != want.Ufrag || f.Pwd != want.Pwd || f.MLine != want.MLine || f.Mid != want.Mid ||
		strings.Join(f.Candidates, "|") != strings.Join(want.Candidates, "|") || !f.EndOfCandidates {
		t.Fatalf("Parse = %+v\nwant  %+v", f, want)
	}
	// String then Parse round-trips.
	g, err := Parse(f.String())
	if err != nil {
		t.Fatal(err)
	}
	if g.String() != f.String() {
		t.Fatalf("round trip:\n%s\n!=\n%s", g.String(), f.String())
	}
}

func TestParseTrickleOnly(t *testing.T) {
	f, err := Parse("a=mid:0\na=candidate:1 1 udp 1 192.0.2.1 9 typ host\n")
	if err != nil {
		t.Fatal(err)
	}
	if f.Ufrag != "" || len(f.Candidates) != 1 {
		t.Fatalf("got %+v", f)
	}
}

func TestParseErrors(t *testing.T) {
	pwd := strings.Repeat("p", 22)
	for name, in := range map[string]string{
		"not sdp":          "hello\n",
		"ufrag only":       "a=ice-ufrag:abcd\n",
		"pwd only":         "a=ice-pwd:" + pwd + "\n",
		"short ufrag":      "a=ice-ufrag:abc\na=ice-pwd:" + pwd + "\n",
		"bad char":         "a=ice-ufrag:ab-cd\na=ice-pwd:" + pwd + "\n",
		"short pwd":        "a=ice-ufrag:abcd\na=ice-pwd:short\n",
		"two ufrags":       "a=ice-ufrag:abcd\na=ice-ufrag:efgh\na=ice-pwd:" + pwd + "\n",
		"two pwds":         "a=ice-ufrag:abcd\na=ice-pwd:" + pwd + "\na=ice-pwd:" + pwd + "x\n",
		"long ufrag":       "a=ice-ufrag:" + strings.Repeat("a", 257) + "\na=ice-pwd:" + pwd + "\n",
		"empty type value": "=\n",
	} {
		if _, err := Parse(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Parse error = %v, want ErrMalformed", name, err)
		}
	}
}

const offer = "v=0\r\n" +
	"o=- 1 2 IN IP4 127.0.0.1\r\n" +
	"s=-\r\n" +
	"t=0 0\r\n" +
	"a=group:BUNDLE 0 1\r\n" +
	"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" +
	"c=IN IP4 0.0.0.0\r\n" +
	"a=mid:0\r\n" +
	"a=ice-ufrag:oldU\r\n" +
	"a=ice-pwd:oldpwdoldpwdoldpwdoldp\r\n" +
	"a=candidate:1 1 udp 1 192.0.2.1 1000 typ host\r\n" +
	"a=end-of-candidates\r\n" +
	"m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n" +
	"a=mid:1\r\n" +
	"a=ice-ufrag:oldU\r\n" +
	"a=ice-pwd:oldpwdoldpwdoldpwdoldp\r\n" +
	"a=candidate:1 1 udp 1 192.0.2.1 1000 typ host\r\n" +
	"a=end-of-candidates\r\n"

func TestApplyTo(t *testing.T) {
	f := Fragment{Ufrag: "newU", Pwd: "newpwdnewpwdnewpwdnewp", Candidates: []string{"candidate:2 1 udp 1 198.51.100.7 2000 typ host"}}
	got := f.ApplyTo(offer)
	for _, gone := range []string{"oldU", "oldpwd", "192.0.2.1"} {
		if strings.Contains(got, gone) {
			t.Errorf("result still has %q:\n%s", gone, got)
		}
	}
	if n := strings.Count(got, "a=ice-ufrag:newU\r\n"); n != 2 {
		t.Errorf("%d new ufrag lines, want 2 (both sections)", n)
	}
	if n := strings.Count(got, "198.51.100.7 2000"); n != 1 {
		t.Errorf("%d new candidates, want 1 (first section only)", n)
	}
	if i, j := strings.Index(got, "198.51.100.7"), strings.Index(got, "m=application"); i < 0 || i > j {
		t.Errorf("candidate not in the first section:\n%s", got)
	}
	// The result parses back to the fragment's credentials and candidates.
	back, err := FromSDP(got)
	if err != nil || back.Ufrag != "newU" || len(back.Candidates) != 1 {
		t.Fatalf("FromSDP(ApplyTo) = %+v, %v", back, err)
	}

	// No candidates in the fragment: sdp's stay.
	keep := Fragment{Ufrag: "newU", Pwd: "newpwdnewpwdnewpwdnewp"}.ApplyTo(offer)
	if strings.Count(keep, "192.0.2.1 1000") != 2 {
		t.Errorf("candidates changed without fragment candidates:\n%s", keep)
	}

	// A description without candidates gets the fragment's at the end of
	// its first section.
	bare := strings.ReplaceAll(strings.ReplaceAll(offer, "a=candidate:1 1 udp 1 192.0.2.1 1000 typ host\r\n", ""), "a=end-of-candidates\r\n", "")
	added := f.ApplyTo(bare)
	if i, j := strings.Index(added, "198.51.100.7"), strings.Index(added, "m=application"); i < 0 || i > j {
		t.Errorf("candidate not added to the first section:\n%s", added)
	}
}

func TestFromSDPNeedsCredentials(t *testing.T) {
	if _, err := FromSDP("v=0\r\nm=audio 9 RTP/AVP 0\r\n"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
}

// FuzzParse: a fragment is network input; Parse never panics, and what it
// accepts writes out to something it accepts again, the same.
func FuzzParse(f *testing.F) {
	f.Add(rfc8840Example)
	f.Add("a=ice-ufrag:abcd\na=ice-pwd:" + strings.Repeat("p", 22) + "\n")
	f.Add("m=\na=:\n\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		fr, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(fr.String())
		if err != nil {
			t.Fatalf("String() of an accepted fragment does not parse: %v\n%q", err, fr.String())
		}
		if again.Ufrag != fr.Ufrag || again.Pwd != fr.Pwd || len(again.Candidates) != len(fr.Candidates) {
			t.Fatalf("round trip changed the fragment: %+v -> %+v", fr, again)
		}
	})
}
