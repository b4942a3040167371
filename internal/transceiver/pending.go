package transceiver

import (
	"errors"
	"net/netip"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// Offers that never connect.
//
// Each offer dials its backend session at once, in parallel with building
// the answer, so that the first audio frame can go to the backend the
// moment the client connects (the dial is a WebSocket upgrade, hello and
// session.start: a round trip or two to the backend, plus TLS across
// hosts). The price is that an offer whose client never connects holds a
// backend session, which for a real AI backend costs money, until
// something ends it. So:
//
//   - pending sessions (answered, not yet connected: ICE and DTLS) are
//     bounded per client address (Config.MaxPendingPerClient; an IPv4
//     address or an IPv6 /64, taken from the request's peer or, behind a
//     Config.TrustedProxies proxy, from X-Forwarded-For) and in total
//     (Config.MaxPending). An offer over the first bound gets 429, over the
//     second 503, both with Retry-After; each refusal is counted in
//     switchboard_transceiver_offers_refused_total{reason};
//   - a session that has received no authenticated connectivity check (a
//     STUN Binding request whose MESSAGE-INTEGRITY verified with the
//     session's pwd) within Config.CheckTimeout ends with reason no_check,
//     long before the setup timeout; a client that got its answer sends
//     its first check within milliseconds.
//
// Dialing late (on the first authenticated check) would cost a backend
// nothing for offers that never connect, but would put the dial on the
// critical path of every call: the client would connect and speak before
// its backend is there. docs/signaling.md weighs the two.

// Errors for offers refused by the pending bounds.
var (
	// ErrClientPending: the client address has MaxPendingPerClient
	// sessions not yet connected (HTTP 429).
	ErrClientPending = errors.New("transceiver: too many sessions from this address are not yet connected")
	// ErrPending: MaxPending sessions are not yet connected (HTTP 503).
	ErrPending = errors.New("transceiver: too many sessions are not yet connected")
)

// Reasons an offer is refused, the values of offers_refused_total's label.
const (
	refusedPendingClient = "pending_per_client"
	refusedPendingTotal  = "pending_total"
	refusedCapacity      = "capacity"
	refusedDraining      = "draining"
)

// pending counts sessions not yet connected, per client and in total.
// Guarded by Server.mu.
type pending struct {
	byClient map[netip.Prefix]int
	total    int
}

// clientKey is the unit a per-client bound applies to: an IPv4 address,
// or an IPv6 /64 (one subscriber's prefix). The zero Prefix means no
// client address is known (Offer called from Go): only the total counts.
func clientKey(a netip.Addr) netip.Prefix {
	if !a.IsValid() {
		return netip.Prefix{}
	}
	a = a.Unmap()
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.Prefix(64)
	return p
}

// reservePending takes a pending slot for key, or says why not. The
// caller holds s.mu.
func (s *Server) reservePending(key netip.Prefix) error {
	switch {
	case s.pending.total >= s.cfg.MaxPending:
		s.metrics.offersRefused.WithLabelValues(refusedPendingTotal).Inc()
		return ErrPending
	case key.IsValid() && s.pending.byClient[key] >= s.cfg.MaxPendingPerClient:
		s.metrics.offersRefused.WithLabelValues(refusedPendingClient).Inc()
		return ErrClientPending
	}
	s.pending.total++
	if key.IsValid() {
		s.pending.byClient[key]++
	}
	return nil
}

// releasePending gives back a slot reservePending took. The caller holds
// s.mu.
func (s *Server) releasePending(key netip.Prefix) {
	s.pending.total--
	if !key.IsValid() {
		return
	}
	if n := s.pending.byClient[key] - 1; n > 0 {
		s.pending.byClient[key] = n
	} else {
		delete(s.pending.byClient, key)
	}
}

// Pending returns the number of sessions answered but not yet connected.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending.total
}

// leavePending gives back the session's pending slot, once: when it
// connects or ends, whichever is first.
func (sess *session) leavePending() {
	if !sess.pendingHeld.CompareAndSwap(true, false) {
		return
	}
	s := sess.srv
	s.mu.Lock()
	s.releasePending(sess.pendingKey)
	s.mu.Unlock()
}

// watchChecks ends the session if no authenticated check has come within
// Config.CheckTimeout: the peer session has a client address once one
// has verified. The timer holds no goroutine while it waits; its callback
// only starts the session's end, which Close tracks.
func (sess *session) watchChecks() {
	time.AfterFunc(sess.srv.cfg.CheckTimeout, func() {
		if sess.peer.RemoteAddr().IsValid() || sess.ending.Load() {
			return
		}
		sess.setupFailed(phaseICE, failNoCheck) // logged, rate-limited: a firewall fails every call
		sess.end(bridge.ReasonNoCheck)
	})
}
