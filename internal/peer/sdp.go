package peer

import (
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"

	"github.com/pion/sdp/v3"
)

// Fingerprint is one a=fingerprint (RFC 8122 §5): a hash function name, lower case
// ("sha-256"), and its digest.
type Fingerprint struct {
	// Hash is the hash function's name in the RFC 8122 §5 registry
	// ("sha-1", "sha-256", "sha-384", "sha-512", …).
	Hash string
	// Digest is the certificate's digest as raw bytes (32 for sha-256),
	// not the colon-separated hex of the SDP line.
	Digest []byte
}

// String returns f as an a=fingerprint value: the hash function, a space,
// and the digest as upper-case hex bytes separated by colons (RFC 8122 §5),
// e.g. "sha-256 AB:CD:…".
func (f Fingerprint) String() string {
	const digits = "0123456789ABCDEF"
	b := make([]byte, 0, len(f.Hash)+3*len(f.Digest))
	b = append(b, f.Hash...)
	for i, c := range f.Digest {
		sep := byte(':')
		if i == 0 {
			sep = ' '
		}
		b = append(b, sep, digits[c>>4], digits[c&0x0f])
	}
	return string(b)
}

// Offer is what an answerer needs from a WebRTC offer (RFC 8829 / JSEP), validated.
type Offer struct {
	ICEUfrag, ICEPwd string        // the client's ICE credentials (one set across the BUNDLE group)
	Fingerprints     []Fingerprint // at least one, well formed
	Setup            string        // "active", "passive", "actpass" or "" (none); holdconn is refused
	Sections         []Section     // every m-section, in offer order
	Audio            int           // index in Sections of the audio section served (-1: none; ParseOffer refuses that)
	Data             int           // index in Sections of the application (SCTP) section, -1 when none
	Bundle           []string      // the mids of the BUNDLE group served, if any (bundleGroup)
	SCTPInit         []byte        // a=sctp-init (SCTP SNAP, a Pion extension) payload when offered; nil otherwise
}

// Section is one m-section of the offer.
type Section struct {
	Kind  string // "audio", "video", "application", ...
	Mid   string
	Proto string // e.g. "UDP/TLS/RTP/SAVPF", "UDP/DTLS/SCTP"
	// Rejected is true for port 0 in the offer without a=bundle-only: a
	// section the offerer disabled (RFC 3264 §8.2). A bundle-only section
	// (port 0 and a=bundle-only, RFC 8843 §6) is not rejected.
	Rejected bool
	// Direction is the section's a=sendrecv, a=sendonly, a=recvonly or
	// a=inactive, else the session's, else "sendrecv" (RFC 8866 §6.7).
	Direction string
	// Audio only: the payload type the offer gives opus/48000/2, and its fmtp line.
	// When the offer lists several, the first in the m= line's order (its
	// preference, RFC 3264 §5.1). OpusFmtp is the a=fmtp value after the
	// payload type, e.g. "minptime=10;useinbandfec=1"; empty when none.
	OpusPT   uint8
	OpusFmtp string
	// Application only.
	SCTPPort int // a=sctp-port, default 5000
	// MaxMessageSize is a=max-message-size in bytes, 65536 when absent and
	// 0 when the offerer takes messages of any size (RFC 8841 §6).
	MaxMessageSize int

	format string // the first format of the m= line, for a rejecting answer
}

// Defaults of an SCTP m-section's attributes when the offer leaves them out.
const (
	defaultSCTPPort       = 5000      // RFC 8841 §5
	defaultMaxMessageSize = 64 * 1024 // RFC 8841 §6.1
)

// maxSections bounds the m-sections of an offer: each one costs a line of
// the answer, and a voice session serves two.
const maxSections = 64

// fingerprintLen is the digest length in bytes of each hash function an
// a=fingerprint may name (RFC 8122 §5) that DTLS certificate checks
// support.
var fingerprintLen = map[string]int{
	"sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48, "sha-512": 64, "md5": 16,
}

// ParseOffer parses and validates an SDP offer (RFC 8866, RFC 8829): one
// the answerer can take a voice session from. Errors say what is wrong with
// the offer and how to fix it, for the client; the caller wraps them.
//
// The offer must parse, be at most 64 m-sections, have an audio m-section
// with a DTLS-SRTP profile that is not rejected and offers Opus at 48 kHz
// (opus/48000/2, RFC 7587 §7; see opusPayloadType) and rtcp-mux (RFC 5761;
// the answer advertises one ICE component), and, in the m-sections of its
// BUNDLE group (RFC 8843) that are not rejected, or in the audio section
// served when it has no BUNDLE group:
//
//   - one set of ICE credentials across the BUNDLE group, present and
//     well formed (RFC 8839 §5.4: ufrag 4-256 and pwd 22-256 characters of
//     ALPHA, DIGIT, "+" and "/"): it is one ICE session, so different
//     a=ice-ufrag/a=ice-pwd across it cannot be answered (RFC 8843 §7.1);
//   - at least one well-formed a=fingerprint (RFC 8122 §5: a hash function
//     DTLS can check, then its digest as colon-separated hex bytes of the
//     function's length), or the DTLS handshake could only fail later;
//   - one a=setup value of active, passive or actpass, or none. holdconn
//     (RFC 4145 §4: "do not establish the connection for now") is refused:
//     a voice session that must not connect has nothing to do.
//
// The audio section served is the first bundled one that qualifies; when
// the offer has a BUNDLE group it must be in it. Of several BUNDLE groups
// (several transports) the answer serves one, the audio's, and refuses an
// offer that puts the data channel in another (bundleGroup). The data section served
// is the first bundled application section with the UDP/DTLS/SCTP or
// TCP/DTLS/SCTP profile and the webrtc-datachannel format (RFC 8841 §4),
// and only when the offer has a BUNDLE group: without one, each section
// would be a transport of its own and the answer serves one. The legacy
// "DTLS/SCTP 5000" + a=sctpmap form (draft-ietf-mmusic-sctp-sdp-05, sent
// by browsers before 2019) is not served; it is answered rejected.
//
// A malformed a=sctp-init is ignored (SCTPInit nil): SNAP only saves a
// round trip, and the association then starts with the usual handshake.
func ParseOffer(offer string) (*Offer, error) {
	if strings.TrimSpace(offer) == "" {
		return nil, errors.New("the offer is empty; send an SDP offer")
	}
	var sd sdp.SessionDescription
	if err := sd.UnmarshalString(offer); err != nil {
		return nil, fmt.Errorf("SDP does not parse: %v", err)
	}
	if n := len(sd.MediaDescriptions); n > maxSections {
		return nil, fmt.Errorf("the offer has %d m-sections; at most %d are answered", n, maxSections)
	}
	bundle, err := bundleGroup(&sd)
	if err != nil {
		return nil, err
	}
	o := &Offer{Audio: -1, Data: -1, Bundle: bundle}
	grouped := o.Bundle != nil
	inGroup := make(map[string]bool, len(o.Bundle))
	for _, mid := range o.Bundle {
		inGroup[mid] = true
	}
	mids := make(map[string]bool, len(sd.MediaDescriptions))
	o.Sections = make([]Section, len(sd.MediaDescriptions))
	var bundled []int // indexes of the sections that may share the transport
	for i, m := range sd.MediaDescriptions {
		s := &o.Sections[i]
		s.Kind = m.MediaName.Media
		s.Mid = strings.TrimSpace(attrValue(m.Attributes, sdp.AttrKeyMID))
		s.Proto = strings.Join(m.MediaName.Protos, "/")
		if len(m.MediaName.Formats) > 0 {
			s.format = m.MediaName.Formats[0]
		}
		_, bundleOnly := m.Attribute("bundle-only")
		s.Rejected = m.MediaName.Port.Value == 0 && !bundleOnly
		s.Direction = direction(&sd, m)
		if s.Mid != "" {
			if mids[s.Mid] {
				return nil, fmt.Errorf("m-sections %d and an earlier one share a=mid:%s; each mid must be unique (RFC 5888 §4)", i, s.Mid)
			}
			mids[s.Mid] = true
		}
		if !s.Rejected && (!grouped || inGroup[s.Mid]) {
			bundled = append(bundled, i)
		}
	}

	if err := chooseAudio(&sd, o, bundled, grouped); err != nil {
		return nil, err
	}
	if grouped {
		if err := chooseData(&sd, o, bundled); err != nil {
			return nil, err
		}
	} else {
		// Without BUNDLE, each section is a transport of its own: only
		// the audio's is served, and only its attributes matter.
		bundled = []int{o.Audio}
	}

	for n, i := range bundled {
		m := sd.MediaDescriptions[i]
		where := fmt.Sprintf("m-section %d (mid %q)", i, o.Sections[i].Mid)
		u, p := sessionOrMedia(&sd, m, "ice-ufrag"), sessionOrMedia(&sd, m, "ice-pwd")
		if n == 0 {
			if err := checkICECredentials(u, p); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			o.ICEUfrag, o.ICEPwd = u, p
		} else if grouped && (u != o.ICEUfrag || p != o.ICEPwd) {
			return nil, fmt.Errorf("%s has ICE credentials %q/… other than the first bundled m-section's %q/…; "+
				"one BUNDLE group is one ICE session and must carry one a=ice-ufrag and a=ice-pwd (RFC 8843 §7.1)", where, u, o.ICEUfrag)
		}
		fps, err := fingerprints(&sd, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if n == 0 {
			o.Fingerprints = fps
		}
		s := sessionOrMedia(&sd, m, sdp.AttrKeyConnectionSetup)
		if n == 0 {
			o.Setup = s
		} else if s != o.Setup {
			return nil, fmt.Errorf("%s has a=setup:%s but the first bundled m-section a=setup:%s; one DTLS association needs one role", where, s, o.Setup)
		}
	}
	switch o.Setup {
	case "active", "passive", "actpass", "":
	case "holdconn":
		return nil, errors.New("a=setup:holdconn asks not to connect (RFC 4145 §4); offer a=setup:actpass to start a call")
	default:
		return nil, fmt.Errorf("a=setup:%s is not active, passive or actpass (RFC 4145 §4)", o.Setup)
	}
	return o, nil
}

// srtpProtos are the audio profiles an offer's audio may use: DTLS-SRTP
// over UDP or TCP, with or without RTCP feedback, and RTP/SAVP(F), which
// JSEP answerers accept (RFC 8829 §5.1.2). The answer repeats the offer's.
var srtpProtos = map[string]bool{
	"UDP/TLS/RTP/SAVPF": true, "TCP/DTLS/RTP/SAVPF": true,
	"UDP/TLS/RTP/SAVP": true, "TCP/DTLS/RTP/SAVP": true,
	"RTP/SAVPF": true, "RTP/SAVP": true,
}

// chooseAudio sets o.Audio to the first bundled audio section that
// offers Opus with rtcp-mux, or says why there is none.
func chooseAudio(sd *sdp.SessionDescription, o *Offer, bundled []int, grouped bool) error {
	var sawAudio, sawSecure bool
	for _, i := range bundled {
		m, s := sd.MediaDescriptions[i], &o.Sections[i]
		if s.Kind != "audio" {
			continue
		}
		sawAudio = true
		if !srtpProtos[s.Proto] {
			continue
		}
		sawSecure = true
		pt, ok := opusPayloadType(m)
		if !ok {
			continue
		}
		if _, mux := m.Attribute(sdp.AttrKeyRTCPMux); !mux {
			return fmt.Errorf("the audio m-section (mid %q) has no a=rtcp-mux; RTP and RTCP must share one port (RFC 5761, RFC 8843 §6)", s.Mid)
		}
		s.OpusPT = pt
		s.OpusFmtp = fmtp(m, pt)
		o.Audio = i
		return nil
	}
	switch {
	case sawSecure:
		return errors.New("the offer's audio does not include Opus (opus/48000/2), the one codec served")
	case sawAudio:
		return errors.New("the offer's audio m-section is not DTLS-SRTP; offer UDP/TLS/RTP/SAVPF (RFC 8829 §5.1.2)")
	}
	for _, s := range o.Sections {
		if s.Kind == "audio" && !s.Rejected && grouped {
			return fmt.Errorf("the offer's audio m-section (mid %q) is not in its BUNDLE group %q; bundle it (RFC 8843)", s.Mid, strings.Join(o.Bundle, " "))
		}
	}
	return errors.New("the offer has no audio m-section; add an audio transceiver (sendrecv)")
}

// chooseData sets o.Data and o.SCTPInit from the first bundled
// application section with a current SCTP-over-DTLS profile (RFC 8841),
// if any.
func chooseData(sd *sdp.SessionDescription, o *Offer, bundled []int) error {
	for _, i := range bundled {
		m, s := sd.MediaDescriptions[i], &o.Sections[i]
		if s.Kind != "application" {
			continue
		}
		if s.Proto != "UDP/DTLS/SCTP" && s.Proto != "TCP/DTLS/SCTP" || len(m.MediaName.Formats) != 1 || m.MediaName.Formats[0] != "webrtc-datachannel" {
			continue
		}
		s.SCTPPort, s.MaxMessageSize = defaultSCTPPort, defaultMaxMessageSize
		if v, ok := m.Attribute("sctp-port"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 || n > 65535 {
				return fmt.Errorf("the data m-section (mid %q) has a=sctp-port:%s; want a port number, 1-65535 (RFC 8841 §5)", s.Mid, v)
			}
			s.SCTPPort = n
		}
		if v, ok := m.Attribute("max-message-size"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 31)
			if err != nil {
				return fmt.Errorf("the data m-section (mid %q) has a=max-message-size:%s; want a size in bytes, or 0 for any (RFC 8841 §6)", s.Mid, v)
			}
			s.MaxMessageSize = int(n)
		}
		if v, ok := m.Attribute("sctp-init"); ok {
			if b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v)); err == nil && len(b) > 0 {
				o.SCTPInit = b
			}
		}
		o.Data = i
		return nil
	}
	return nil
}

// bundleGroup returns the mids of the offer's a=group:BUNDLE (RFC 8843
// §7) that the answer serves, nil when it has none. Several groups are
// several transports: the answer serves one (one ICE and DTLS session),
// the one with the first audio section in it (else the first data
// section), and its other sections are answered rejected, as unbundled
// ones are. An offer whose audio and data channel are in different groups
// is refused: its data channel would be rejected.
func bundleGroup(sd *sdp.SessionDescription) ([]string, error) {
	var groups [][]string
	for _, a := range sd.Attributes {
		if a.Key != sdp.AttrKeyGroup {
			continue
		}
		f := strings.Fields(a.Value)
		if len(f) > 1 && f[0] == "BUNDLE" {
			groups = append(groups, f[1:])
		}
	}
	switch len(groups) {
	case 0:
		return nil, nil
	case 1:
		return groups[0], nil
	}
	kind := make(map[string]string, len(sd.MediaDescriptions)) // mid → media of a section the offerer did not reject
	for _, m := range sd.MediaDescriptions {
		if _, bundleOnly := m.Attribute("bundle-only"); m.MediaName.Port.Value == 0 && !bundleOnly {
			continue
		}
		if mid := strings.TrimSpace(attrValue(m.Attributes, sdp.AttrKeyMID)); mid != "" && kind[mid] == "" {
			kind[mid] = m.MediaName.Media
		}
	}
	// The group and mid of the first audio and of the first data section.
	type place struct {
		group int
		mid   string
	}
	firstOf := func(media string) (place, bool) {
		for g, mids := range groups {
			for _, mid := range mids {
				if kind[mid] == media {
					return place{g, mid}, true
				}
			}
		}
		return place{}, false
	}
	a, hasAudio := firstOf("audio")
	d, hasData := firstOf("application")
	switch {
	case hasAudio && hasData && a.group != d.group:
		return nil, fmt.Errorf("the offer has %d BUNDLE groups, the audio (mid %q) in a=group:BUNDLE %s and the data channel (mid %q) in a=group:BUNDLE %s; "+
			"the answer serves one transport (one ICE and DTLS session), so the data channel would be rejected: put both in one a=group:BUNDLE (RFC 8843)",
			len(groups), a.mid, strings.Join(groups[a.group], " "), d.mid, strings.Join(groups[d.group], " "))
	case hasAudio:
		return groups[a.group], nil
	case hasData:
		return groups[d.group], nil
	}
	return groups[0], nil
}

// opusPayloadType returns the first payload type of m's format list that
// a=rtpmap maps to Opus at 48000 Hz. RFC 7587 §7 writes it opus/48000/2;
// the encoding name is case insensitive (RFC 4855 §3), and GStreamer's
// webrtcbin (1.22) offers "OPUS/48000", without the channel count, so any
// count, or none, is taken: an Opus stream signals its channels in each
// packet (RFC 6716 §3.1), and the answer writes opus/48000/2.
func opusPayloadType(m *sdp.MediaDescription) (uint8, bool) {
	for _, f := range m.MediaName.Formats {
		pt, err := strconv.ParseUint(f, 10, 7)
		if err != nil {
			continue
		}
		for _, a := range m.Attributes {
			if a.Key != "rtpmap" {
				continue
			}
			p, enc, ok := strings.Cut(strings.TrimSpace(a.Value), " ")
			if !ok || p != f {
				continue
			}
			name, rate, _ := strings.Cut(strings.TrimSpace(enc), "/")
			rate, _, _ = strings.Cut(rate, "/")
			if strings.EqualFold(name, "opus") && rate == "48000" {
				return uint8(pt), true
			}
		}
	}
	return 0, false
}

// fmtp returns the a=fmtp parameters m gives payload type pt, "" when none.
func fmtp(m *sdp.MediaDescription, pt uint8) string {
	want := strconv.Itoa(int(pt))
	for _, a := range m.Attributes {
		if a.Key != "fmtp" {
			continue
		}
		if p, params, ok := strings.Cut(strings.TrimSpace(a.Value), " "); ok && p == want {
			return strings.TrimSpace(params)
		}
	}
	return ""
}

// direction returns m's direction attribute, else the session's, else
// sendrecv (RFC 8866 §6.7).
func direction(sd *sdp.SessionDescription, m *sdp.MediaDescription) string {
	for _, attrs := range [][]sdp.Attribute{m.Attributes, sd.Attributes} {
		for _, a := range attrs {
			switch a.Key {
			case sdp.AttrKeySendRecv, sdp.AttrKeySendOnly, sdp.AttrKeyRecvOnly, sdp.AttrKeyInactive:
				return a.Key
			}
		}
	}
	return sdp.AttrKeySendRecv
}

// attrValue returns the value of the first attribute named key, "" when none.
func attrValue(attrs []sdp.Attribute, key string) string {
	for _, a := range attrs {
		if a.Key == key {
			return a.Value
		}
	}
	return ""
}

// sessionOrMedia returns the value of a media-level attribute, or of the
// session-level one when the m-section has none (RFC 8866 §5.13).
func sessionOrMedia(sd *sdp.SessionDescription, m *sdp.MediaDescription, key string) string {
	if v, ok := m.Attribute(key); ok {
		return strings.TrimSpace(v)
	}
	return strings.TrimSpace(attrValue(sd.Attributes, key))
}

// checkICECredentials checks an ICE ufrag and pwd against RFC 8839 §5.4:
// ufrag = 4*256ice-char, pwd = 22*256ice-char.
func checkICECredentials(ufrag, pwd string) error {
	switch {
	case ufrag == "" || pwd == "":
		return errors.New("no a=ice-ufrag and a=ice-pwd: ICE needs the client's credentials (RFC 8839 §5.4)")
	case len(ufrag) < 4 || len(ufrag) > 256 || !isICEChars(ufrag):
		return fmt.Errorf("a=ice-ufrag:%s is not 4-256 characters of A-Z, a-z, 0-9, + and / (RFC 8839 §5.4)", ufrag)
	case len(pwd) < 22 || len(pwd) > 256 || !isICEChars(pwd):
		return fmt.Errorf("a=ice-pwd is %d characters, or has characters other than A-Z, a-z, 0-9, + and /; want 22-256 of them (RFC 8839 §5.4)", len(pwd))
	}
	return nil
}

// isICEChars reports whether s is all ice-char (RFC 8839 §5.4).
func isICEChars(s string) bool {
	for i := range len(s) {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}

// fingerprints parses the a=fingerprint lines that apply to m (its own,
// else the session's): at least one, each well formed (RFC 8122 §5).
func fingerprints(sd *sdp.SessionDescription, m *sdp.MediaDescription) ([]Fingerprint, error) {
	var vals []string
	for _, attrs := range [][]sdp.Attribute{m.Attributes, sd.Attributes} {
		for _, a := range attrs {
			if a.Key == "fingerprint" {
				vals = append(vals, a.Value)
			}
		}
		if len(vals) > 0 {
			break
		}
	}
	if len(vals) == 0 {
		return nil, errors.New("no a=fingerprint: DTLS-SRTP needs the certificate's fingerprint (RFC 8122 §5, RFC 8842 §5)")
	}
	fps := make([]Fingerprint, 0, len(vals))
	for _, v := range vals {
		fp, err := parseFingerprint(v)
		if err != nil {
			return nil, fmt.Errorf("a=fingerprint:%s: %w", v, err)
		}
		fps = append(fps, fp)
	}
	return fps, nil
}

// allHex reports whether s is all hex digits.
func allHex(s string) bool {
	for i := range len(s) {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

// parseFingerprint parses one a=fingerprint value: "<hash-func> XX:XX:…".
func parseFingerprint(v string) (Fingerprint, error) {
	f := strings.Fields(v)
	if len(f) != 2 {
		return Fingerprint{}, errors.New(`want "<hash function> <hex bytes separated by colons>", e.g. "sha-256 AB:CD:…"`)
	}
	hash := strings.ToLower(f[0])
	n, ok := fingerprintLen[hash]
	if !ok {
		return Fingerprint{}, fmt.Errorf("hash function %q is not one of sha-256, sha-384, sha-512, sha-224, sha-1, md5", f[0])
	}
	parts := strings.Split(f[1], ":")
	if len(parts) != n {
		if len(parts) == 1 && len(f[1]) > 2 && allHex(f[1]) {
			if len(f[1]) == 2*n {
				pairs := make([]string, n)
				for i := range pairs {
					pairs[i] = f[1][2*i : 2*i+2]
				}
				return Fingerprint{}, fmt.Errorf("the %s digest is written without colons: write its %d bytes as hex pairs separated by colons (RFC 8122 §5): %s %s",
					f[0], n, f[0], strings.ToUpper(strings.Join(pairs, ":")))
			}
			return Fingerprint{}, fmt.Errorf("the %s digest is written without colons, and its %d hex digits are not the %d of %d bytes: write the certificate's %s digest as %d hex pairs separated by colons (RFC 8122 §5)",
				f[0], len(f[1]), 2*n, n, f[0], n)
		}
		return Fingerprint{}, fmt.Errorf("%s digest has %d colon-separated bytes, want %d (RFC 8122 §5)", f[0], len(parts), n)
	}
	digest := make([]byte, n)
	for i, b := range parts {
		if len(b) != 2 || !isHex(b[0]) || !isHex(b[1]) {
			return Fingerprint{}, fmt.Errorf("%q is not a hex byte", b)
		}
		digest[i] = unhex(b[0])<<4 | unhex(b[1])
	}
	return Fingerprint{Hash: hash, Digest: digest}, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	default:
		return c - 'a' + 10
	}
}

// AnswerParams is the answerer's side of the answer.
type AnswerParams struct {
	ICEUfrag, ICEPwd string
	Fingerprint      Fingerprint    // of our DTLS certificate (sha-256)
	Setup            string         // "active" (we are the DTLS client) or "passive" (server)
	Candidate        netip.AddrPort // the one host candidate advertised (the ingress)
	// TCPCandidate, if valid, is the ingress's ICE-TCP address (RFC
	// 6544): the answer adds a passive TCP host candidate there, at a lower
	// priority than the UDP one, for clients whose network drops UDP.
	TCPCandidate      netip.AddrPort
	AudioSSRC         uint32 // the SSRC of the audio we send
	CNAME             string // RTCP CNAME (RFC 7022)
	StreamID, TrackID string // a=msid (RFC 8830)
	SCTPPort          int    // ours, 5000
	MaxMessageSize    int    // ours
	Ptime             int    // ms; 0: no a=ptime line (branch ptime may set 10)
	SCTPInit          []byte // our a=sctp-init payload when answering SNAP; nil: none
}

// opusFmtp is the a=fmtp of the answer's Opus (RFC 7587 §6.1), the
// receiver's wishes for what the client sends: frames of 10 ms or longer,
// and in-band FEC, with which a lost packet's speech is recovered from the
// next one. It does not repeat an offer's stereo=1 (Firefox sends it):
// stereo=1 would ask the client to encode two channels, and a voice edge
// wants one voice at the lowest bitrate; Opus decoders take mono and
// stereo streams alike (RFC 7587), so nothing breaks either way. What the
// edge sends is one voice too, so it announces no sprop-stereo.
const opusFmtp = "minptime=10;useinbandfec=1"

// Answer returns the SDP answer to o: ICE-lite, one BUNDLE group of the audio and data
// sections, every other section rejected (port 0), Opus only at the offer's payload type,
// rtcp-mux, no header extensions and no RTCP feedback, the one candidate and
// a=end-of-candidates. It must be accepted by Chromium, Firefox ESR, GStreamer webrtcbin
// and Pion.
//
// The answer follows JSEP (RFC 8829 §5.3.1): every offered m-section is
// answered, in order, with its mid; a served section repeats the offer's
// profile; the audio's direction is the complement of the offer's
// (sendrecv for sendrecv, recvonly for sendonly, sendonly for recvonly,
// inactive for inactive), and when it sends, the audio carries a=msid and
// a=ssrc cname lines for p's stream. The first served section (the BUNDLE
// tag, RFC 8843 §7.3) carries the candidate, a=end-of-candidates (RFC 8840
// §8.2) and the candidate's address in its m= and c= lines; the others
// port 9 and 0.0.0.0. The ICE credentials and the fingerprint are
// session-level attributes, for every section; a=setup is in every
// section, rejected ones included (Pion reads it only there, webrtcbin
// wants it in each). A rejected section has its mid and a=setup only. The
// data section has a=sctp-init from p only when the offer had one (SNAP
// needs both sides'), and the BUNDLE group is written only when the offer
// had one (RFC 8843 §7.3). No a=msid-semantic: Chromium, Firefox and Pion
// read the media-level a=msid of Unified Plan without it.
//
// Chromium 156, Firefox ESR 153, GStreamer 1.22 webrtcbin and Pion v4
// take these answers (sdp_test.go).
//
// Errors are about p (the answerer's own configuration) or an o that
// ParseOffer did not return: a p.Setup that the offer's a=setup does not
// allow, credentials or a candidate that are not well formed.
func Answer(o *Offer, p AnswerParams) (string, error) {
	if o == nil || o.Audio < 0 || o.Audio >= len(o.Sections) {
		return "", errors.New("peer: answer: the offer has no audio section served; use ParseOffer's result")
	}
	if err := p.check(o); err != nil {
		return "", fmt.Errorf("peer: answer: %w", err)
	}
	audio := &o.Sections[o.Audio]
	dir := answerDirection(audio.Direction)
	sends := dir == sdp.AttrKeySendRecv || dir == sdp.AttrKeySendOnly
	if sends && p.CNAME == "" {
		return "", errors.New("peer: answer: CNAME is empty and the answer sends audio (RFC 7022)")
	}

	addr := p.Candidate.Addr().Unmap()
	addrType := "IP4"
	if addr.Is6() {
		addrType = "IP6"
	}
	sd := &sdp.SessionDescription{
		Version: 0,
		Origin: sdp.Origin{
			Username: "-",
			// RFC 8829 §5.2.1: a random sess-id below 2^63 (here below
			// 2^62, so that it never reads as negative), and a version.
			SessionID:      rand.Uint64N(1 << 62),
			SessionVersion: 1,
			NetworkType:    "IN",
			AddressType:    "IP4",
			UnicastAddress: "0.0.0.0",
		},
		SessionName:      "-",
		TimeDescriptions: []sdp.TimeDescription{{}},
		// The ICE credentials and the fingerprint are the session's, for
		// every section (RFC 8839 §5.4, RFC 8122 §5): webrtcbin (1.22)
		// wants a fingerprint for each m-section, rejected ones included.
		Attributes: []sdp.Attribute{
			sdp.NewPropertyAttribute(sdp.AttrKeyICELite),
			sdp.NewAttribute("ice-ufrag", p.ICEUfrag),
			sdp.NewAttribute("ice-pwd", p.ICEPwd),
			sdp.NewAttribute("fingerprint", p.Fingerprint.String()),
		},
	}

	var group []string
	tagged := false // the first served section, with the candidate, is written
	for i := range o.Sections {
		s := &o.Sections[i]
		served := i == o.Audio || i == o.Data
		if !served {
			sd.MediaDescriptions = append(sd.MediaDescriptions, rejected(s, p.Setup))
			continue
		}
		group = append(group, s.Mid)
		m := &sdp.MediaDescription{
			MediaName: sdp.MediaName{
				Media:  s.Kind,
				Port:   sdp.RangedPort{Value: 9},
				Protos: strings.Split(s.Proto, "/"),
			},
			ConnectionInformation: &sdp.ConnectionInformation{
				NetworkType: "IN", AddressType: "IP4", Address: &sdp.Address{Address: "0.0.0.0"},
			},
		}
		if !tagged {
			m.MediaName.Port.Value = int(p.Candidate.Port())
			m.ConnectionInformation.AddressType = addrType
			m.ConnectionInformation.Address.Address = addr.String()
		}
		if s.Mid != "" {
			m.WithValueAttribute(sdp.AttrKeyMID, s.Mid)
		}
		m.WithValueAttribute(sdp.AttrKeyConnectionSetup, p.Setup)
		if i == o.Audio {
			pt := strconv.Itoa(int(s.OpusPT))
			m.MediaName.Formats = []string{pt}
			m.WithPropertyAttribute(dir)
			if sends {
				m.WithValueAttribute(sdp.AttrKeyMsid, p.StreamID+" "+p.TrackID)
			}
			m.WithPropertyAttribute(sdp.AttrKeyRTCPMux).
				WithValueAttribute("rtpmap", pt+" opus/48000/2").
				WithValueAttribute("fmtp", pt+" "+opusFmtp)
			if p.Ptime > 0 {
				m.WithValueAttribute("ptime", strconv.Itoa(p.Ptime))
			}
			if sends {
				m.WithValueAttribute(sdp.AttrKeySSRC, strconv.FormatUint(uint64(p.AudioSSRC), 10)+" cname:"+p.CNAME)
			}
		} else {
			m.MediaName.Formats = []string{"webrtc-datachannel"}
			m.WithValueAttribute("sctp-port", strconv.Itoa(p.SCTPPort)).
				WithValueAttribute("max-message-size", strconv.Itoa(p.MaxMessageSize))
			if o.SCTPInit != nil && p.SCTPInit != nil {
				m.WithValueAttribute("sctp-init", base64.StdEncoding.EncodeToString(p.SCTPInit))
			}
		}
		if !tagged {
			m.WithValueAttribute(sdp.AttrKeyCandidate, candidate(p.Candidate))
			if p.TCPCandidate.IsValid() {
				m.WithValueAttribute(sdp.AttrKeyCandidate, tcpCandidate(p.TCPCandidate))
			}
			m.WithPropertyAttribute(sdp.AttrKeyEndOfCandidates)
			tagged = true
		}
		sd.MediaDescriptions = append(sd.MediaDescriptions, m)
	}
	if o.Bundle != nil {
		sd.WithValueAttribute(sdp.AttrKeyGroup, "BUNDLE "+strings.Join(group, " "))
	}
	b, err := sd.Marshal()
	if err != nil {
		return "", fmt.Errorf("peer: answer: %w", err)
	}
	return string(b), nil
}

// check checks p against o: what Answer writes must be well formed.
func (p *AnswerParams) check(o *Offer) error {
	if err := checkICECredentials(p.ICEUfrag, p.ICEPwd); err != nil {
		return fmt.Errorf("our credentials: %w", err)
	}
	if n, ok := fingerprintLen[p.Fingerprint.Hash]; !ok || n != len(p.Fingerprint.Digest) {
		return fmt.Errorf("fingerprint %q with a %d-byte digest is not one of RFC 8122's hash functions in lower case with its digest length", p.Fingerprint.Hash, len(p.Fingerprint.Digest))
	}
	switch {
	case p.Setup != "active" && p.Setup != "passive":
		return fmt.Errorf("setup %q: want active or passive", p.Setup)
	case o.Setup == "active" && p.Setup != "passive", o.Setup == "passive" && p.Setup != "active":
		return fmt.Errorf("setup %s answers the offer's a=setup:%s; the roles must differ (RFC 4145 §4)", p.Setup, o.Setup)
	}
	if !p.Candidate.IsValid() || p.Candidate.Port() == 0 || p.Candidate.Addr().Zone() != "" || p.Candidate.Addr().IsUnspecified() {
		return fmt.Errorf("candidate %v: want an address and a port, without a zone", p.Candidate)
	}
	if c := p.TCPCandidate; c.IsValid() && (c.Port() == 0 || c.Addr().Zone() != "" || c.Addr().IsUnspecified()) {
		return fmt.Errorf("TCP candidate %v: want an address and a port, without a zone", c)
	}
	for _, id := range []string{p.StreamID, p.TrackID} {
		if !isMsidID(id) {
			return fmt.Errorf("msid %q %q: each must be 1-64 token characters (RFC 8830 §2)", p.StreamID, p.TrackID)
		}
	}
	if strings.ContainsAny(p.CNAME, " \t\r\n") {
		return fmt.Errorf("CNAME %q has white space", p.CNAME)
	}
	if o.Data >= 0 && (p.SCTPPort < 1 || p.SCTPPort > 65535 || p.MaxMessageSize < 0) {
		return fmt.Errorf("SCTP port %d, max message size %d: want a port number and a size of 0 or more", p.SCTPPort, p.MaxMessageSize)
	}
	if p.Ptime < 0 {
		return fmt.Errorf("ptime %d ms is negative", p.Ptime)
	}
	return nil
}

// isMsidID reports whether s is an msid-id: 1*64token-char (RFC 8830 §2,
// token-char from RFC 8866 §9).
func isMsidID(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if c <= 0x20 || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// answerDirection returns the direction that answers an offered one
// (RFC 3264 §6.1): what the client sends we receive, and the reverse.
func answerDirection(offered string) string {
	switch offered {
	case sdp.AttrKeySendOnly:
		return sdp.AttrKeyRecvOnly
	case sdp.AttrKeyRecvOnly:
		return sdp.AttrKeySendOnly
	case sdp.AttrKeyInactive:
		return sdp.AttrKeyInactive
	default:
		return sdp.AttrKeySendRecv
	}
}

// rejected returns the answer's m-section for an offered section it does
// not serve (RFC 3264 §6, RFC 8829 §5.3.1): port 0, the offer's profile,
// one format (RFC 3264 §6 wants at least one), and its mid. The c= line is
// there for parsers that want one in every section when the session has
// none (Firefox), and a=setup for webrtcbin (1.22), which wants one in
// every section, rejected ones included.
func rejected(s *Section, setup string) *sdp.MediaDescription {
	// An RTP section gets payload type 0, which needs no a=rtpmap
	// (RFC 3551 §6): Pion refuses a dynamic one without its a=rtpmap even
	// in a rejected section. Others keep the offer's first format.
	format := s.format
	if strings.Contains(s.Proto, "RTP/") || format == "" {
		format = "0"
	}
	proto := s.Proto
	if proto == "" {
		proto = "UDP/TLS/RTP/SAVPF"
	}
	m := &sdp.MediaDescription{
		MediaName: sdp.MediaName{
			Media:   s.Kind,
			Port:    sdp.RangedPort{Value: 0},
			Protos:  strings.Split(proto, "/"),
			Formats: []string{format},
		},
		ConnectionInformation: &sdp.ConnectionInformation{
			NetworkType: "IN", AddressType: "IP4", Address: &sdp.Address{Address: "0.0.0.0"},
		},
	}
	if s.Mid != "" {
		m.WithValueAttribute(sdp.AttrKeyMID, s.Mid)
	}
	return m.WithValueAttribute(sdp.AttrKeyConnectionSetup, setup)
}

// hostPriority is the ICE priority of the one host candidate (RFC 8445
// §5.1.2.1): type preference 126 (host), local preference 65535 (the only
// address), component 1.
const hostPriority = 126<<24 | 65535<<8 | (256 - 1)

// tcpHostPriority is the ICE priority of the passive TCP host candidate
// (RFC 6544 §4.2): type preference 126 (host), local preference 2^13 ×
// 4 (direction preference of a passive host candidate) + 8191 (other
// preference: the only address), component 1. Below hostPriority, so
// that a client whose UDP works keeps it: its own TCP candidates are
// lower still (browsers give TCP a lower type preference), and a pair's
// priority follows the lower of its two (RFC 8445 §6.1.2.3).
const tcpHostPriority = 126<<24 | (4<<13+8191)<<8 | (256 - 1)

// tcpCandidate returns the a=candidate value of the passive TCP host
// candidate at ap (RFC 6544 §4.5: the listening port, tcptype passive).
func tcpCandidate(ap netip.AddrPort) string {
	addr := ap.Addr().Unmap()
	h := fnv.New32a()
	h.Write([]byte("tcp host "))
	h.Write([]byte(addr.String()))
	return fmt.Sprintf("%d 1 tcp %d %s %d typ host tcptype passive", h.Sum32(), tcpHostPriority, addr, ap.Port())
}

// candidate returns the a=candidate value of the one host candidate at
// ap (RFC 8839 §5.1), component 1 (RTP and RTCP share it, rtcp-mux). Its
// foundation is a hash of the address, so that two answers for the same
// ingress give the same one (RFC 8445 §5.1.1.3).
func candidate(ap netip.AddrPort) string {
	addr := ap.Addr().Unmap()
	h := fnv.New32a()
	h.Write([]byte("udp host "))
	h.Write([]byte(addr.String()))
	return fmt.Sprintf("%d 1 udp %d %s %d typ host", h.Sum32(), hostPriority, addr, ap.Port())
}
