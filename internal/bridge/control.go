package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
)

// Output control message types (docs/bridge.md §6): the backend steers the
// transceiver's paced playout of its audio, and the transceiver reports
// playout progress.
const (
	// TypeOutputClear (backend → transceiver) drops all queued audio at
	// once; the transceiver answers TypeOutputCleared.
	TypeOutputClear = "output.clear"
	// TypeOutputCleared (transceiver → backend) answers a clear (the
	// backend's, or the client's output_audio_buffer.clear) with
	// PlayedMs: the milliseconds of the current playout run sent to the
	// client before the clear.
	TypeOutputCleared = "output.cleared"
	// TypeOutputMark (both ways) is placed in the playout queue by the
	// backend and sent back with the same Name when the audio queued
	// before it has been played; marks dropped by a clear come back at
	// once with Cleared set.
	TypeOutputMark = "output.mark"
	// TypeOutputStarted (transceiver → backend): playout started from
	// idle.
	TypeOutputStarted = "output.started"
	// TypeOutputStopped (transceiver → backend): the run ended, the queue
	// having stayed empty for 200 ms after its audio (docs/bridge.md
	// §6.2); PlayedMs is the length of the whole run.
	TypeOutputStopped = "output.stopped"
	// TypeOutputResponse (backend → transceiver) tags the audio that
	// follows with the backend's response id (ID), reported to the client
	// as response_id.
	TypeOutputResponse = "output.response"
	// TypeInputSpeechStarted (transceiver → backend): turn detection
	// heard the user start talking; AudioMs is the utterance's start on
	// the session's input clock, prefix padding included
	// (docs/bridge.md §4.8).
	TypeInputSpeechStarted = "input.speech_started"
	// TypeInputSpeechStopped (transceiver → backend): the user stopped
	// talking; AudioMs is the end of the utterance's audio, the silence
	// window included.
	TypeInputSpeechStopped = "input.speech_stopped"
	// TypeInputSpeechPaused (transceiver → backend): the user has been
	// silent for the turn detection's pause_duration_ms: a tentative end
	// of turn. AudioMs is where the pause ran out. Audio the backend
	// sends from now on is held at the edge until TypeInputSpeechStopped
	// (it plays then) or TypeInputSpeechResumed (it is dropped)
	// (docs/bridge.md §4.8).
	TypeInputSpeechPaused = "input.speech_paused"
	// TypeInputSpeechResumed (transceiver → backend): the user talked
	// again after TypeInputSpeechPaused; the tentative turn is withdrawn
	// and the audio held for it dropped. AudioMs is where the speech
	// resumed.
	TypeInputSpeechResumed = "input.speech_resumed"
	// TypeInputTimeoutTriggered (transceiver → backend): neither the
	// user nor the agent's reply has sounded for the turn detection's
	// idle_timeout_ms. AudioMs is the input clock's position then.
	TypeInputTimeoutTriggered = "input.timeout_triggered"
	// TypeOutputPaused (transceiver → backend): speech over the agent's
	// reply paused its playout (turn detection's
	// resume_false_interruption); PlayedMs is what the run had sent.
	TypeOutputPaused = "output.paused"
	// TypeOutputResumed (transceiver → backend): that speech was too
	// short to be a turn (a cough, a backchannel): the reply resumed
	// where it paused. PlayedMs as for TypeOutputPaused.
	TypeOutputResumed = "output.resumed"
	// TypeInputTurnDetection (backend → transceiver) switches turn
	// detection for the rest of the session: TurnDetection is OpenAI's
	// turn_detection object, or JSON null for off.
	TypeInputTurnDetection = "input.turn_detection"
	// TypeError (transceiver → backend) reports backend input the
	// transceiver refused (Code, Message); the session goes on.
	TypeError = "error"
)

// MaxMarkName is the longest output.mark name, in bytes, the transceiver
// accepts.
const MaxMarkName = 256

// MaxResponseID is the longest output.response id, in bytes, the
// transceiver accepts.
const MaxResponseID = 256

// Error codes of TypeError messages (docs/bridge.md §8.1).
const (
	// ErrCodeQueueFull: audio refused because the output queue holds its
	// cap; audio is refused until the queue has room again.
	ErrCodeQueueFull = "output_queue_full"
	// ErrCodeOddLength: a PCM frame's payload has an odd number of bytes
	// (not whole 16-bit samples); the frame is dropped.
	ErrCodeOddLength = "pcm_odd_length"
	// ErrCodeInvalidOpus: an Opus frame's payload is not a well-formed
	// Opus packet (RFC 6716 §3.4); the frame is dropped.
	ErrCodeInvalidOpus = "invalid_opus"
	// ErrCodeMarkName: an output.mark's name is empty or longer than
	// MaxMarkName bytes; the mark is dropped.
	ErrCodeMarkName = "invalid_mark_name"
	// ErrCodeResponseID: an output.response's id is longer than
	// MaxResponseID bytes; the tag is ignored.
	ErrCodeResponseID = "invalid_response_id"
	// ErrCodeUnexpected: a control message the transceiver does not take
	// from a backend (such as output.started); it is ignored.
	ErrCodeUnexpected = "unexpected_message"
	// ErrCodeTurnDetection: a turn_detection object (in the hello or an
	// input.turn_detection) is not one the transceiver can run; turn
	// detection stays as it was (off after a bad hello).
	ErrCodeTurnDetection = "invalid_turn_detection"
)

// Control is one output.* or error message. Which members are meaningful
// depends on Type (see the Type… constants); the others are zero.
type Control struct {
	// Type is one of the Type… constants above.
	Type string
	// Name is the mark name (TypeOutputMark).
	Name string
	// ID is the response id (TypeOutputResponse).
	ID string
	// PlayedMs is milliseconds of audio sent to the client
	// (TypeOutputCleared, TypeOutputStopped, TypeOutputPaused,
	// TypeOutputResumed).
	PlayedMs int64
	// Cleared marks a TypeOutputMark returned because a clear dropped it
	// before its audio was played.
	Cleared bool
	// Code and Message describe a TypeError: Code is one of the ErrCode…
	// constants, Message is for people.
	Code, Message string
	// AudioMs is a position on the session's input clock, ms
	// (TypeInputSpeechStarted, TypeInputSpeechStopped,
	// TypeInputSpeechPaused, TypeInputSpeechResumed,
	// TypeInputTimeoutTriggered).
	AudioMs int64
	// TurnDetection is the turn_detection member of a
	// TypeInputTurnDetection, as sent: a JSON object, or null (turn
	// detection off). The bridge checks only its JSON type.
	TurnDetection json.RawMessage
}

// controlMsg is the wire form of Control; members a type does not use are
// omitted, the ones it requires are always written.
type controlMsg struct {
	Type     string  `json:"type"`
	Name     *string `json:"name,omitempty"`
	ID       *string `json:"id,omitempty"`
	PlayedMs *int64  `json:"played_ms,omitempty"`
	Cleared  bool    `json:"cleared,omitempty"`
	Code     string  `json:"code,omitempty"`
	Message  string  `json:"message,omitempty"`
	AudioMs  *int64  `json:"audio_ms,omitempty"`
	// TurnDetection is written for TypeInputTurnDetection only, null
	// included.
	TurnDetection *json.RawMessage `json:"turn_detection,omitempty"`
}

// SendControl sends c. It returns an error without sending when c.Type is
// not one of the Type… constants. Safe for concurrent use.
func (c *core) SendControl(ctx context.Context, ctl Control) error {
	m, err := wireControl(ctl)
	if err != nil {
		return err
	}
	return c.sendJSON(ctx, m)
}

// wireControl returns the wire form of ctl.
func wireControl(ctl Control) (controlMsg, error) {
	m := controlMsg{Type: ctl.Type}
	switch ctl.Type {
	case TypeOutputClear, TypeOutputStarted:
	case TypeOutputCleared, TypeOutputStopped, TypeOutputPaused, TypeOutputResumed:
		m.PlayedMs = &ctl.PlayedMs
	case TypeOutputMark:
		m.Name, m.Cleared = &ctl.Name, ctl.Cleared
	case TypeOutputResponse:
		m.ID = &ctl.ID
	case TypeError:
		m.Code, m.Message = ctl.Code, ctl.Message
	case TypeInputSpeechStarted, TypeInputSpeechStopped, TypeInputSpeechPaused, TypeInputSpeechResumed, TypeInputTimeoutTriggered:
		m.AudioMs = &ctl.AudioMs
	case TypeInputTurnDetection:
		td := ctl.TurnDetection
		if td == nil {
			td = json.RawMessage("null")
		}
		if !IsJSONObject(td) && !bytes.Equal(bytes.TrimSpace(td), []byte("null")) {
			return m, fmt.Errorf("bridge: SendControl: %s: turn_detection is neither a JSON object nor null", ctl.Type)
		}
		m.TurnDetection = &td
	default:
		return m, fmt.Errorf("bridge: SendControl: unknown type %q", ctl.Type)
	}
	return m, nil
}

// parseControl checks the members a control type requires.
func parseControl(m inMsg) (*Control, error) {
	ctl := &Control{Type: m.Type}
	need := func(p *string, member string) error {
		if p == nil {
			return fmt.Errorf("%w: %s without a string %q", ErrProtocol, m.Type, member)
		}
		return nil
	}
	switch m.Type {
	case TypeOutputMark:
		if err := need(m.Name, "name"); err != nil {
			return nil, err
		}
		ctl.Name, ctl.Cleared = *m.Name, m.Cleared
	case TypeOutputResponse:
		if err := need(m.ID, "id"); err != nil {
			return nil, err
		}
		ctl.ID = *m.ID
	case TypeOutputCleared, TypeOutputStopped, TypeOutputPaused, TypeOutputResumed:
		if m.PlayedMs == nil {
			return nil, fmt.Errorf("%w: %s without an integer \"played_ms\"", ErrProtocol, m.Type)
		}
		ctl.PlayedMs = *m.PlayedMs
	case TypeInputSpeechStarted, TypeInputSpeechStopped, TypeInputSpeechPaused, TypeInputSpeechResumed, TypeInputTimeoutTriggered:
		if m.AudioMs == nil {
			return nil, fmt.Errorf("%w: %s without an integer \"audio_ms\"", ErrProtocol, m.Type)
		}
		ctl.AudioMs = *m.AudioMs
	case TypeInputTurnDetection:
		if !isObjectOrNull(m.TurnDetection) {
			return nil, fmt.Errorf("%w: %s without a \"turn_detection\" object or null", ErrProtocol, m.Type)
		}
		ctl.TurnDetection = m.TurnDetection
	case TypeError:
		ctl.Code, ctl.Message = m.Code, m.Message
	}
	return ctl, nil
}
