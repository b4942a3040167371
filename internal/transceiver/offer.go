package transceiver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/pion/sdp/v3"
	"github.com/pion/webrtc/v4"
)

// ErrBadOffer is wrapped by every offer validation error; its message says
// what is wrong with the offer.
var ErrBadOffer = errors.New("bad offer")

// offerInfo is what the transceiver takes from a valid offer before Pion
// sees it.
type offerInfo struct {
	// dtlsRole is the DTLS role the answer takes, complementary to the
	// offer's a=setup (RFC 4145 §4, RFC 8842 §5.2): the offerer's active
	// makes us the server (a=setup:passive), its passive the client
	// (a=setup:active). Zero when the offer leaves the choice to the
	// answerer (actpass, or no a=setup): the configured Config.DTLSRole.
	dtlsRole webrtc.DTLSRole
	// session is the session configuration sent beside the offer (a
	// multipart call's "session" part, multipart.go), passed to the
	// backend in session.start; nil when none.
	session json.RawMessage
	// client is the client's address as the pending bounds count it
	// (clientKey); invalid when unknown.
	client netip.Prefix
}

// fingerprintLen is the digest length in bytes of each hash function an
// a=fingerprint may name (RFC 8122 §5) that DTLS certificate checks
// support.
var fingerprintLen = map[string]int{
	"sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48, "sha-512": 64, "md5": 16,
}

// parseOffer checks that an SDP offer can start a voice session and
// returns what the answer needs from it. The offer must parse (RFC 8866),
// have an audio m-section that is not rejected and offers Opus, and, in
// the m-sections it bundles (RFC 8843; all that are not rejected when it
// has no BUNDLE group):
//
//   - one set of ICE credentials across a BUNDLE group: it is one ICE
//     session, so different a=ice-ufrag/a=ice-pwd across it cannot be
//     answered (RFC 8843 §7.1; checks for the other credentials would be
//     dropped);
//   - at least one well-formed a=fingerprint (RFC 8122 §5: a hash function
//     DTLS can check, then its digest as colon-separated hex bytes of the
//     function's length), or the DTLS handshake could only fail later;
//   - one a=setup value of active, passive or actpass, or none. holdconn
//     (RFC 4145 §4: "do not establish the connection for now") is refused:
//     a voice session that must not connect has nothing to do, and an
//     answer cannot hold a DTLS association that the client will later
//     ask for without a new offer.
//
// Errors wrap ErrBadOffer and say what to fix.
func parseOffer(offer string) (offerInfo, error) {
	if strings.TrimSpace(offer) == "" {
		return offerInfo{}, fmt.Errorf("%w: the body is empty; send an SDP offer", ErrBadOffer)
	}
	var sd sdp.SessionDescription
	if err := sd.UnmarshalString(offer); err != nil {
		return offerInfo{}, fmt.Errorf("%w: SDP does not parse: %v", ErrBadOffer, err)
	}
	var audio, opus bool
	for _, m := range sd.MediaDescriptions {
		if m.MediaName.Media != "audio" || m.MediaName.Port.Value == 0 {
			continue
		}
		audio = true
		for _, a := range m.Attributes {
			if a.Key == "rtpmap" && strings.Contains(strings.ToLower(a.Value), " opus/48000") {
				opus = true
			}
		}
	}
	switch {
	case !audio:
		return offerInfo{}, fmt.Errorf("%w: the offer has no audio m-section; add an audio transceiver (sendrecv)", ErrBadOffer)
	case !opus:
		return offerInfo{}, fmt.Errorf("%w: the offer's audio does not include Opus (opus/48000/2), the one codec served", ErrBadOffer)
	}

	bundled, grouped := bundledSections(&sd)
	var info offerInfo
	var ufrag, pwd, setup string
	for i, m := range bundled {
		mid, _ := m.Attribute("mid")
		where := fmt.Sprintf("m-section %d (mid %q)", i, mid)
		u, p := attr(&sd, m, "ice-ufrag"), attr(&sd, m, "ice-pwd")
		if i == 0 {
			ufrag, pwd = u, p
		} else if grouped && (u != ufrag || p != pwd) {
			return offerInfo{}, fmt.Errorf("%w: %s has ICE credentials %q/… other than the first bundled m-section's %q/…; "+
				"one BUNDLE group is one ICE session and must carry one a=ice-ufrag and a=ice-pwd (RFC 8843 §7.1)", ErrBadOffer, where, u, ufrag)
		}
		if err := checkFingerprints(&sd, m); err != nil {
			return offerInfo{}, fmt.Errorf("%w: %s: %v", ErrBadOffer, where, err)
		}
		s := attr(&sd, m, "setup")
		if i == 0 {
			setup = s
		} else if s != setup {
			return offerInfo{}, fmt.Errorf("%w: %s has a=setup:%s but the first bundled m-section a=setup:%s; one DTLS association needs one role", ErrBadOffer, where, s, setup)
		}
	}
	switch setup {
	case "active":
		info.dtlsRole = webrtc.DTLSRoleServer
	case "passive":
		info.dtlsRole = webrtc.DTLSRoleClient
	case "actpass", "":
	case "holdconn":
		return offerInfo{}, fmt.Errorf("%w: a=setup:holdconn asks not to connect (RFC 4145 §4); offer a=setup:actpass to start a call", ErrBadOffer)
	default:
		return offerInfo{}, fmt.Errorf("%w: a=setup:%s is not active, passive or actpass (RFC 4145 §4)", ErrBadOffer, setup)
	}
	return info, nil
}

// bundledSections returns the m-sections that share the first BUNDLE
// group's transport (RFC 8843) and grouped true, or every m-section that
// is not rejected and grouped false when the offer has no BUNDLE group.
func bundledSections(sd *sdp.SessionDescription) (sections []*sdp.MediaDescription, grouped bool) {
	var group map[string]bool
	for _, a := range sd.Attributes {
		if a.Key != "group" {
			continue
		}
		f := strings.Fields(a.Value)
		if len(f) > 1 && f[0] == "BUNDLE" {
			group = make(map[string]bool, len(f)-1)
			for _, mid := range f[1:] {
				group[mid] = true
			}
			break
		}
	}
	for _, m := range sd.MediaDescriptions {
		mid, _ := m.Attribute("mid")
		_, bundleOnly := m.Attribute("bundle-only")
		switch {
		case group != nil && !group[mid]:
		case group == nil && m.MediaName.Port.Value == 0:
		case group != nil && m.MediaName.Port.Value == 0 && !bundleOnly:
			// Rejected, or removed from the group by the offerer.
		default:
			sections = append(sections, m)
		}
	}
	return sections, group != nil
}

// attr returns the value of a media-level attribute, or of the
// session-level one when the m-section has none (RFC 8866 §5.13).
func attr(sd *sdp.SessionDescription, m *sdp.MediaDescription, key string) string {
	if v, ok := m.Attribute(key); ok {
		return strings.TrimSpace(v)
	}
	for _, a := range sd.Attributes {
		if a.Key == key {
			return strings.TrimSpace(a.Value)
		}
	}
	return ""
}

// checkFingerprints checks the a=fingerprint lines that apply to m (its
// own, else the session's): at least one, each well formed (RFC 8122 §5).
func checkFingerprints(sd *sdp.SessionDescription, m *sdp.MediaDescription) error {
	var fps []string
	for _, a := range m.Attributes {
		if a.Key == "fingerprint" {
			fps = append(fps, a.Value)
		}
	}
	if len(fps) == 0 {
		for _, a := range sd.Attributes {
			if a.Key == "fingerprint" {
				fps = append(fps, a.Value)
			}
		}
	}
	if len(fps) == 0 {
		return errors.New("no a=fingerprint: DTLS-SRTP needs the certificate's fingerprint (RFC 8122 §5, RFC 8842 §5)")
	}
	for _, fp := range fps {
		if err := checkFingerprint(fp); err != nil {
			return fmt.Errorf("a=fingerprint:%s: %w", fp, err)
		}
	}
	return nil
}

// checkFingerprint checks one a=fingerprint value: "<hash-func> XX:XX:…".
func checkFingerprint(v string) error {
	f := strings.Fields(v)
	if len(f) != 2 {
		return errors.New(`want "<hash function> <hex bytes separated by colons>", e.g. "sha-256 AB:CD:…"`)
	}
	n, ok := fingerprintLen[strings.ToLower(f[0])]
	if !ok {
		return fmt.Errorf("hash function %q is not one of sha-256, sha-384, sha-512, sha-224, sha-1, md5", f[0])
	}
	bytes := strings.Split(f[1], ":")
	if len(bytes) != n {
		return fmt.Errorf("%s digest has %d bytes, want %d", f[0], len(bytes), n)
	}
	for _, b := range bytes {
		if len(b) != 2 || !isHex(b[0]) || !isHex(b[1]) {
			return fmt.Errorf("%q is not a hex byte", b)
		}
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
