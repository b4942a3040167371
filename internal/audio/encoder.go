package audio

import (
	"encoding/binary"
	"errors"
	"fmt"

	"gopkg.in/hraban/opus.v2"
)

// ErrOddLength reports PCM input that is not a whole number of 16-bit
// samples.
var ErrOddLength = errors.New("audio: PCM16 input has an odd number of bytes")

// DefaultBitrate is the Opus bitrate an Encoder uses unless told
// otherwise, in bits per second: wideband speech with room for in-band
// FEC.
const DefaultBitrate = 32000

// DefaultComplexity is the libopus encoder complexity (OPUS_SET_COMPLEXITY,
// 0 to 10: how much search the encoder spends per frame) an Encoder uses
// unless told otherwise. libopus's own default is 10; WebRTC encodes
// voice at 9 on desktops and 5 on phones (audio_encoder_opus_config.cc).
// At 5, 20 ms of 24 kHz speech at 32 kbit/s costs about half the CPU of
// 10 and decodes to the same waveform and envelope correlation and SNR
// (docs/benchmarks.md "Opus encoder complexity"; TestEncoderComplexity).
const DefaultComplexity = 5

// encoderLossPercent is the packet loss the encoder plans its in-band FEC
// for (OPUS_SET_PACKET_LOSS_PERC); libopus adds no FEC at 0.
const encoderLossPercent = 10

// Packet is one encoded Opus packet (20 ms, or EncoderConfig.FrameMs).
type Packet struct {
	// Payload aliases the encoder's buffer; valid until the next call.
	Payload []byte
}

// Encoder frames 16-bit mono PCM at one rate into 20 ms frames (or
// EncoderConfig.FrameMs) and encodes each as one Opus packet (RFC 6716) for RTP (RFC 7587): libopus
// application VoIP, in-band FEC on, a fixed target bitrate. Input may
// come in chunks of any whole number of samples; a partial frame waits
// for the next chunk, or for Flush, which pads it with silence.
type Encoder struct {
	enc   *opus.Encoder
	rate  int
	frame int

	pend  []int16 // partial frame
	arena []byte  // the payloads of one call's packets, back to back
	ps    []Packet
	tmp   [maxOpusFrame]byte
}

// EncoderConfig configures an Encoder.
type EncoderConfig struct {
	// Rate is the input sample rate in Hz: 8000, 12000, 16000, 24000 or
	// 48000 (16000 or 24000 for the bridge).
	Rate int
	// Bitrate is the target in bits per second, 500 to 512000; 0 means
	// DefaultBitrate.
	Bitrate int
	// Complexity is libopus's OPUS_SET_COMPLEXITY, 1 (cheapest) to 10
	// (libopus's default); 0 means DefaultComplexity. libopus's own 0 is
	// not offered: it turns off the SILK search that keeps speech clean.
	Complexity int
	// FrameMs is the audio in each packet, ms: 20 (FrameDuration, the
	// default when 0) or 10 (RFC 6716 §2.1.4 frame sizes): 10 ms packets
	// halve the packetization delay, at twice the packet rate.
	FrameMs int
}

// NewEncoder returns an encoder for mono PCM at rate Hz (16000 or 24000
// for the bridge) at bitrate bits per second (0: DefaultBitrate; libopus
// accepts 500 to 512000), at DefaultComplexity.
func NewEncoder(rate, bitrate int) (*Encoder, error) {
	return NewEncoderConfig(EncoderConfig{Rate: rate, Bitrate: bitrate})
}

// NewEncoderConfig returns an encoder configured by c; an error names the
// field out of range.
func NewEncoderConfig(c EncoderConfig) (*Encoder, error) {
	rate, bitrate, complexity := c.Rate, c.Bitrate, c.Complexity
	if !validRate(rate) {
		return nil, fmt.Errorf("audio: encoder rate %d Hz: want 8000, 12000, 16000, 24000 or 48000", rate)
	}
	if bitrate == 0 {
		bitrate = DefaultBitrate
	}
	if bitrate < 500 || bitrate > 512000 {
		return nil, fmt.Errorf("audio: Opus bitrate %d b/s: want 500 to 512000", bitrate)
	}
	if complexity == 0 {
		complexity = DefaultComplexity
	}
	if complexity < 1 || complexity > 10 {
		return nil, fmt.Errorf("audio: Opus complexity %d: want 1 to 10", complexity)
	}
	frameMs := c.FrameMs
	switch frameMs {
	case 0:
		frameMs = FrameDuration
	case 10, FrameDuration:
	default:
		return nil, fmt.Errorf("audio: Opus frame %d ms: want 10 or 20", frameMs)
	}
	enc, err := opus.NewEncoder(rate, 1, opus.AppVoIP)
	if err != nil {
		return nil, fmt.Errorf("audio: opus encoder: %w", err)
	}
	for _, set := range []func() error{
		func() error { return enc.SetBitrate(bitrate) },
		func() error { return enc.SetComplexity(complexity) },
		func() error { return enc.SetInBandFEC(true) },
		func() error { return enc.SetPacketLossPerc(encoderLossPercent) },
	} {
		if err := set(); err != nil {
			return nil, fmt.Errorf("audio: opus encoder: %w", err)
		}
	}
	frame := rate * frameMs / 1000
	return &Encoder{enc: enc, rate: rate, frame: frame, pend: make([]int16, 0, frame)}, nil
}

// FrameSamples returns the samples of input in each packet.
func (e *Encoder) FrameSamples() int { return e.frame }

// Rate returns the encoder's input sample rate in Hz.
func (e *Encoder) Rate() int { return e.rate }

// Pending returns the samples of the partial frame waiting for more input.
func (e *Encoder) Pending() int { return len(e.pend) }

// Write takes pcm, 16-bit signed little-endian mono samples, and returns
// the packets of the frames it completes (possibly none). Packets are
// valid until the next call. An odd byte count is refused whole with
// ErrOddLength.
func (e *Encoder) Write(pcm []byte) ([]Packet, error) {
	if len(pcm)%2 != 0 {
		return nil, ErrOddLength
	}
	e.arena, e.ps = e.arena[:0], e.ps[:0]
	for len(pcm) > 0 {
		n := min(e.frame-len(e.pend), len(pcm)/2)
		for i := range n {
			e.pend = append(e.pend, int16(binary.LittleEndian.Uint16(pcm[2*i:])))
		}
		pcm = pcm[2*n:]
		if len(e.pend) == e.frame {
			if err := e.encode(); err != nil {
				return e.ps, err
			}
		}
	}
	return e.ps, nil
}

// Flush pads the partial frame, if any, with silence and returns its
// packet: the end of a reply.
func (e *Encoder) Flush() ([]Packet, error) {
	e.arena, e.ps = e.arena[:0], e.ps[:0]
	if len(e.pend) == 0 {
		return e.ps, nil
	}
	for len(e.pend) < e.frame {
		e.pend = append(e.pend, 0)
	}
	return e.ps, e.encode()
}

// Reset drops the partial frame and resets the codec state
// (OPUS_RESET_STATE), as after a clear: the next packet does not predict
// from audio that was never sent.
func (e *Encoder) Reset() error {
	e.pend = e.pend[:0]
	return e.enc.Reset()
}

func (e *Encoder) encode() error {
	n, err := e.enc.Encode(e.pend, e.tmp[:])
	e.pend = e.pend[:0]
	if err != nil {
		return fmt.Errorf("audio: opus encode: %w", err)
	}
	start := len(e.arena)
	e.arena = append(e.arena, e.tmp[:n]...)
	e.ps = append(e.ps, Packet{Payload: e.arena[start:len(e.arena):len(e.arena)]})
	return nil
}
