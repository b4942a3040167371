package transceiver

import (
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// Clients that vanish.
//
// A client that closes its lid or loses its network sends no DTLS close
// and no DELETE: its traffic just stops. As an ICE-lite agent the
// transceiver sends no checks of its own; it sees the client's media,
// RTCP and consent checks (RFC 7675: a browser checks consent every 4 to
// 6 s even when it sends no media). Pion's ICE agent marks the connection
// disconnected when nothing has arrived for Config.DisconnectedTimeout,
// and failed when nothing has arrived for Config.ConsentTimeout; it looks
// once per consentTick. On disconnected the backend gets
// {"type":"connection","state":"disconnected"}, so a model can stop
// generating a reply nobody hears; if traffic resumes, "connected"; on
// failed the session ends with ice_failed, which tells the backend too.
// The transition counts are in
// switchboard_transceiver_client_connection_total{state}.

// consentTick is how often each session's ICE agent looks at how long its
// client has been silent: the report comes at most this late.
const consentTick = time.Second

// setICETimeouts applies Config's silence bounds to a session's ICE agent.
func (s *Server) setICETimeouts(se *webrtc.SettingEngine) {
	// Pion counts its failed timeout after the disconnected one.
	se.SetICETimeouts(s.cfg.DisconnectedTimeout, s.cfg.ConsentTimeout-s.cfg.DisconnectedTimeout, consentTick)
}

// reportConnection tells the backend when the connected client goes
// silent and when it comes back.
func (sess *session) reportConnection(st webrtc.ICEConnectionState) {
	var state string
	switch st {
	case webrtc.ICEConnectionStateDisconnected:
		sess.silent.Store(true)
		state = bridge.StateDisconnected
		sess.log.Info("client silent", "for", sess.srv.cfg.DisconnectedTimeout)
	case webrtc.ICEConnectionStateConnected:
		if !sess.silent.Swap(false) {
			return // the first connection, not a return
		}
		state = bridge.StateConnected
		sess.log.Info("client back")
	default:
		return
	}
	sess.srv.metrics.clientConnection.WithLabelValues(state).Inc()
	if err := sess.be.SendConnectionState(sess.ctx, state); err != nil && sess.ctx.Err() == nil && !sess.ending.Load() {
		sess.srv.metrics.bridgeErrors.WithLabelValues("send").Inc()
	}
}
