package transceiver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/sdpfrag"
)

// ICE restart and trickle over PATCH (RFC 9725 §4.3, docs/signaling.md).
//
// A PATCH carries an SDP fragment (RFC 8840). When its ice-ufrag and
// ice-pwd differ from the client's current ones it is an ICE restart (RFC
// 8445 §9): the session gets a fresh routing token as its ufrag and a fresh
// pwd, the client's new credentials are applied to its last offer and
// answered, and the answer's fragment (the new credentials and the one
// candidate) goes back. The old ufrag's state is purged: the peer endpoint
// forgets it, so checks that still carry it get no
// answer (peer_dropped_total{reason="stun_unknown_ufrag"}). DTLS, SRTP and SCTP keep running over the new ICE session.
// Otherwise it only trickles candidates, which an ICE-lite agent has no use
// for (it learns the client's address from its checks): 204.
//
// The ETag names the ICE session: the session id and its generation, 1 for
// the offer's, +1 per restart: "<id>/<generation>".

// Errors returned by Restart.
var (
	// ErrNoSession: no live session has that id.
	ErrNoSession = errors.New("transceiver: no such session")
	// ErrETagMismatch: If-Match names another ICE session than the current
	// one (HTTP 412).
	ErrETagMismatch = errors.New("transceiver: If-Match does not match the session's current ICE session")
	// ErrBadFragment wraps a fragment that does not parse (HTTP 400).
	ErrBadFragment = errors.New("transceiver: bad SDP fragment")
	// ErrRestartTooSoon: the session restarted ICE less than
	// MinRestartInterval ago (HTTP 429).
	ErrRestartTooSoon = errors.New("transceiver: ICE restarted less than a second ago")
)

// MinRestartInterval is the least time between two ICE restarts of one
// session: each mints a token and a new ICE session, and a client
// needs one per network change, not a stream of them.
const MinRestartInterval = time.Second

// lastRestart is what a repeated restart request gets back: a client
// whose 200 was lost (likely on the network change that made it restart)
// sends the same fragment again, with the ETag it had before.
type lastRestart struct {
	ufrag, pwd string    // the client's credentials it moved to
	fromTag    string    // the ETag before the restart
	answer     string    // the answer fragment sent
	at         time.Time // when it completed
}

// etag returns the entity tag of a session's ICE session of generation gen.
func etag(id string, gen int) string { return `"` + id + "/" + strconv.Itoa(gen) + `"` }

// matchETag reports whether an If-Match value (RFC 9110 §13.1.1: "*" or a
// comma-separated list of entity tags, weak ones never matching) matches
// the current tag.
func matchETag(ifMatch, current string) bool {
	for t := range strings.SplitSeq(ifMatch, ",") {
		if t = strings.TrimSpace(t); t == "*" || t == current {
			return true
		}
	}
	return false
}

// Restart applies the SDP fragment frag to session id, whose current ICE
// session ifMatch must name ("*" for any). For an ICE restart it returns
// the answer fragment and the new ETag, with restarted true; for a trickle
// fragment it returns the unchanged ETag and restarted false. The same
// restart sent again (same credentials, the ETag from before or after it)
// gets the same answer: PATCH is idempotent. Errors wrap ErrNoSession,
// ErrETagMismatch, ErrBadFragment or ErrRestartTooSoon; any other error
// means the restart failed and the session may not recover (the client
// can restart again or hang up).
func (s *Server) Restart(ctx context.Context, id, ifMatch, frag string) (answer, tag string, restarted bool, err error) {
	f, err := sdpfrag.Parse(frag)
	if err != nil {
		return "", "", false, fmt.Errorf("%w: %w", ErrBadFragment, err)
	}
	s.mu.Lock()
	sess := s.sessions[id]
	s.mu.Unlock()
	if sess == nil {
		return "", "", false, ErrNoSession
	}
	sess.imu.Lock()
	defer sess.imu.Unlock()
	if sess.iceDone {
		return "", "", false, ErrNoSession
	}
	tag = etag(id, sess.iceGen)
	if lr := sess.restarted; lr != nil && f.Ufrag == lr.ufrag && f.Pwd == lr.pwd &&
		(matchETag(ifMatch, tag) || matchETag(ifMatch, lr.fromTag)) {
		return lr.answer, tag, true, nil // a repeat of the last restart
	}
	if !matchETag(ifMatch, tag) {
		return "", "", false, ErrETagMismatch
	}
	if f.Ufrag == "" || (f.Ufrag == sess.offer.ICEUfrag && f.Pwd == sess.offer.ICEPwd) {
		return "", tag, false, nil
	}
	if lr := sess.restarted; lr != nil && time.Since(lr.at) < MinRestartInterval {
		return "", "", false, ErrRestartTooSoon
	}
	answer, err = sess.restartICE(f)
	if errors.Is(err, peer.ErrClosed) {
		// The session ended while the restart was being answered: as a
		// restart after the end, not a failure.
		return "", "", false, ErrNoSession
	}
	if err != nil {
		s.metrics.iceRestarts.WithLabelValues("failed").Inc()
		sess.log.Warn("ICE restart failed", "err", err)
		return "", "", false, err
	}
	s.metrics.iceRestarts.WithLabelValues("ok").Inc()
	sess.restarted = &lastRestart{ufrag: f.Ufrag, pwd: f.Pwd, fromTag: tag, answer: answer, at: time.Now()}
	return answer, etag(id, sess.iceGen), true, nil
}

// restartICE runs an ICE restart with the client's new credentials in f,
// applied to its last offer. The caller holds sess.imu.
func (sess *session) restartICE(f sdpfrag.Fragment) (string, error) {
	s := sess.srv
	offer := f.ApplyTo(sess.lastOffer)
	o, err := peer.ParseOffer(offer)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadFragment, err)
	}
	ufrag, pwd, err := s.newCredentials()
	if err != nil {
		return "", err
	}
	answer, err := sess.answer(o, ufrag, pwd)
	if err != nil {
		return "", err
	}
	out, err := sdpfrag.FromSDP(answer)
	if err != nil {
		return "", err
	}
	if err := sess.peer.Restart(ufrag, pwd, o.ICEUfrag); err != nil {
		return "", err
	}
	old := sess.ufrag
	sess.ufrag, sess.offer, sess.lastOffer = ufrag, o, offer
	sess.iceGen++
	sess.log.Info("ICE restarted", "ufrag", ufrag, "old_ufrag", old, "generation", sess.iceGen)
	return out.String(), nil
}
