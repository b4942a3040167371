package hop

import (
	"bytes"
	"net/netip"
	"time"

	"github.com/pion/stun/v4"
)

// NAT rebinding (latching).
//
// A client's NAT may give it a new public port mid-call. The client does
// not know; it keeps sending media and consent checks, now from the new
// address. An ICE-lite agent only moves its selected pair when the
// controlling client nominates one, which it has no reason to do, so the
// session would go on sending to the old address. Conn therefore follows
// the client itself: it reports the new address, and every later datagram
// from it, under the address the session already knows, and sends the
// session's datagrams to the new address.
//
// A move needs a STUN Binding request for a registered session, from the
// session's client IP, whose MESSAGE-INTEGRITY verifies with the session's
// pwd (RFC 8489 §14.5, short-term credentials), and one of:
//
//   - MoveNominated: the request carries USE-CANDIDATE (RFC 8445 §7.2.2):
//     the client chose that path;
//   - MoveQuiet: the address the session's media goes to now has sent
//     nothing for ConnConfig.LatchQuiet: its mapping is gone (a NAT
//     rebinding), so the client's consent on it is being lost.
//
// A request that proves the pwd but neither nominates nor finds the current
// address quiet moves nothing: a browser with two interfaces behind one NAT
// keeps checking both, and its media must not flap between them. Spoofed
// media, or a Binding request with a sniffed ufrag but no pwd, never moves
// a session. Every move is counted by reason (ConnStats.Moves) and logged,
// at most once a second per session.

// MoveReason says why Conn moved a session's media to another client
// address. It is the reason label of
// switchboard_transceiver_hop_moves_total.
type MoveReason uint8

const (
	// MoveNominated: an authenticated Binding request with USE-CANDIDATE
	// came from the new address.
	MoveNominated MoveReason = iota
	// MoveQuiet: an authenticated Binding request came from the new address
	// after the current one had been quiet for ConnConfig.LatchQuiet.
	MoveQuiet
	// NumMoveReasons is the number of reasons; ConnStats.Moves has this length.
	NumMoveReasons
)

// String returns the reason's metric label.
func (r MoveReason) String() string {
	switch r {
	case MoveNominated:
		return "nominated"
	case MoveQuiet:
		return "quiet"
	}
	return "unknown"
}

// DefaultLatchQuiet is the default ConnConfig.LatchQuiet: longer than the
// gaps of a live address (20 ms audio, Pion's 2 s keepalive, a browser's
// DTX and RTCP), shorter than a client's consent interval (RFC 7675 §5.1,
// about 5 s), so that a rebound client is followed at its first or second
// consent check.
const DefaultLatchQuiet = 2500 * time.Millisecond

type latchSession struct {
	ufrag     string
	integrity stun.MessageIntegrity
	addr      netip.AddrPort // the client address the session knows; guarded by Conn.lmu
	// Logging, guarded by Conn.lmu: moves not yet logged, and when the
	// last line was written.
	unlogged int
	lastLog  time.Time
}

// AddSession registers a session's local ufrag and pwd so that Conn can
// follow its client across a NAT rebinding. The first Binding request for
// ufrag that verifies fixes the address the session knows the client by.
func (c *Conn) AddSession(ufrag, pwd string) {
	c.lmu.Lock()
	c.sessions[ufrag] = &latchSession{ufrag: ufrag, integrity: stun.NewShortTermIntegrity(pwd)}
	c.lmu.Unlock()
}

// RemoveSession forgets a session and its client's aliases.
func (c *Conn) RemoveSession(ufrag string) {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	s := c.sessions[ufrag]
	if s == nil {
		return
	}
	delete(c.sessions, ufrag)
	if !s.addr.IsValid() {
		return
	}
	delete(c.wire, s.addr)
	for w, a := range c.alias {
		if a == s.addr {
			delete(c.alias, w)
		}
	}
}

// sessionAddr returns the address under which a datagram from wire
// address w should be reported: an alias set by an earlier move, or w. A
// Binding request may set or move the alias (see above).
func (c *Conn) sessionAddr(w netip.AddrPort, payload []byte) netip.AddrPort {
	c.lmu.RLock()
	a, aliased := c.alias[w]
	nsess := len(c.sessions)
	c.lmu.RUnlock()
	report := w
	if aliased {
		report = a
	}
	if nsess == 0 || len(payload) < 20 || payload[0] > 3 || !stun.IsMessage(payload) {
		return report
	}
	m := &stun.Message{Raw: payload}
	if m.Decode() != nil || m.Type != stun.BindingRequest {
		return report
	}
	ufrag, ok := requestUfrag(m)
	if !ok {
		return report
	}
	c.lmu.RLock()
	s := c.sessions[ufrag]
	var known, cur netip.AddrPort
	if s != nil {
		known = s.addr
		cur = known
		if wc, ok := c.wire[known]; ok {
			cur = wc
		}
	}
	c.lmu.RUnlock()
	switch {
	case s == nil:
		return report
	case known.IsValid() && w == cur:
		return known // the current address: nothing moves
	case known.IsValid() && known.Addr() != w.Addr():
		return report // another path of a multi-homed client: ICE's business
	}
	reason := MoveNominated
	if known.IsValid() && !m.Contains(stun.AttrUseCandidate) {
		if !c.quiet(cur) {
			return report // the current address is live: a second path, not a move
		}
		reason = MoveQuiet
	}
	// A request that fixes or moves the session's address must prove it
	// knows the session's pwd. Check clones: Decode above aliases payload,
	// which the caller is about to overwrite.
	v := &stun.Message{Raw: bytes.Clone(payload)}
	if v.Decode() != nil || s.integrity.Check(v) != nil {
		return report
	}
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if c.sessions[ufrag] != s {
		return report // removed meanwhile
	}
	if !s.addr.IsValid() {
		s.addr = w
		return w
	}
	known = s.addr
	if old, ok := c.wire[known]; ok {
		delete(c.alias, old)
		delete(c.wire, known)
	}
	if w != known {
		c.alias[w] = known
		c.wire[known] = w
	}
	c.latched.Add(1)
	c.moves[reason].Add(1)
	c.logMove(s, cur, w, reason)
	return known
}

// quiet reports whether client wire address w has sent nothing for
// LatchQuiet (or has no route left).
func (c *Conn) quiet(w netip.AddrPort) bool {
	c.mu.RLock()
	r := c.routes[w]
	c.mu.RUnlock()
	return r == nil || time.Since(time.Unix(0, r.lastSeen.Load())) >= c.latchQuiet
}

// logMove logs a move of s from one wire address to another, at most once a
// second per session (a client that nominates in turn from two sockets must
// not write a line per check); lines say how many moves they stand for. The
// caller holds lmu.
func (c *Conn) logMove(s *latchSession, from, to netip.AddrPort, reason MoveReason) {
	s.unlogged++
	now := time.Now()
	if now.Sub(s.lastLog) < time.Second {
		return
	}
	c.log.Info("hop: client media moved to another address", "ufrag", s.ufrag, "from", from, "to", to,
		"reason", reason.String(), "moves", s.unlogged)
	s.unlogged = 0
	s.lastLog = now
}

// requestUfrag returns the server (local) ufrag of decoded Binding request
// m's USERNAME ("<server ufrag>:<client ufrag>", RFC 8445 §7.2.2).
func requestUfrag(m *stun.Message) (string, bool) {
	u, err := m.Get(stun.AttrUsername)
	if err != nil {
		return "", false
	}
	i := bytes.IndexByte(u, ':')
	if i <= 0 {
		return "", false
	}
	return string(u[:i]), true
}
