package transceiver

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pion/sdp/v3"
)

// ErrBadOffer is wrapped by every offer validation error; its message says
// what is wrong with the offer.
var ErrBadOffer = errors.New("bad offer")

// validateOffer checks that an SDP offer can start a voice session: it
// parses (RFC 8866), has an audio m-section that is not rejected, and that
// section offers Opus. It returns an error wrapping ErrBadOffer.
func validateOffer(offer string) error {
	if strings.TrimSpace(offer) == "" {
		return fmt.Errorf("%w: the body is empty; send an SDP offer", ErrBadOffer)
	}
	var sd sdp.SessionDescription
	if err := sd.UnmarshalString(offer); err != nil {
		return fmt.Errorf("%w: SDP does not parse: %v", ErrBadOffer, err)
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
		return fmt.Errorf("%w: the offer has no audio m-section; add an audio transceiver (sendrecv)", ErrBadOffer)
	case !opus:
		return fmt.Errorf("%w: the offer's audio does not include Opus (opus/48000/2), the one codec served", ErrBadOffer)
	}
	return nil
}
