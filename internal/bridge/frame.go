package bridge

import (
	"encoding/binary"
	"fmt"
)

// Binary frame layout (every binary WebSocket message in both directions):
//
//	offset  size  field
//	0       1     kind      0x01 = audio; other values are reserved
//	1       1     flags     bit 0 (0x01): concealed; other bits reserved (write 0, ignore)
//	2       2     seq       RTP sequence number, big endian (RFC 3550 §5.1)
//	4       4     timestamp RTP timestamp, big endian (RFC 3550 §5.1)
//	8       n     payload   codec payload (one Opus packet for FormatOpus)
const (
	// FrameKindAudio is the kind byte (offset 0) of an audio frame.
	FrameKindAudio byte = 0x01
	// AudioHeaderLen is the size in bytes of the audio frame header that
	// precedes the codec payload.
	AudioHeaderLen = 8
	// FlagConcealed (flags bit 0) marks a PCM frame the transceiver
	// synthesized, in whole or in part, to conceal lost packets (Opus
	// in-band FEC or PLC, RFC 6716 §4.4) rather than decoded from a packet
	// that arrived. Backends may ignore it.
	FlagConcealed byte = 0x01
)

// AudioFrame is one audio packet carried on the bridge.
//
// For FormatOpus, Seq and Timestamp are the RTP sequence number and RTP
// timestamp (48 kHz clock) of the packet as the client sent it, and
// Payload is the Opus packet exactly as it came (RFC 7587), without the
// RTP header.
type AudioFrame struct {
	// Seq is the RTP sequence number (RFC 3550 §5.1). It wraps at 2^16.
	Seq uint16
	// Timestamp is the RTP timestamp in units of the format's clock rate
	// (48000 Hz for FormatOpus). It wraps at 2^32.
	Timestamp uint32
	// Payload is the codec payload. A frame returned by Recv or
	// ParseAudioFrame aliases the buffer it was read from: it is valid
	// only until the next Recv on the same connection (or until the
	// caller reuses the buffer given to ParseAudioFrame). Copy it to keep
	// it.
	Payload []byte
	// Concealed is flags bit 0 (FlagConcealed). The transceiver sets it
	// on PCM frames made by loss concealment; backends leave it false.
	Concealed bool
}

// AppendAudioFrame appends the wire encoding of f (header then payload)
// to dst and returns the extended slice. It does not allocate when dst
// has room for AudioHeaderLen+len(f.Payload) more bytes.
func AppendAudioFrame(dst []byte, f AudioFrame) []byte {
	var flags byte
	if f.Concealed {
		flags = FlagConcealed
	}
	dst = append(dst, FrameKindAudio, flags)
	dst = binary.BigEndian.AppendUint16(dst, f.Seq)
	dst = binary.BigEndian.AppendUint32(dst, f.Timestamp)
	return append(dst, f.Payload...)
}

// ParseAudioFrame decodes a binary bridge frame. The returned frame's
// Payload aliases b (zero copy); it is valid while b is.
//
// It returns an error wrapping ErrProtocol when b is shorter than the
// header, and an error wrapping ErrFrameKind when the kind byte is not
// FrameKindAudio (receivers ignore such frames for forward
// compatibility). Of the flags byte only FlagConcealed is read; other
// bits are ignored. An empty payload is valid.
// It never panics.
func ParseAudioFrame(b []byte) (AudioFrame, error) {
	if len(b) == 0 {
		return AudioFrame{}, fmt.Errorf("%w: empty binary frame", ErrProtocol)
	}
	if b[0] != FrameKindAudio {
		return AudioFrame{}, fmt.Errorf("%w: 0x%02x", ErrFrameKind, b[0])
	}
	if len(b) < AudioHeaderLen {
		return AudioFrame{}, fmt.Errorf("%w: audio frame of %d bytes, header needs %d", ErrProtocol, len(b), AudioHeaderLen)
	}
	return AudioFrame{
		Seq:       binary.BigEndian.Uint16(b[2:4]),
		Timestamp: binary.BigEndian.Uint32(b[4:8]),
		Payload:   b[AudioHeaderLen:],
		Concealed: b[1]&FlagConcealed != 0,
	}, nil
}
