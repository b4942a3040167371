package transceiver

import (
	"sync"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/peer"
)

// Call setup in production metrics.
//
// switchboard_transceiver_setup_phase_seconds{phase} times each phase from
// the end of the one before: check (the answer left → the first
// authenticated check: the client applying the answer, and one round
// trip), dtls (→ the DTLS handshake done, which starts on that check) and
// first_audio (→ the client's first audio handed to the backend).
// switchboard_transceiver_setup_seconds{phase} keeps the times from the
// offer's arrival.
//
// A session whose setup fails is counted in
// switchboard_transceiver_setup_failures_total{phase,reason} by where it
// stopped (peer.Session.SetupPhase) and logged, at most setupLogBurst lines
// at once and setupLogRate a second after that, so that a firewall (no
// check) can be told from a lossy path (DTLS incomplete) without a flood of
// lines when many calls fail at once:
//
//	phase  reason    where it stopped
//	ice    no_check  no authenticated check within the check timeout
//	ice    failed    checks stopped (consent lost) before it connected
//	dtls   no_dtls   checks, but no DTLS from the client by the setup timeout
//	dtls   timeout   DTLS from the client, handshake incomplete at the setup timeout
//	dtls   failed    the handshake failed (a certificate that matches no fingerprint, an alert)
//	sctp   timeout   connected (audio flows) but the data channels' SCTP
//	                 association not up at the setup timeout; the session goes on

// Values of the phase label of setup_phase_seconds.
const (
	phaseCheck = "check" // answer → first authenticated check
	// phaseDTLS ("dtls", metrics.go): first check → DTLS done;
	// phaseFirstAudio ("first_audio"): DTLS done → first audio at the
	// backend.
)

// Values of the phase and reason labels of setup_failures_total.
const (
	failPhaseSCTP = "sctp"
	failNoCheck   = "no_check"
	failNoDTLS    = "no_dtls"
	failTimeout   = "timeout"
	failFailed    = "failed"
	setupLogBurst = 10
	setupLogRate  = 1 // lines a second, refilled continuously
)

// setupFailureLabels are every (phase, reason) series of
// setup_failures_total, created at start-up.
var setupFailureLabels = [...][2]string{
	{phaseICE, failNoCheck}, {phaseICE, failFailed}, {phaseDTLS, failNoDTLS}, {phaseDTLS, failTimeout},
	{phaseDTLS, failFailed}, {failPhaseSCTP, failTimeout},
}

// setupLog is the token bucket of setup-failure log lines; its zero value
// is ready (full).
type setupLog struct {
	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed uint64 // lines dropped since the last one logged
}

// allow takes a token and returns how many lines were dropped since the
// last one allowed.
func (l *setupLog) allow(now time.Time) (ok bool, suppressed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last.IsZero() {
		l.tokens = setupLogBurst
	} else {
		l.tokens = min(setupLogBurst, l.tokens+now.Sub(l.last).Seconds()*setupLogRate)
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		return false, 0
	}
	l.tokens--
	n := l.suppressed
	l.suppressed = 0
	return true, n
}

// peerSession returns sess.peer once newSession has set it, else nil. The
// peer session's callbacks run on its goroutines (the shared read loop, the
// consent sweeper, the handshake's), which nothing orders after that
// assignment but the client's answer, which the race detector cannot see:
// the receive on the closed peerSet is the order.
func (sess *session) peerSession() *peer.Session {
	select {
	case <-sess.peerSet:
		return sess.peer
	default:
		return nil
	}
}

// setupFailed counts a setup failure under phase and reason and logs it
// (rate-limited) with where the setup stopped and its milestones.
func (sess *session) setupFailed(phase, reason string) {
	sess.srv.metrics.setupFailures.WithLabelValues(phase, reason).Inc()
	now := time.Now()
	ok, suppressed := sess.srv.setupLog.allow(now)
	p := sess.peerSession()
	if !ok || p == nil {
		return
	}
	t := p.SetupTimes()
	since := func(at time.Time) any {
		if at.IsZero() {
			return "never"
		}
		return at.Sub(sess.created).Round(time.Millisecond).String()
	}
	sess.log.Warn("session setup failed", "phase", phase, "reason", reason,
		"stopped_at", p.SetupPhase().String(), "client", p.RemoteAddr().String(),
		"age", now.Sub(sess.created).Round(time.Millisecond),
		"answered_after", since(t.Answered), "first_check_after", since(t.Checked),
		"nominated_after", since(t.Nominated), "dtls_after", since(t.DTLS),
		"suppressed_before", suppressed)
}

// setupTimedOut is the setup timer's end (watchSetup): a session not
// connected ends, counted and logged by where it stopped; a connected one
// whose offer has data channels but whose SCTP association is not up is
// counted and logged, and goes on (its audio flows).
func (sess *session) setupTimedOut() {
	if sess.ending.Load() {
		return
	}
	if sess.connected.Load() {
		if sess.wantSCTP && sess.peer.SetupPhase() < peer.SetupSCTP {
			sess.setupFailed(failPhaseSCTP, failTimeout)
		}
		return
	}
	switch sess.peer.SetupPhase() {
	case peer.SetupNoCheck:
		sess.setupFailed(phaseICE, failNoCheck)
	case peer.SetupNoDTLS:
		sess.setupFailed(phaseDTLS, failNoDTLS)
	default:
		sess.setupFailed(phaseDTLS, failTimeout)
	}
	sess.end(bridge.ReasonSetupTimeout)
}

// observeSetupPhase records the phase that ended at end, begun at start
// (setup_phase_seconds), if both happened.
func (m *metrics) observeSetupPhase(phase string, start, end time.Time) {
	if start.IsZero() || end.IsZero() || end.Before(start) {
		return
	}
	m.setupPhase.WithLabelValues(phase).Observe(end.Sub(start).Seconds())
}
