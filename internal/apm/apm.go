// Package apm cleans a session's input audio before turn detection and
// the backend hear it: it cancels the echo of the session's own playout
// and suppresses noise, with WebRTC's audio processing module (echo
// canceller AEC2 with its extended filter and delay-agnostic mode, noise
// suppressor, high-pass filter) from Debian's libwebrtc-audio-processing
// 0.3, called through cgo.
//
// The transceiver holds the exact audio it plays to the client: that is
// the echo canceller's far-end reference. What it does not know is the
// echo path: the network back to the client, the client's jitter buffer
// and playout, the room, the capture and the network again, tens to
// hundreds of milliseconds that change during a call. A Cleaner keeps the
// reference by the time each packet was sent (Played), puts the input on
// the same wall clock from its input-clock positions and arrival times
// (Process), estimates the echo delay by correlating the two signals'
// spectrograms (10 ms frames, eight mel bands, up to MaxDelayMs), and
// hands the module the reference shifted by that delay, so that the
// module's own delay-agnostic search and 128 ms filter need cover only
// what the estimate leaves. After the module, a double-talk detector
// compares the input's spectrum, band by band, with the loudest echo the
// far end can make around that delay: a frame with nothing over it is
// echo left over and is brought down to the noise floor; a frame with
// the user's voice over it passes.
//
// All positions and lengths are in samples of the Cleaner's rate, PCM16
// little-endian mono, in whole 10 ms frames (the module's chunk). A
// Cleaner is not safe for concurrent use: one goroutine calls Played and
// Process (the transceiver's track goroutine). It allocates nothing per
// frame.
//
// Sources: WebRTC's audio_processing.h (the module's contract); ITU-T
// G.168 (echo return loss, ERL, and its enhancement, ERLE, in dB);
// OpenAI's Realtime API session.audio.input.noise_reduction ("near_field"
// for close-talking microphones such as headsets, "far_field" for laptop
// and conference-room microphones).
package apm

import (
	"errors"
	"fmt"
)

// Noise reduction types, as OpenAI's noise_reduction.type names them.
const (
	// NearField is for close-talking microphones (a headset): the
	// module's moderate suppression (NoiseSuppression::kModerate).
	NearField = "near_field"
	// FarField is for microphones away from the talker (a laptop, a
	// conference room), which pick up more of the room: high suppression
	// (NoiseSuppression::kHigh).
	FarField = "far_field"
)

// Errors.
var (
	// ErrConfig: a Config or settings object that cannot be run; the
	// message says what to fix.
	ErrConfig = errors.New("apm: invalid configuration")
	// ErrUnavailable: the binary was built without cgo, so without
	// WebRTC's audio processing.
	ErrUnavailable = errors.New("apm: audio processing unavailable (built without cgo)")
	// ErrFrameSize: PCM that is not whole 10 ms frames at the Cleaner's
	// rate.
	ErrFrameSize = errors.New("apm: frame is not a whole number of 10 ms frames")
	// ErrClosed: the Cleaner was closed.
	ErrClosed = errors.New("apm: closed")
)

// Config is what a Cleaner does.
type Config struct {
	// Rate of the audio in Hz: 8000, 16000, 24000, 32000 or 48000 (the
	// module resamples 24 kHz internally).
	Rate int
	// EchoCancellation cancels the echo of what Played was given.
	EchoCancellation bool
	// NoiseReduction is "" (off), NearField or FarField.
	NoiseReduction string
	// InitialDelayMs is the echo delay assumed until the estimator has
	// measured one (0: DefaultInitialDelayMs).
	InitialDelayMs int
	// GuardFirstReply makes the echo gate act before the echo delay is
	// measured, for the far end's first GuardMs of audio: a speakerphone's
	// first reply then starts no turn, at the cost of up to about 80 ms
	// on interruptions in that time for a client that has no echo (a
	// headset, a browser's own canceller). Off, the gate acts once the
	// echo is found in the input (about 1.5 s of the first reply).
	GuardFirstReply bool
}

// GuardMs is how much far-end audio Config.GuardFirstReply covers.
const GuardMs = 3000

// DefaultInitialDelayMs is the echo delay a Cleaner assumes before it
// has measured one: a client's typical jitter buffer, audio output and
// capture (together about 100–250 ms) over a short network path.
const DefaultInitialDelayMs = 180

// MaxDelayMs is the longest echo delay a Cleaner finds and cancels.
const MaxDelayMs = 1000

// Validate checks c and fills defaults.
func (c *Config) Validate() error {
	switch c.Rate {
	case 8000, 16000, 24000, 32000, 48000:
	default:
		return fmt.Errorf("%w: rate %d Hz; want 8000, 16000, 24000, 32000 or 48000", ErrConfig, c.Rate)
	}
	if _, err := nsLevel(c.NoiseReduction); err != nil {
		return err
	}
	if c.InitialDelayMs == 0 {
		c.InitialDelayMs = DefaultInitialDelayMs
	}
	if c.InitialDelayMs < 0 || c.InitialDelayMs > MaxDelayMs {
		return fmt.Errorf("%w: initial delay %d ms; want 0 to %d", ErrConfig, c.InitialDelayMs, MaxDelayMs)
	}
	return nil
}

// nsLevel maps a noise reduction type to the module's level (-1: off).
func nsLevel(typ string) (int, error) {
	switch typ {
	case "":
		return -1, nil
	case NearField:
		return 1, nil // kModerate
	case FarField:
		return 2, nil // kHigh
	}
	return 0, fmt.Errorf("%w: noise_reduction type %q; want %q or %q (or null for off)", ErrConfig, typ, NearField, FarField)
}

// EchoStats are the echo canceller's own measurements (G.168 terms), in
// dB, and the delay it tracks on top of the Cleaner's estimate.
type EchoStats struct {
	ERL           int  // echo return loss: far end over the echo in the input (long-term average)
	ERLE          int  // echo return loss enhancement: echo in the input over the echo left (long-term average)
	HasEcho       bool // the last frame held echo
	DelayMedianMs int  // the module's delay-agnostic correction, median
	DelayStdMs    int
}
