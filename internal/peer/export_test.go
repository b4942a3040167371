package peer

import "time"

// setCandidateTTL shortens how long s's candidates stay candidates
// (candidateTTL). Call it before the session's first check: the read loop
// takes Endpoint.mu to find the session of every check, after this.
func (s *Session) setCandidateTTL(d time.Duration) {
	s.e.mu.Lock()
	s.candTTL = d
	s.e.mu.Unlock()
}

// setDTLSTimers fixes s's DTLS retransmission timeout (flightInterval; 0
// keeps the computed one) and its first flight's resend delay
// (resendDelay; negative: at once). Call it before the session's first
// check, as setCandidateTTL.
func (s *Session) setDTLSTimers(flight, resend time.Duration) {
	s.e.mu.Lock()
	s.flightFixed = flight
	s.dtls.resendDelay = resend
	s.e.mu.Unlock()
}

// setSPEDWait replaces spedResponseWait for s, a SPED session. Call it
// before the session's first check.
func (s *Session) setSPEDWait(d time.Duration) {
	s.e.mu.Lock()
	s.sped.wait = d
	s.e.mu.Unlock()
}
