// Package stunpeek reads, without allocating and without copying, the little
// a relay needs from a datagram received on its public socket: which protocol
// it belongs to (RFC 7983 demultiplexing by first byte) and, for a STUN
// Binding request, the USERNAME attribute whose server ufrag carries the
// routing token.
//
// It is not a STUN implementation: it never checks MESSAGE-INTEGRITY or
// FINGERPRINT (the relay has no ICE password; the transceiver that owns the
// session does both) and never builds a message. It checks exactly what it
// must to walk the message safely:
//
//   - the 20-byte header (RFC 8489 §5): the two most significant bits are
//     zero, the message type is a Binding request (0x0001), the magic cookie
//     is 0x2112A442, and the message length is a multiple of 4 and equal to
//     the datagram length minus 20;
//   - the attributes (RFC 8489 §14): type, length, value padded to a multiple
//     of 4 bytes; every length is checked against the datagram before it is
//     used, unknown attributes are skipped, only the first USERNAME counts
//     (§14: "only the first occurrence needs to be processed") and attributes
//     after MESSAGE-INTEGRITY or MESSAGE-INTEGRITY-SHA256 are ignored (§14.5,
//     §14.6), except that their lengths are still checked.
//
// Lifetime: every slice returned aliases the datagram passed in. It is valid
// only until the caller reuses that buffer.
package stunpeek

import "bytes"

// STUN constants from RFC 8489.
const (
	// HeaderLen is the length of the STUN message header.
	HeaderLen = 20
	// MagicCookie is the fixed value in bytes 4-7 of every RFC 5389/8489 message.
	MagicCookie = 0x2112A442
	// TypeBindingRequest is the message type of a Binding request (method 0x001, class request).
	TypeBindingRequest = 0x0001
	// AttrUsername is the USERNAME attribute (RFC 8489 §14.3).
	AttrUsername = 0x0006
	// AttrMessageIntegrity is MESSAGE-INTEGRITY (RFC 8489 §14.5).
	AttrMessageIntegrity = 0x0008
	// AttrMessageIntegritySHA256 is MESSAGE-INTEGRITY-SHA256 (RFC 8489 §14.6).
	AttrMessageIntegritySHA256 = 0x001C
	// MaxUsernameLen is the longest USERNAME value RFC 8489 §14.3 allows, in bytes.
	MaxUsernameLen = 513
	// MinUfragLen and MaxUfragLen bound an ICE ufrag (RFC 8445 §5.3: 4 to 256 characters).
	MinUfragLen = 4
	MaxUfragLen = 256
)

// Kind is the protocol a datagram belongs to, by its first byte (RFC 7983 §7).
type Kind uint8

const (
	// KindOther is anything outside the ranges below, including an empty
	// datagram, ZRTP (16-19) and TURN channel data (64-79). The relay drops it.
	KindOther Kind = iota
	// KindSTUN: first byte 0-3.
	KindSTUN
	// KindDTLS: first byte 20-63.
	KindDTLS
	// KindRTP: first byte 128-191, RTP or RTCP (the relay need not tell them apart).
	KindRTP
)

func (k Kind) String() string {
	switch k {
	case KindSTUN:
		return "stun"
	case KindDTLS:
		return "dtls"
	case KindRTP:
		return "rtp"
	default:
		return "other"
	}
}

// Classify returns the kind of datagram b by its first byte, per RFC 7983.
func Classify(b []byte) Kind {
	if len(b) == 0 {
		return KindOther
	}
	switch c := b[0]; {
	case c <= 3:
		return KindSTUN
	case c >= 20 && c <= 63:
		return KindDTLS
	case c >= 128 && c <= 191:
		return KindRTP
	default:
		return KindOther
	}
}

// Result says why PeekBindingRequest did or did not find a USERNAME.
type Result uint8

const (
	// OK: a well-formed Binding request with a USERNAME.
	OK Result = iota
	// Malformed: not a STUN message, or a STUN message whose header or
	// attribute lengths do not add up.
	Malformed
	// NotBindingRequest: a well-formed STUN header of another method or class
	// (an indication, a response, ...).
	NotBindingRequest
	// NoUsername: a well-formed Binding request without USERNAME (before
	// MESSAGE-INTEGRITY).
	NoUsername
	// UsernameTooLong: the USERNAME value is longer than MaxUsernameLen.
	UsernameTooLong
)

func (r Result) String() string {
	switch r {
	case OK:
		return "ok"
	case Malformed:
		return "malformed"
	case NotBindingRequest:
		return "not_binding_request"
	case NoUsername:
		return "no_username"
	case UsernameTooLong:
		return "username_too_long"
	default:
		return "unknown"
	}
}

// PeekBindingRequest checks that b is a STUN Binding request and returns its
// USERNAME value, which aliases b. On any Result but OK, username is nil.
func PeekBindingRequest(b []byte) (username []byte, r Result) {
	if len(b) < HeaderLen {
		return nil, Malformed
	}
	typ := uint16(b[0])<<8 | uint16(b[1])
	length := int(b[2])<<8 | int(b[3])
	cookie := uint32(b[4])<<24 | uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
	if typ&0xC000 != 0 || cookie != MagicCookie || length&3 != 0 || length != len(b)-HeaderLen {
		return nil, Malformed
	}
	if typ != TypeBindingRequest {
		// Checked after the header so that only well-formed STUN counts here.
		return nil, NotBindingRequest
	}
	var (
		user     []byte
		found    bool
		tooLong  bool
		integrit bool // MESSAGE-INTEGRITY(-SHA256) seen: later attributes are ignored
	)
	for off := HeaderLen; off < len(b); {
		if len(b)-off < 4 {
			return nil, Malformed
		}
		at := uint16(b[off])<<8 | uint16(b[off+1])
		al := int(b[off+2])<<8 | int(b[off+3])
		off += 4
		padded := (al + 3) &^ 3
		if padded > len(b)-off {
			return nil, Malformed
		}
		if !integrit && !found && at == AttrUsername {
			found = true
			if al > MaxUsernameLen {
				tooLong = true
			} else {
				user = b[off : off+al : off+al]
			}
		}
		if at == AttrMessageIntegrity || at == AttrMessageIntegritySHA256 {
			integrit = true
		}
		off += padded
	}
	switch {
	case !found:
		return nil, NoUsername
	case tooLong:
		return nil, UsernameTooLong
	}
	if user == nil {
		user = b[len(b):] // present but empty: non-nil, zero length, still inside b
	}
	return user, OK
}

// BindingRequestUsername is PeekBindingRequest reduced to ok.
func BindingRequestUsername(b []byte) (username []byte, ok bool) {
	u, r := PeekBindingRequest(b)
	return u, r == OK
}

// ServerUfrag returns the server's ufrag from the USERNAME of a Binding
// request sent by an ICE client: the part before the first ':' (RFC 8445
// §7.2.2, "<server ufrag>:<client ufrag>"; a colon cannot occur in a ufrag,
// so any further colons belong to the client part, which is not checked). It
// rejects a USERNAME without a colon or longer than MaxUsernameLen, and a
// server ufrag outside MinUfragLen..MaxUfragLen bytes. The characters are
// not checked here; the token decoder does that. The result aliases username.
func ServerUfrag(username []byte) ([]byte, bool) {
	if len(username) > MaxUsernameLen {
		return nil, false
	}
	i := bytes.IndexByte(username, ':')
	if i < MinUfragLen || i > MaxUfragLen {
		return nil, false // includes i < 0: no colon
	}
	return username[:i:i], true
}
