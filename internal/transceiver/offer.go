package transceiver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/switchboard-rtc/switchboard/internal/peer"
)

// ErrBadOffer is wrapped by every offer validation error; its message says
// what is wrong with the offer.
var ErrBadOffer = errors.New("bad offer")

// offerInfo is what the transceiver takes from a valid offer.
type offerInfo struct {
	// offer is the parsed offer (peer.ParseOffer).
	offer *peer.Offer
	// dtlsRole is the DTLS role the answer takes, complementary to the
	// offer's a=setup (RFC 4145 §4, RFC 8842 §5.2): the offerer's active
	// makes us the server (a=setup:passive), its passive the client
	// (a=setup:active). Zero when the offer leaves the choice to the
	// answerer (actpass, or no a=setup): the configured Config.DTLSRole.
	dtlsRole peer.DTLSRole
	// session is the session configuration sent beside the offer (a
	// multipart call's "session" part, multipart.go), passed to the
	// backend in session.start; nil when none.
	session json.RawMessage
	// client is the client's address as the pending bounds count it
	// (clientKey); invalid when unknown.
	client netip.Prefix
}

// parseOffer checks that an SDP offer can start a voice session and
// returns what the answer needs from it: the rules of peer.ParseOffer (an
// Opus audio section, one set of ICE credentials across a BUNDLE group,
// well-formed fingerprints, an a=setup that is not holdconn, RFC 8843,
// RFC 8122, RFC 4145). Errors wrap ErrBadOffer and say what to fix.
func parseOffer(offer string) (offerInfo, error) {
	if strings.TrimSpace(offer) == "" {
		return offerInfo{}, fmt.Errorf("%w: the body is empty; send an SDP offer", ErrBadOffer)
	}
	o, err := peer.ParseOffer(offer)
	if err != nil {
		return offerInfo{}, fmt.Errorf("%w: %v", ErrBadOffer, err)
	}
	info := offerInfo{offer: o}
	switch o.Setup {
	case "active":
		info.dtlsRole = peer.DTLSServer
	case "passive":
		info.dtlsRole = peer.DTLSClient
	}
	return info, nil
}
