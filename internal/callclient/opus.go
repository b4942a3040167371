package callclient

import (
	"fmt"
	"time"

	"gopkg.in/hraban/opus.v2"
)

// frameDuration is the length of one Opus frame and one RTP packet.
const frameDuration = 20 * time.Millisecond

// maxOpusPacket is the largest Opus packet (RFC 6716 §3.4, R5: 1275 bytes
// per frame); one 20 ms frame always fits.
const maxOpusPacket = 1275

// encodeOpus encodes w as 20 ms Opus frames (application VoIP) at the
// file's own sample rate and channel count if libopus takes that rate (8,
// 12, 16, 24 or 48 kHz); other rates (22,050 or 44,100 Hz, say) are first
// resampled to 48 kHz (resample.go). The RTP clock for Opus is
// 48 kHz whatever the input rate (RFC 7587 §4.1), so every frame advances
// the RTP timestamp by 960. A short last frame is padded with silence.
// maxFrames > 0 stops after that many frames; the file is looped if it is
// shorter.
func encodeOpus(w *WAV, maxFrames int) ([][]byte, error) {
	if !opusRates[w.SampleRate] {
		samples, err := resample(w.Samples, w.Channels, w.SampleRate, 48000)
		if err != nil {
			return nil, err
		}
		w = &WAV{SampleRate: 48000, Channels: w.Channels, Samples: samples}
	}
	enc, err := opus.NewEncoder(w.SampleRate, w.Channels, opus.AppVoIP)
	if err != nil {
		return nil, fmt.Errorf("opus encoder: %w", err)
	}
	frameLen := w.SampleRate / int(time.Second/frameDuration) * w.Channels // samples per frame, all channels
	if len(w.Samples) == 0 {
		return nil, fmt.Errorf("%w: no samples", ErrMalformedWAV)
	}
	n := (len(w.Samples) + frameLen - 1) / frameLen
	if maxFrames > 0 {
		n = maxFrames
	}
	frames := make([][]byte, 0, n)
	pcm := make([]int16, frameLen)
	buf := make([]byte, maxOpusPacket)
	pos := 0
	for range n {
		for i := range pcm {
			if pos >= len(w.Samples) {
				if maxFrames > 0 && i == 0 {
					pos = 0 // loop the file on a frame boundary
				} else {
					pcm[i] = 0
					continue
				}
			}
			pcm[i] = w.Samples[pos]
			pos++
		}
		m, err := enc.Encode(pcm, buf)
		if err != nil {
			return nil, fmt.Errorf("opus encode: %w", err)
		}
		frames = append(frames, append([]byte(nil), buf[:m]...))
	}
	return frames, nil
}
