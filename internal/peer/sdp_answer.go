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
	// SPED adds a=ice-options (session level) with the offer's SPED
	// options (Offer.SPED): the session takes the DTLS handshake inside
	// the ICE checks (sped.go). Only for an offer that has one.
	SPED bool
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
// Chromium, Firefox ESR, GStreamer webrtcbin and Pion take these answers
// (sdp_interop_test.go; the versions tried are in docs/interop.md).
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
	if p.SPED {
		sd.Attributes = append(sd.Attributes, sdp.NewAttribute("ice-options", strings.Join(o.SPED, " ")))
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
	case p.SPED && len(o.SPED) == 0:
		return errors.New("SPED (a=ice-options:sped or googspedv1) answers only an offer that has it")
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
