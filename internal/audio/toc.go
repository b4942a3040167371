package audio

import (
	"errors"
	"fmt"
)

// ErrInvalidOpus reports a byte string that is not a well-formed Opus
// packet (RFC 6716 §3.4, requirements R1–R7).
var ErrInvalidOpus = errors.New("audio: invalid Opus packet")

// maxOpusFrame is the largest Opus frame in bytes (RFC 6716 §3.4, R2).
const maxOpusFrame = 1275

// MaxPacketDuration is the longest Opus packet, 120 ms, in samples at
// 48 kHz (RFC 6716 §3.2.5, R5).
const MaxPacketDuration = 5760

// frameSamples48 is the duration of one frame for each TOC configuration
// number (RFC 6716 §3.1, Table 2), in samples at 48 kHz.
var frameSamples48 = [32]uint16{
	480, 960, 1920, 2880, // SILK NB 10, 20, 40, 60 ms
	480, 960, 1920, 2880, // SILK MB
	480, 960, 1920, 2880, // SILK WB
	480, 960, // Hybrid SWB 10, 20 ms
	480, 960, // Hybrid FB
	120, 240, 480, 960, // CELT NB 2.5, 5, 10, 20 ms
	120, 240, 480, 960, // CELT WB
	120, 240, 480, 960, // CELT SWB
	120, 240, 480, 960, // CELT FB
}

// PacketDuration returns the duration of the Opus packet b in samples at
// 48 kHz (the RTP clock of RFC 7587 §4.1), after checking its framing
// against RFC 6716 §3.4: a TOC byte (R1), frame lengths within 1275 bytes
// (R2) and within the packet (R3, R4, R6, R7), and 1 to 48 frames totalling
// at most 120 ms (R5). It reads the framing only, not the frames' content,
// and does not allocate. Errors wrap ErrInvalidOpus.
func PacketDuration(b []byte) (int, error) {
	if len(b) < 1 {
		return 0, fmt.Errorf("%w: empty (R1)", ErrInvalidOpus)
	}
	per := int(frameSamples48[b[0]>>3])
	rest := b[1:]
	switch b[0] & 3 {
	case 0: // one frame
		if len(rest) > maxOpusFrame {
			return 0, fmt.Errorf("%w: frame of %d bytes (R2)", ErrInvalidOpus, len(rest))
		}
		return per, nil
	case 1: // two frames of equal size
		if len(rest)%2 != 0 || len(rest)/2 > maxOpusFrame {
			return 0, fmt.Errorf("%w: code 1 with %d payload bytes (R3)", ErrInvalidOpus, len(rest))
		}
		return 2 * per, nil
	case 2: // two frames, the first one's length coded
		n1, used, ok := frameLength(rest)
		if !ok || n1 > len(rest)-used || len(rest)-used-n1 > maxOpusFrame {
			return 0, fmt.Errorf("%w: code 2 frame lengths (R4)", ErrInvalidOpus)
		}
		return 2 * per, nil
	}
	// Code 3: a frame count byte, optional padding, optional frame lengths.
	if len(rest) < 1 {
		return 0, fmt.Errorf("%w: code 3 without a frame count (R6)", ErrInvalidOpus)
	}
	fc := rest[0]
	m := int(fc & 0x3f)
	if m == 0 || m*per > MaxPacketDuration {
		return 0, fmt.Errorf("%w: %d frames of %d samples (R5)", ErrInvalidOpus, m, per)
	}
	rest = rest[1:]
	if fc&0x40 != 0 { // padding: lengths in bytes of 255 mean "254 and more"
		pad := 0
		for {
			if len(rest) < 1 {
				return 0, fmt.Errorf("%w: padding length runs past the packet (R6)", ErrInvalidOpus)
			}
			p := int(rest[0])
			rest = rest[1:]
			if p == 255 {
				pad += 254
				continue
			}
			pad += p
			break
		}
		if pad > len(rest) {
			return 0, fmt.Errorf("%w: %d bytes of padding in %d (R6, R7)", ErrInvalidOpus, pad, len(rest))
		}
		rest = rest[:len(rest)-pad]
	}
	if fc&0x80 == 0 { // CBR: equal frames
		if len(rest)%m != 0 || len(rest)/m > maxOpusFrame {
			return 0, fmt.Errorf("%w: code 3 CBR with %d bytes for %d frames (R6)", ErrInvalidOpus, len(rest), m)
		}
		return m * per, nil
	}
	total := 0
	for range m - 1 { // VBR: M-1 coded lengths, the last frame takes the rest
		n, used, ok := frameLength(rest)
		if !ok {
			return 0, fmt.Errorf("%w: code 3 VBR lengths (R7)", ErrInvalidOpus)
		}
		rest = rest[used:]
		total += n
	}
	if total > len(rest) || len(rest)-total > maxOpusFrame {
		return 0, fmt.Errorf("%w: code 3 VBR frames overrun the packet (R7)", ErrInvalidOpus)
	}
	return m * per, nil
}

// frameLength decodes a frame length (RFC 6716 §3.2.1): one byte below
// 252, else two bytes as b0 + 4*b1. It reports the bytes used.
func frameLength(b []byte) (n, used int, ok bool) {
	switch {
	case len(b) < 1:
		return 0, 0, false
	case b[0] < 252:
		return int(b[0]), 1, true
	case len(b) < 2:
		return 0, 0, false
	}
	n = int(b[0]) + 4*int(b[1])
	return n, 2, n <= maxOpusFrame
}
