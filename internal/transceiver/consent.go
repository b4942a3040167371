package transceiver

import (
	"context"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/peer"
)

// Clients that vanish.
//
// A client that closes its lid or loses its network sends no DTLS close
// and no DELETE: its traffic just stops. As an ICE-lite agent the
// transceiver sends no checks of its own; it sees the client's media,
// RTCP and consent checks (RFC 7675: a browser checks consent every 4 to
// 6 s even when it sends no media). The peer endpoint (internal/peer)
// marks the session disconnected when nothing authenticated has arrived
// for Config.DisconnectedTimeout, and failed when nothing has arrived for
// Config.ConsentTimeout; one sweeper looks at every session once per
// consentTick. On disconnected the backend gets
// {"type":"connection","state":"disconnected"}, so a model can stop
// generating a reply nobody hears; if traffic resumes, "connected"; on
// failed the session ends with ice_failed, which tells the backend too.
// The transition counts are in
// switchboard_transceiver_client_connection_total{state}.

// consentTick is how often the peer endpoint's sweeper, one goroutine
// for every session, looks at how long each session's client has been
// silent: the report comes at most this late, while one sweep of all
// sessions (O(N), under the endpoint's read lock) takes less than a tick.
const consentTick = time.Second

// reportConnection tells the backend when the connected client goes
// silent and when it comes back. It is called from the peer endpoint's
// sweeper or read loop, which must not wait for the bridge: the message is
// sent from a goroutine of its own, ordered after the previous one.
func (sess *session) reportConnection(st peer.State) {
	var state string
	switch st {
	case peer.StateDisconnected:
		sess.silent.Store(true)
		state = bridge.StateDisconnected
		sess.log.Info("client silent", "for", sess.srv.cfg.DisconnectedTimeout)
	case peer.StateICEConnected:
		if !sess.silent.Swap(false) {
			return // the first connection, not a return
		}
		state = bridge.StateConnected
		sess.log.Info("client back")
	default:
		return
	}
	sess.srv.metrics.clientConnection.WithLabelValues(state).Inc()
	done := make(chan struct{})
	prev := sess.connSent.Swap(&done)
	go func() {
		defer close(done)
		if prev != nil {
			<-*prev
		}
		if err := sess.be.SendConnectionState(sess.ctx, state); err != nil && sess.ctx.Err() == nil && !sess.ending.Load() {
			sess.srv.metrics.bridgeErrors.WithLabelValues("send").Inc()
		}
	}()
}

// waitConnectionReports waits for the connection-state messages in flight
// (teardown, before the bridge ends), or ctx.
func (sess *session) waitConnectionReports(ctx context.Context) {
	last := sess.connSent.Load()
	if last == nil {
		return
	}
	select {
	case <-*last:
	case <-ctx.Done():
	}
}
