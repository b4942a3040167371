package vad

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// TypeServerVAD is the only TurnDetection.Type this package implements:
// turn detection from voice activity, as OpenAI's Realtime API names it.
const TypeServerVAD = "server_vad"

// Defaults and limits of TurnDetection, in the units of its fields.
const (
	DefaultThreshold         = 0.5
	DefaultPrefixPaddingMs   = 300
	DefaultSilenceDurationMs = 500
	MaxPrefixPaddingMs       = 2000
	MinSilenceDurationMs     = Frame20ms
	MaxSilenceDurationMs     = 10000
	// DefaultMinInterruptionMs is MinInterruptionMs when left out: the
	// voiced speech over a reply that makes a real interruption of it
	// (with ResumeFalseInterruption on).
	DefaultMinInterruptionMs = 500
	MaxMinInterruptionMs     = 5000
	// MinIdleTimeoutMs and MaxIdleTimeoutMs bound IdleTimeoutMs when it
	// is set (0 is off).
	MinIdleTimeoutMs = 500
	MaxIdleTimeoutMs = 600000
)

// ErrConfig is wrapped by every error TurnDetection.Validate returns.
var ErrConfig = errors.New("vad: invalid turn_detection")

// TurnDetection configures turn detection for one session. Its JSON shape
// is the "turn_detection" object of OpenAI's Realtime API session
// configuration (type "server_vad"), which is what a backend sends in its
// hello or in a later control message:
//
//	{"type":"server_vad","threshold":0.5,"prefix_padding_ms":300,
//	 "silence_duration_ms":500,"interrupt_response":true}
//
// Decoding JSON starts from DefaultTurnDetection, so a field left out
// keeps its default; a JSON null where a *TurnDetection is expected
// leaves the pointer nil, which callers read as "turn detection off", as
// OpenAI does. OpenAI's create_response is ignored. Three members are
// Switchboard's own (docs/bridge.md §4.8): pause_duration_ms (the early
// pause, a tentative end of turn), resume_false_interruption and
// min_interruption_ms (speech over a reply pauses it, and a burst too
// short to be a turn lets it resume).
type TurnDetection struct {
	// Type is TypeServerVAD ("semantic_vad" is refused).
	Type string `json:"type"`
	// Threshold, 0 to 1, is how sure the detector must be before it
	// calls a sound speech: higher needs louder speech over the
	// background and so suits noisier rooms (OpenAI's meaning). Detector
	// maps it onto the engine's aggressiveness and onto the margin a
	// frame must stand above the running noise floor (see docs/vad.md).
	Threshold float64 `json:"threshold"`
	// PrefixPaddingMs, 0 to MaxPrefixPaddingMs, is how much audio
	// before the detected onset belongs to the utterance: speech-started
	// positions include it, and Detector keeps that much audio so the
	// first syllable is not clipped. Rounded up to whole frames of the
	// detector (10 or 20 ms, Detector.FrameMs).
	PrefixPaddingMs int `json:"prefix_padding_ms"`
	// SilenceDurationMs, MinSilenceDurationMs to MaxSilenceDurationMs,
	// is how long the talker must be silent before speech has stopped.
	// Rounded up to whole frames of the detector (10 or 20 ms).
	SilenceDurationMs int `json:"silence_duration_ms"`
	// InterruptResponse says whether a speech start also clears the
	// session's output queue (barge-in). Detector does not act on it:
	// it is carried here for the bridge.
	InterruptResponse bool `json:"interrupt_response"`
	// IdleTimeoutMs is OpenAI's idle_timeout_ms: after this long with
	// neither the user's speech nor the agent's reply audio, the session
	// is told (input_audio_buffer.timeout_triggered). 0 (or null) is
	// off; otherwise MinIdleTimeoutMs to MaxIdleTimeoutMs. Detector does
	// not act on it: it is carried here for the bridge.
	IdleTimeoutMs int `json:"idle_timeout_ms,omitempty"`
	// PauseDurationMs is the early pause: after this much silence in an
	// utterance, well before SilenceDurationMs, Detector reports
	// SpeechPaused (a tentative end of turn), and SpeechResumed if the
	// talker goes on before the silence window ends. 0 is off; otherwise
	// MinSilenceDurationMs up to SilenceDurationMs − MinSilenceDurationMs,
	// rounded up to whole frames (a pause that rounds to the silence
	// window is never reported). Switchboard's own member.
	PauseDurationMs int `json:"pause_duration_ms,omitempty"`
	// ResumeFalseInterruption makes speech over the agent's reply pause
	// the reply instead of clearing it (with InterruptResponse): a burst
	// with less than MinInterruptionMs of voiced speech (a cough, a
	// backchannel) lets it resume where it paused. Detector does not act
	// on it (it counts the voiced speech, VoicedMs). Switchboard's own.
	ResumeFalseInterruption bool `json:"resume_false_interruption,omitempty"`
	// MinInterruptionMs, up to MaxMinInterruptionMs, is the voiced speech
	// (frames that count, Detector.VoicedMs) an utterance over a reply
	// needs to be a real interruption, with ResumeFalseInterruption; 0
	// means DefaultMinInterruptionMs (MinInterruption). Switchboard's own.
	MinInterruptionMs int `json:"min_interruption_ms,omitempty"`
}

// DefaultTurnDetection returns OpenAI's server VAD defaults: threshold
// 0.5, 300 ms prefix padding, 500 ms of silence, interruption on, no idle
// timeout; and Switchboard's: no early pause, interruptions not resumed.
func DefaultTurnDetection() TurnDetection {
	return TurnDetection{
		Type:              TypeServerVAD,
		Threshold:         DefaultThreshold,
		PrefixPaddingMs:   DefaultPrefixPaddingMs,
		SilenceDurationMs: DefaultSilenceDurationMs,
		InterruptResponse: true,
	}
}

// MinInterruption returns MinInterruptionMs, or DefaultMinInterruptionMs
// when it is 0.
func (t TurnDetection) MinInterruption() int {
	if t.MinInterruptionMs == 0 {
		return DefaultMinInterruptionMs
	}
	return t.MinInterruptionMs
}

// UnmarshalJSON decodes b over DefaultTurnDetection, so that fields b
// leaves out keep their defaults. It does not validate: call Validate.
func (t *TurnDetection) UnmarshalJSON(b []byte) error {
	type plain TurnDetection // no UnmarshalJSON: no recursion
	p := plain(DefaultTurnDetection())
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*t = TurnDetection(p)
	return nil
}

// Validate reports the first field out of range, as an error wrapping
// ErrConfig that names the JSON field and its allowed values.
func (t TurnDetection) Validate() error {
	switch {
	case t.Type == "semantic_vad":
		return fmt.Errorf("%w: type %q is not supported; use %q", ErrConfig, t.Type, TypeServerVAD)
	case t.Type != TypeServerVAD:
		return fmt.Errorf("%w: type %q is unknown; use %q", ErrConfig, t.Type, TypeServerVAD)
	case math.IsNaN(t.Threshold) || t.Threshold < 0 || t.Threshold > 1:
		return fmt.Errorf("%w: threshold %v is out of range; it must be from 0 to 1", ErrConfig, t.Threshold)
	case t.PrefixPaddingMs < 0 || t.PrefixPaddingMs > MaxPrefixPaddingMs:
		return fmt.Errorf("%w: prefix_padding_ms %d is out of range; it must be from 0 to %d", ErrConfig, t.PrefixPaddingMs, MaxPrefixPaddingMs)
	case t.SilenceDurationMs < MinSilenceDurationMs || t.SilenceDurationMs > MaxSilenceDurationMs:
		return fmt.Errorf("%w: silence_duration_ms %d is out of range; it must be from %d to %d", ErrConfig, t.SilenceDurationMs, MinSilenceDurationMs, MaxSilenceDurationMs)
	case t.PauseDurationMs != 0 && (t.PauseDurationMs < MinSilenceDurationMs || t.PauseDurationMs > t.SilenceDurationMs-MinSilenceDurationMs):
		return fmt.Errorf("%w: pause_duration_ms %d is out of range; it must be 0 (off) or from %d to silence_duration_ms − %d (%d)", ErrConfig, t.PauseDurationMs, MinSilenceDurationMs, MinSilenceDurationMs, t.SilenceDurationMs-MinSilenceDurationMs)
	case t.MinInterruptionMs < 0 || t.MinInterruptionMs > MaxMinInterruptionMs:
		return fmt.Errorf("%w: min_interruption_ms %d is out of range; it must be from 0 (the default, %d) to %d", ErrConfig, t.MinInterruptionMs, DefaultMinInterruptionMs, MaxMinInterruptionMs)
	case t.IdleTimeoutMs != 0 && (t.IdleTimeoutMs < MinIdleTimeoutMs || t.IdleTimeoutMs > MaxIdleTimeoutMs):
		return fmt.Errorf("%w: idle_timeout_ms %d is out of range; it must be 0 or null (off) or from %d to %d", ErrConfig, t.IdleTimeoutMs, MinIdleTimeoutMs, MaxIdleTimeoutMs)
	}
	return nil
}

// String returns t as JSON, for logs.
func (t TurnDetection) String() string {
	b, _ := json.Marshal(t)
	return string(b)
}
