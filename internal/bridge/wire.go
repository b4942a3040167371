package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Subprotocol is the WebSocket subprotocol (Sec-WebSocket-Protocol) of
// bridge version 1. The transceiver offers it; a backend must select it.
const Subprotocol = "switchboard.bridge.v1"

// Version is the protocol version carried in hello messages.
const Version = 1

// Audio formats, written "<codec>/<clock rate Hz>/<channels>".
const (
	// FormatOpus is Opus passthrough (RFC 7587): each audio frame carries
	// one Opus packet exactly as received over RTP, 48 kHz RTP clock, two
	// channels signalled as in SDP (the stream may be mono).
	FormatOpus = "opus/48000/2"
	// FormatPCM24k is 16-bit signed little-endian PCM, 24 kHz, mono: the
	// transceiver decodes the client's Opus and encodes the backend's
	// audio. Frames carry 20 ms (480 samples, 960 bytes) towards the
	// backend; the backend may send any whole number of samples per frame.
	// Timestamps count samples at 24 kHz.
	FormatPCM24k = "pcm16/24000/1"
	// FormatPCM16k is FormatPCM24k at 16 kHz (320 samples, 640 bytes per
	// 20 ms frame).
	FormatPCM16k = "pcm16/16000/1"
)

// SampleRate returns the sample rate in Hz of a PCM format (24000 for
// FormatPCM24k, 16000 for FormatPCM16k), or 0 for any other format.
func SampleRate(format string) int {
	switch format {
	case FormatPCM24k:
		return 24000
	case FormatPCM16k:
		return 16000
	}
	return 0
}

// WebSocket close codes used by the bridge besides the RFC 6455 ones
// (1000 normal closure after session.end, 1001 going away, 1002 protocol
// error, 1009 message too big).
const (
	// CloseVersion closes a connection whose peer speaks another protocol
	// version (hello "version" is not Version).
	CloseVersion = 4001
	// CloseFormat closes a connection when no audio format is acceptable
	// to both sides.
	CloseFormat = 4002
)

// MaxMessageSize is the largest WebSocket message, in bytes, that a
// bridge endpoint reads. Larger messages close the connection with 1009.
const MaxMessageSize = 1 << 20

// Sentinel errors. Errors returned by this package wrap one or more of
// them; test with errors.Is.
var (
	// ErrVersion reports that the peer does not speak bridge v1: it did
	// not select Subprotocol, or its hello carried another version.
	ErrVersion = errors.New("bridge: unsupported protocol version")
	// ErrFormat reports that no audio format is acceptable to both sides.
	ErrFormat = errors.New("bridge: no common audio format")
	// ErrProtocol reports a malformed or out-of-order message from the
	// peer (or a 1002 close from the peer, which saw one from us).
	ErrProtocol = errors.New("bridge: protocol error")
	// ErrFrameKind is returned by ParseAudioFrame for a binary frame
	// whose kind byte is not FrameKindAudio. Recv ignores such frames.
	ErrFrameKind = errors.New("bridge: unknown binary frame kind")
	// ErrClosed reports that the connection is closed, by either side,
	// gracefully or not.
	ErrClosed = errors.New("bridge: connection closed")
	// ErrInvalidEvent is returned by SendEvent when data is not valid
	// UTF-8 (a JSON string cannot carry it).
	ErrInvalidEvent = errors.New("bridge: event data is not valid UTF-8")
)

// Message type names (the "type" member of text messages).
const (
	typeHello        = "hello"
	typeSessionStart = "session.start"
	typeEvent        = "event"
	typeSessionEnd   = "session.end"
)

// Outgoing messages, one struct per type so that required members are
// always present.
type (
	helloOffer struct {
		Type         string   `json:"type"`
		Version      int      `json:"version"`
		AudioFormats []string `json:"audio_formats"`
	}
	helloAnswer struct {
		Type        string `json:"type"`
		Version     int    `json:"version"`
		AudioFormat string `json:"audio_format"`
		// OutputAudioBufferEvents is false when the backend asks the
		// transceiver not to send the client output_audio_buffer.* events;
		// omitted (true) otherwise.
		OutputAudioBufferEvents *bool `json:"output_audio_buffer_events,omitempty"`
		// InputAudioBufferEvents: the same for input_audio_buffer.*.
		InputAudioBufferEvents *bool `json:"input_audio_buffer_events,omitempty"`
		// TurnDetection is OpenAI's turn_detection object; omitted when
		// the backend wants none.
		TurnDetection json.RawMessage `json:"turn_detection,omitempty"`
	}
	sessionStartMsg struct {
		Type      string            `json:"type"`
		SessionID string            `json:"session_id"`
		Metadata  map[string]string `json:"metadata,omitempty"`
		Session   json.RawMessage   `json:"session,omitempty"`
	}
	eventMsg struct {
		Type string `json:"type"`
		Data string `json:"data"`
	}
	sessionEndMsg struct {
		Type   string `json:"type"`
		Reason string `json:"reason"`
	}
)

// inMsg is the union of all incoming text messages. Unknown members are
// ignored (forward compatibility).
type inMsg struct {
	Type         string            `json:"type"`
	Version      int               `json:"version"`
	AudioFormats []string          `json:"audio_formats"`
	AudioFormat  string            `json:"audio_format"`
	SessionID    string            `json:"session_id"`
	Metadata     map[string]string `json:"metadata"`
	Session      json.RawMessage   `json:"session"`
	Data         *string           `json:"data"`
	Reason       string            `json:"reason"`
	// output_audio_buffer_events in the backend's hello; nil means true.
	OutputAudioBufferEvents *bool `json:"output_audio_buffer_events"`
	// input_audio_buffer_events in the backend's hello; nil means true.
	InputAudioBufferEvents *bool `json:"input_audio_buffer_events"`
	// turn_detection in the backend's hello or an input.turn_detection:
	// nil when absent, "null" when null.
	TurnDetection json.RawMessage `json:"turn_detection"`
	// AudioMs of input.speech_started / input.speech_stopped.
	AudioMs *int64 `json:"audio_ms"`
	// Members of the output.* and error messages (control.go).
	Name     *string `json:"name"`
	ID       *string `json:"id"`
	PlayedMs *int64  `json:"played_ms"`
	Cleared  bool    `json:"cleared"`
	Code     string  `json:"code"`
	Message  string  `json:"message"`
	State    string  `json:"state"`
}

// isObjectOrNull reports whether b is a JSON object or null.
func isObjectOrNull(b json.RawMessage) bool {
	return IsJSONObject(b) || bytes.Equal(bytes.TrimSpace(b), []byte("null"))
}

// parseText decodes a text message. A message that is not a JSON object
// with a non-empty string "type" is a protocol error.
func parseText(b []byte) (inMsg, error) {
	var m inMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return inMsg{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if m.Type == "" {
		return inMsg{}, fmt.Errorf(`%w: message has no "type"`, ErrProtocol)
	}
	return m, nil
}

// Session end reasons, every one the transceiver or a backend gives
// (docs/bridge.md §4.6); the transceiver also tells the client and labels
// its metrics with them. Peers must accept any string: the list will grow.
const (
	ReasonClientHangup = "client_hangup" // the client closed the peer connection or data channel
	ReasonICEFailed    = "ice_failed"    // ICE failed or consent expired
	ReasonSetupTimeout = "setup_timeout" // ICE and DTLS did not connect within the transceiver's setup timeout
	ReasonNoCheck      = "no_check"      // the client sent no authenticated connectivity check within the check timeout
	ReasonBackendGone  = "backend_gone"  // the backend closed the bridge (told the client, not the backend)
	ReasonShutdown     = "shutdown"      // the sender is draining or stopping
	ReasonError        = "error"         // the sender hit an internal error
	ReasonDone         = "done"          // the backend finished the conversation
)
