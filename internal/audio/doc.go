// Package audio is the transceiver's codec side of the PCM bridge formats
// (docs/bridge.md §5.1): it turns a client's Opus RTP stream into 20 ms
// frames of 16-bit PCM at 16 or 24 kHz with losses concealed (Decoder),
// and a backend's PCM, in chunks of any size, into 20 ms Opus packets
// (Encoder). It calls libopus through cgo (gopkg.in/hraban/opus.v2);
// libopus decodes and encodes at 8, 12, 16, 24 and 48 kHz natively, so
// nothing is resampled.
//
// Both types are pure with respect to I/O: they take bytes and return
// frames or packets that alias internal buffers, valid until the next
// call, and allocate nothing in the steady state. Neither is safe for
// concurrent use.
//
// RFCs: Opus RFC 6716 (packet framing §3, loss concealment §4.4, in-band
// FEC §2.1.7), RTP payload for Opus RFC 7587 (48 kHz RTP clock whatever
// the coded rate).
package audio

// FrameDuration is the length of every frame this package produces, in
// milliseconds: the bridge's frame clock.
const FrameDuration = 20

// rtpRate is the RTP clock rate of Opus (RFC 7587 §4.1).
const rtpRate = 48000

// FrameSamples returns the samples in one 20 ms frame at rate Hz.
func FrameSamples(rate int) int { return rate / (1000 / FrameDuration) }

// validRate reports whether libopus codes at rate natively.
func validRate(rate int) bool {
	switch rate {
	case 8000, 12000, 16000, 24000, 48000:
		return true
	}
	return false
}
