// Package sdpfrag reads and writes SDP fragments, the
// application/trickle-ice-sdpfrag bodies of RFC 8840 §9 that WHIP (RFC 9725
// §4.3) sends in PATCH requests for trickle ICE and ICE restarts, and that
// Switchboard's signaling API uses the same way (docs/signaling.md).
//
// A fragment is a few SDP lines, CRLF or LF terminated, e.g.
//
//	a=ice-options:trickle
//	a=group:BUNDLE 0
//	m=audio 9 UDP/TLS/RTP/SAVPF 111
//	a=mid:0
//	a=ice-ufrag:EsAw
//	a=ice-pwd:P2uYro0UCOQ4zxjKXaWCBui1
//	a=candidate:1387637174 1 udp 2122260223 192.0.2.1 61764 typ host
//	a=end-of-candidates
//
// Only the ICE attributes matter to a voice session with one BUNDLE group:
// Parse keeps the first ice-ufrag and ice-pwd (session or media level), the
// first mid and m= line, and every candidate. Anything else is skipped.
package sdpfrag

import (
	"errors"
	"fmt"
	"strings"
)

// ContentType is the media type of an SDP fragment (RFC 8840 §9).
const ContentType = "application/trickle-ice-sdpfrag"

// MaxLen bounds a fragment a server accepts, in bytes; real ones are a few
// hundred bytes.
const MaxLen = 16 << 10

// ErrMalformed is wrapped by every Parse error.
var ErrMalformed = errors.New("sdpfrag: malformed fragment")

// Fragment is the ICE content of an SDP fragment.
type Fragment struct {
	// Ufrag and Pwd are the ICE credentials (RFC 8839 §5.4): ufrag 4-256
	// ice-chars, pwd 22-256. Empty when the fragment only trickles
	// candidates.
	Ufrag, Pwd string
	// MLine is the m= line without the "m=" prefix, e.g.
	// "audio 9 UDP/TLS/RTP/SAVPF 111"; empty when absent.
	MLine string
	// Mid is the media stream identification (RFC 5888) the candidates
	// belong to; empty when absent.
	Mid string
	// Candidates are the values of the a=candidate lines, without the
	// "a=" prefix: "candidate:1 1 udp 2122260223 192.0.2.1 61764 typ host".
	Candidates []string
	// EndOfCandidates is true when the fragment carries a=end-of-candidates.
	EndOfCandidates bool
}

// Parse reads a fragment. It returns an error wrapping ErrMalformed for a
// line that is not SDP ("x=..."), credentials outside the RFC 8839 grammar,
// a ufrag without a pwd or the reverse, or conflicting credentials.
func Parse(s string) (Fragment, error) {
	var f Fragment
	for n, line := range strings.Split(s, "\n") {
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			continue
		}
		if len(line) < 2 || line[1] != '=' {
			return f, fmt.Errorf("%w: line %d %q is not an SDP line (type=value)", ErrMalformed, n+1, clip(line))
		}
		if line[0] == 'm' {
			if f.MLine == "" {
				f.MLine = line[2:]
			}
			continue
		}
		if line[0] != 'a' {
			continue
		}
		key, val, _ := strings.Cut(line[2:], ":")
		switch key {
		case "ice-ufrag":
			if f.Ufrag != "" && f.Ufrag != val {
				return f, fmt.Errorf("%w: two different ice-ufrag values", ErrMalformed)
			}
			f.Ufrag = val
		case "ice-pwd":
			if f.Pwd != "" && f.Pwd != val {
				return f, fmt.Errorf("%w: two different ice-pwd values", ErrMalformed)
			}
			f.Pwd = val
		case "mid":
			if f.Mid == "" {
				f.Mid = val
			}
		case "candidate":
			f.Candidates = append(f.Candidates, line[2:])
		case "end-of-candidates":
			f.EndOfCandidates = true
		}
	}
	switch {
	case (f.Ufrag == "") != (f.Pwd == ""):
		return f, fmt.Errorf("%w: ice-ufrag and ice-pwd must come together", ErrMalformed)
	case f.Ufrag == "":
	case !iceChars(f.Ufrag, 4, 256):
		return f, fmt.Errorf("%w: ice-ufrag %q must be 4 to 256 of A-Z a-z 0-9 + /", ErrMalformed, clip(f.Ufrag))
	case !iceChars(f.Pwd, 22, 256):
		return f, fmt.Errorf("%w: ice-pwd must be 22 to 256 of A-Z a-z 0-9 + /", ErrMalformed)
	}
	return f, nil
}

// String writes the fragment in the RFC 8840 order: the m= line and mid
// (when set), credentials, candidates, end-of-candidates; lines end in CRLF.
func (f Fragment) String() string {
	var b strings.Builder
	line := func(parts ...string) {
		for _, p := range parts {
			b.WriteString(p)
		}
		b.WriteString("\r\n")
	}
	if f.MLine != "" {
		line("m=", f.MLine)
	}
	if f.Mid != "" {
		line("a=mid:", f.Mid)
	}
	if f.Ufrag != "" {
		line("a=ice-ufrag:", f.Ufrag)
		line("a=ice-pwd:", f.Pwd)
	}
	for _, c := range f.Candidates {
		line("a=", c)
	}
	if f.EndOfCandidates {
		line("a=end-of-candidates")
	}
	return b.String()
}

// FromSDP extracts the fragment of a complete session description: its
// credentials, the first m= line and mid, and every candidate. It is what
// an ICE restart sends (a new offer's credentials) and answers (the new
// answer's).
func FromSDP(sdp string) (Fragment, error) {
	f, err := Parse(sdp)
	if err != nil {
		return f, err
	}
	if f.Ufrag == "" {
		return f, fmt.Errorf("%w: the description has no ice-ufrag and ice-pwd", ErrMalformed)
	}
	f.EndOfCandidates = true // a complete description carries all its candidates
	return f, nil
}

// ApplyTo returns sdp, a complete session description, with f's credentials
// in place of every ice-ufrag and ice-pwd line and, when f has candidates,
// f's candidates in place of sdp's (in the first media section). An ICE
// restart's answerer applies the offerer's fragment to the last remote
// offer, and the offerer applies the answer's fragment to the last remote
// answer: the result is the description the peer connection would have
// received without fragments.
func (f Fragment) ApplyTo(sdp string) string {
	var b strings.Builder
	b.Grow(len(sdp) + 256)
	media, placed := 0, false
	place := func() {
		if media == 1 && !placed && len(f.Candidates) > 0 {
			placed = true
			for _, cand := range f.Candidates {
				b.WriteString("a=" + cand + "\r\n")
			}
			b.WriteString("a=end-of-candidates\r\n")
		}
	}
	for line := range strings.SplitAfterSeq(sdp, "\n") {
		body := strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(body, "m="):
			place() // the first section had no candidates: they go at its end
			media++
		case strings.HasPrefix(body, "a=ice-ufrag:"):
			line = "a=ice-ufrag:" + f.Ufrag + "\r\n"
		case strings.HasPrefix(body, "a=ice-pwd:"):
			line = "a=ice-pwd:" + f.Pwd + "\r\n"
		case len(f.Candidates) > 0 && (strings.HasPrefix(body, "a=candidate:") || body == "a=end-of-candidates"):
			if media == 1 {
				place()
			}
			continue
		}
		b.WriteString(line)
	}
	place()
	return b.String()
}

// iceChars reports whether s is min to max ice-chars (RFC 8839 §5.4).
func iceChars(s string, min, max int) bool {
	if len(s) < min || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
