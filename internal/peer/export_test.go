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
