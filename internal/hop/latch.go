package hop

import (
	"bytes"
	"net/netip"

	"github.com/pion/stun/v4"
)

// NAT rebinding (latching).
//
// A client's NAT may give it a new public port mid-call. The client does
// not know; it keeps sending media and consent checks, now from the new
// address. An ICE-lite agent only moves its selected pair when the
// controlling client nominates one, which it has no reason to do, so the
// session would go on sending to the old address. Conn therefore follows
// the client itself: when a STUN Binding request for a registered session
// arrives from a new address and its MESSAGE-INTEGRITY verifies with the
// session's pwd (RFC 8489 §14.5, short-term credentials), Conn reports that
// address, and every later datagram from it, under the address the session
// already knows, and sends the session's datagrams to the new address. Only
// a request that proves knowledge of the pwd moves a session: spoofed media,
// or a Binding request with a sniffed ufrag but no pwd, never does.

type latchSession struct {
	integrity stun.MessageIntegrity
	addr      netip.AddrPort // the client address the session knows; guarded by Conn.lmu
}

// AddSession registers a session's local ufrag and pwd so that Conn can
// follow its client across a NAT rebinding. The first Binding request for
// ufrag fixes the address the session knows the client by.
func (c *Conn) AddSession(ufrag, pwd string) {
	c.lmu.Lock()
	c.sessions[ufrag] = &latchSession{integrity: stun.NewShortTermIntegrity(pwd)}
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
// address w should be reported: an alias set by an earlier rebinding, or
// w. A Binding request may set or move the alias (see above).
func (c *Conn) sessionAddr(w netip.AddrPort, payload []byte) netip.AddrPort {
	c.lmu.RLock()
	a, aliased := c.alias[w]
	nsess := len(c.sessions)
	c.lmu.RUnlock()
	if nsess == 0 || len(payload) < 20 || payload[0] > 3 || !stun.IsMessage(payload) {
		if aliased {
			return a
		}
		return w
	}
	ufrag, ok := requestUfrag(payload)
	if !ok {
		if aliased {
			return a
		}
		return w
	}
	c.lmu.RLock()
	s := c.sessions[ufrag]
	var known netip.AddrPort
	if s != nil {
		known = s.addr
	}
	c.lmu.RUnlock()
	switch {
	case s == nil:
		return w
	case known == w:
		// The known address again: if a latch moved it, the mapping came back.
		c.lmu.Lock()
		if old, ok := c.wire[known]; ok {
			delete(c.alias, old)
			delete(c.wire, known)
		}
		c.lmu.Unlock()
		return known
	case aliased && a == known:
		return known
	case known.IsValid() && known.Addr() != w.Addr():
		return w // another path of a multi-homed client: ICE's business
	}
	// A request that fixes or moves the session's address must prove it
	// knows the session's pwd.
	m := &stun.Message{Raw: bytes.Clone(payload)}
	if m.Decode() != nil || s.integrity.Check(m) != nil {
		return w
	}
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if !s.addr.IsValid() {
		s.addr = w
		return w
	}
	if old, ok := c.wire[known]; ok {
		delete(c.alias, old)
	}
	c.alias[w] = known
	c.wire[known] = w
	c.latched.Add(1)
	return known
}

// requestUfrag returns the server (local) ufrag of a Binding request's
// USERNAME ("<server ufrag>:<client ufrag>", RFC 8445 §7.2.2).
func requestUfrag(b []byte) (string, bool) {
	var m stun.Message
	m.Raw = b
	if m.Decode() != nil || m.Type != stun.BindingRequest {
		return "", false
	}
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
