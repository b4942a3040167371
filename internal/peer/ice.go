package peer

import (
	"bytes"
	"net/netip"

	"github.com/pion/stun/v4"
)

// ICE-lite (RFC 8445 §2.5), answered in the read loop.
//
// A lite agent sends no checks; it answers the client's. A Binding request
// is for the session whose local ufrag is the first part of its USERNAME
// ("<local ufrag>:<remote ufrag>", RFC 8445 §7.2.2), must carry that whole
// USERNAME, a MESSAGE-INTEGRITY that verifies with the session's local pwd
// (short-term credentials, RFC 8489 §9.1) and a FINGERPRINT (RFC 8445 §7.3).
// The answer is a Binding success response with XOR-MAPPED-ADDRESS, signed
// with the same pwd and fingerprinted. A valid check teaches the Endpoint
// the client's address (later DTLS and SRTP from it go to the session,
// nominated or not); the first one, or a nominating one (USE-CANDIDATE,
// the controlling client's choice of pair, RFC 8445 §8.1.1), selects its
// address, the one the session sends to. The first one starts the DTLS
// handshake right after its answer (Session.checked), the first
// nomination reports ICE connected. While the client has sent no DTLS, a
// later fresh check from the selected address re-sends the session's first
// DTLS flight (feed.resendFirst), a bounded number of times. Once the client's media has begun, a check from
// another address only makes it a candidate for a short while
// (candidateTTL), which the client's SRTP from it confirms: a replayed
// check, however old, moves nothing by itself (session.go, "Path
// selection", with what a replayer can still do). A check refreshes the session's consent from the
// selected address only. A check whose transaction ID is among the
// session's last 16 (a retransmission, or a replay from anywhere) is
// answered and changes nothing (Session.replayed).
//
// Anything else that looks like STUN is dropped and counted (DropReason).

// reader is the read loop's scratch state, reused for every datagram.
type reader struct {
	req, res stun.Message
	dec      decryptScratch
}

// maxLearned bounds the client addresses one session learns (a client
// checks from each of its candidates; a browser has a few).
const maxLearned = 8

func (e *Endpoint) handleSTUN(rd *reader, b []byte, addr netip.AddrPort) {
	m := &rd.req
	m.Reset()
	m.Raw = append(m.Raw[:0], b...)
	if err := m.Decode(); err != nil {
		e.drop(DropSTUNMalformed)
		return
	}
	if m.Type != stun.BindingRequest {
		if m.Type.Class == stun.ClassIndication {
			e.drop(DropSTUNIndication)
		} else {
			e.drop(DropSTUNNotRequest)
		}
		return
	}
	user, err := m.Get(stun.AttrUsername)
	if err != nil {
		e.drop(DropSTUNBadUsername)
		return
	}
	i := bytes.IndexByte(user, ':')
	if i <= 0 {
		e.drop(DropSTUNBadUsername)
		return
	}
	e.mu.RLock()
	s := e.byUfrag[string(user[:i])]
	e.mu.RUnlock()
	if s == nil {
		e.drop(DropSTUNUnknownUfrag)
		return
	}
	cred := s.credentials()
	// RFC 8445 §7.3: the whole USERNAME is this generation's
	// "<local>:<remote>" (a restart may have raced the lookup).
	if string(user[:i]) != cred.localUfrag || string(user[i+1:]) != cred.remoteUfrag {
		e.drop(DropSTUNBadUsername)
		return
	}
	if err := stun.Fingerprint.Check(m); err != nil {
		e.drop(DropSTUNBadFingerprint)
		return
	}
	if err := cred.integrity.Check(m); err != nil {
		e.drop(DropSTUNBadIntegrity)
		return
	}
	use := m.Contains(stun.AttrUseCandidate)

	// A retransmission, or a recent check replayed from another address
	// (short-term credentials have no replay protection, RFC 8489 §9.1),
	// is answered as STUN asks but changes nothing: it does not teach its
	// address, move the session or refresh consent. An older replay
	// passes here and is a fresh check to checked: before the client's
	// media begins a nominating one moves the media, after it only makes
	// its address a candidate for candidateTTL. A fresh check is taken before it is
	// answered, so that a client (or a test) that has the answer finds
	// the session already moved.
	start, nominatedFirst, fresh := false, false, false
	if !s.replayed(m.TransactionID) {
		fresh = true
		e.learn(s, addr)
		start, nominatedFirst = s.checked(addr, use, cred)
	}

	// SPED (sped.go): the check's DTLS feeds the handshake, from a fresh
	// check from the selected address only; its response carries the
	// ACK and, maybe, a datagram of the session's handshake, or waits for
	// the handshake's answer to the check's DTLS.
	var sp spedReply
	if s.sped != nil {
		sp = s.sped.onCheck(s, m, addr, cred, fresh && addr == s.remote())
	}
	if sp.hold {
		s.sped.hold(s)
	} else if err := bindingResponse(&rd.res, m.TransactionID, addr, cred, sp); err == nil {
		if _, err := e.conn.WriteToAddrPort(rd.res.Raw, addr); err == nil && sp.data != nil {
			e.spedOut.Add(1)
		}
	}
	switch {
	case start:
		// After the answer: the client's ICE is up once it has it, and
		// a client that drops DTLS before (Firefox) takes the
		// ClientHello that follows.
		s.startHandshake()
	case fresh && addr == s.remote():
		// A later fresh check from the selected address, while the
		// client has sent no DTLS: its first flight (the ClientHello)
		// may have been lost or dropped, so it goes again shortly,
		// unless the client's DTLS comes first, at most maxResends
		// times (feed.resendFirst). A replayed check earns its Binding
		// response only.
		s.dtls.resendFirst(addr)
	}
	if nominatedFirst {
		s.state(StateICEConnected)
	}
}

// learn maps addr to s, for the DTLS and SRTP that follow.
func (e *Endpoint) learn(s *Session, addr netip.AddrPort) {
	e.mu.RLock()
	cur := e.byAddr[addr]
	e.mu.RUnlock()
	if cur == s {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.gone {
		return
	}
	if old := e.byAddr[addr]; old != nil && old != s {
		old.learned = deleteAddr(old.learned, addr)
	}
	if len(s.learned) == maxLearned {
		// Evict the oldest address but the selected one, whose DTLS and
		// SRTP must keep reaching the session.
		sel := s.remote()
		for i, a := range s.learned {
			if a != sel {
				delete(e.byAddr, a)
				s.learned = append(s.learned[:i], s.learned[i+1:]...)
				break
			}
		}
	}
	e.byAddr[addr] = s
	s.learned = append(s.learned, addr)
}

func deleteAddr(l []netip.AddrPort, a netip.AddrPort) []netip.AddrPort {
	for i, x := range l {
		if x == a {
			return append(l[:i], l[i+1:]...)
		}
	}
	return l
}

// register adds s under its local ufrag.
func (e *Endpoint) register(s *Session, ufrag string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.byUfrag[ufrag]; dup {
		return errDuplicateUfrag
	}
	e.byUfrag[ufrag] = s
	return nil
}

// forget removes s and every address it learned.
func (e *Endpoint) forget(s *Session) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s.gone = true
	if e.byUfrag[s.ufrag()] == s {
		delete(e.byUfrag, s.ufrag())
	}
	for _, a := range s.learned {
		if e.byAddr[a] == s {
			delete(e.byAddr, a)
		}
	}
	s.learned = nil
}
