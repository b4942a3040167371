package peer

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pion/sdp/v3"
)

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
	// SPED lists the ICE options of SPED (spedOptions: "sped",
	// "googspedv1", "goog-sped-v1") that the first bundled section's
	// a=ice-options (its own, else the session's; RFC 8839 §5.6) has, in
	// that order: the client can carry its DTLS handshake in its ICE checks
	// (sped.go). Nil: none.
	SPED []string
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
		if n == 0 {
			opts := strings.Fields(sessionOrMedia(&sd, m, "ice-options"))
			for _, so := range spedOptions {
				if slices.Contains(opts, so) {
					o.SPED = append(o.SPED, so)
				}
			}
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
