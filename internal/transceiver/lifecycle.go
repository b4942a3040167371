package transceiver

import (
	"context"
)

// A session's lifecycle, in one place.
//
// A session ends exactly once, for the first reason anything reports:
// DELETE, the client's DTLS close or ICE failure, the backend's
// session.end or a bridge error, the setup or check timeout, Close. end
// takes the session out of the table at once, under Server.mu, so that it
// no longer counts, a second DELETE gets 404 and Drain sees it leave; the
// slow part (telling the backend and waiting for its close handshake,
// sending the client the goodbye event and waiting for it to leave,
// closing the peer connection) runs on one goroutine per session that
// Server.ends tracks. Nothing waits for it but Close: a DELETE is answered
// in the time it takes to take the session out of the table, not after
// the backend's close handshake or the SCTP acknowledgement of the goodbye
// event that a client may delay on purpose (RFC 9260 §6.2 delayed acks,
// 200 ms in Pion and browsers).
//
// Close ends the sessions still live and waits for every end in flight,
// whoever started it. The removal and the Add happen in one critical
// section, and endOnce makes a concurrent second end wait for the first,
// so a session no longer in the table has always done its Add before
// Close's Wait starts.

// end ends the session with reason once; later calls do nothing. It
// returns at once: the teardown runs on a goroutine tracked by
// Server.ends.
func (sess *session) end(reason string) {
	sess.endOnce.Do(func() {
		s := sess.srv
		sess.ending.Store(true)
		s.mu.Lock()
		delete(s.sessions, sess.id)
		s.ends.Add(1)
		if sess.pendingHeld.CompareAndSwap(true, false) {
			s.releasePending(sess.pendingKey)
		}
		s.mu.Unlock()
		select {
		case s.left <- struct{}{}:
		default:
		}
		go func() {
			defer s.ends.Done()
			sess.teardown(reason)
		}()
	})
}

// waitEmpty waits until no session is live or ctx is done, woken by each
// session's end rather than by polling. It reports whether the table
// emptied.
func (s *Server) waitEmpty(ctx context.Context) bool {
	for s.Sessions() > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-s.left:
		}
	}
	return true
}
