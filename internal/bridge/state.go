package bridge

import (
	"context"
	"fmt"
)

// The client's connection state (docs/bridge.md §4.7).
//
// The transceiver tells the backend when a connected client goes silent:
// it has sent nothing (no media, no RTCP, no consent check) for the
// transceiver's disconnected timeout, 5 s by default. A client that has
// vanished (closed the lid, lost its network) says nothing; a model that
// is generating a reply can stop spending on it. If the client's traffic
// resumes the transceiver says so; if not, the session ends after the
// consent timeout (30 s of silence by default, RFC 7675 §5.1) with
// session.end reason ice_failed.

// Connection states carried by the connection message.
const (
	// StateDisconnected: the client has sent nothing for the
	// transceiver's disconnected timeout.
	StateDisconnected = "disconnected"
	// StateConnected: the client's traffic resumed after
	// StateDisconnected.
	StateConnected = "connected"
)

const typeConnection = "connection"

type connectionMsg struct {
	Type  string `json:"type"`
	State string `json:"state"`
}

// ConnectionState is the content of a connection message.
type ConnectionState struct {
	// State is StateDisconnected or StateConnected; receivers must accept
	// (and may ignore) other values.
	State string
}

// SendConnectionState tells the backend the client's connection state,
// StateDisconnected or StateConnected. Backends that predate the message
// ignore it (an unknown type, §4). Safe for concurrent use.
func (c *Conn) SendConnectionState(ctx context.Context, state string) error {
	if state == "" {
		return fmt.Errorf("bridge: empty connection state")
	}
	return c.sendJSON(ctx, connectionMsg{Type: typeConnection, State: state})
}
