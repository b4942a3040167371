// Package bridge implements versions 1 and 2 of the Switchboard backend
// bridge between a transceiver and an AI backend (agent): version 1 is
// one WebSocket per session, version 2 (below) carries many sessions over
// one WebSocket with the same messages. The normative specification,
// written for implementers in any language, is docs/bridge.md; this
// comment summarizes it.
//
// In version 1 the transceiver dials the backend URL with the WebSocket subprotocol
// Subprotocol (RFC 6455 §1.9, §4.1, §11.3.4). Then, in order:
//
//	transceiver → backend  {"type":"hello","version":1,"audio_formats":["opus/48000/2","pcm16/24000/1","pcm16/16000/1"]}
//	backend → transceiver  {"type":"hello","version":1,"audio_format":"opus/48000/2"}
//	transceiver → backend  {"type":"session.start","session_id":"…","metadata":{…}}
//
// after which both sides may send, in any order:
//
//   - binary messages: one audio frame each (layout in frame.go and the
//     spec: kind, flags, RTP sequence number, RTP timestamp, payload);
//   - {"type":"event","data":"<data-channel message as a string>"};
//   - output control (Control, SendControl): output.clear, output.mark,
//     output.response from the backend; output.started, output.stopped,
//     output.cleared, output.mark, output.paused, output.resumed and
//     error from the transceiver, which paces the backend's audio;
//   - turn detection: input.turn_detection from the backend;
//     input.speech_started, input.speech_stopped, input.speech_paused,
//     input.speech_resumed and input.timeout_triggered from the
//     transceiver;
//   - {"type":"session.end","reason":"…"}, followed by a WebSocket close
//     with status 1000 (RFC 6455 §7.4.1).
//
// Handshake failures close the WebSocket with CloseVersion (4001) or
// CloseFormat (4002); a malformed message closes it with 1002 (protocol
// error). Text messages with an unknown "type", and binary messages with
// an unknown kind byte, are ignored and counted (see Ignored), so that
// later minor revisions can add messages without breaking v1 peers.
//
// Dial is the transceiver side (Conn); Accept is the backend side
// (ServerConn). Both share one implementation of the session phase.
//
// Version 2 (SubprotocolV2, docs/bridge.md §12) carries many sessions
// over one WebSocket with the same messages: each WebSocket message is a
// batch of records, each
//
//	uvarint session index | kind (RecordBinary, RecordText, RecordClose) | uvarint length | payload
//
// written by one writer per connection that takes everything queued each
// time it writes (group commit, no timer). Pool is its transceiver side
// (it falls back to one v1 WebSocket per session when the backend
// selects v1); Serve is its backend side (both versions), handing each
// session to the caller as the same ServerConn.
package bridge
