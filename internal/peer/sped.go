package peer

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/pion/stun/v4"
	"github.com/switchboard-rtc/switchboard/internal/stunpeek"
)

// SPED: the DTLS handshake carried in the ICE checks
// (draft-hancke-webrtc-sped, ICE option "sped"; libwebrtc's variants
// "googspedv1", from M155, and "goog-sped-v1", M149 to M154, which
// Chromium offers behind its field trial WebRTC-IceHandshakeDtls: Debian's
// Chromium 156 offers "sped googspedv1"). The variants share the wire and
// differ only in when the piggybacking ends; the answer repeats the
// options the offer had.
//
// An offer that lists one in a=ice-options (Offer.SPED) is from
// a client that puts its DTLS datagrams into its Binding requests as they
// come, before its ICE is up: its ClientHello rides in its first check. An
// answer with the option (AnswerParams.SPED) makes the session the DTLS
// server with DTLS 1.3 (SessionConfig.SPED): its first flight (ServerHello
// to Finished) then reaches the client with the Binding response to that
// first check, and a DTLS 1.3 client is done as it takes it, one round
// trip after its first check instead of two. The client's own last
// flight comes in its next check and as a plain datagram.
//
// The wire (libwebrtc p2p/base/connection.cc, p2p/dtls/dtls_utils.cc and
// dtls_stun_piggyback_controller.cc, learned from, not copied):
//
//   - DTLS-IN-STUN (0xC070) holds one DTLS datagram; DTLS-IN-STUN-ACK
//     (0xC071) a list of 4-byte big-endian CRC-32s (IEEE) of DTLS datagrams
//     received, the last 4 at most. Both go in Binding requests and
//     responses, before MESSAGE-INTEGRITY; a message is at most 1168 bytes
//     (maxSPEDMessage), so DTLS datagrams are packed to 900 (spedMTU).
//   - A Binding response that has an ACK attribute, even an empty one,
//     acknowledges the datagram its request carried.
//   - A peer whose messages carry neither attribute does not do SPED (the
//     client then falls back to plain DTLS once its ICE is up); a message
//     with neither, or with an ACK and no DTLS, after the handshake
//     completed ends the piggybacking.
//   - The client sends its handshake datagrams both inside its checks and
//     as plain DTLS (which its ICE layer sends only once it is up), and
//     acknowledges ours whichever way they came.
//
// What the session does:
//
//   - Only an authenticated check's attributes are read, and only those
//     before its MESSAGE-INTEGRITY (what the integrity covers; RFC 8489
//     §14.5). A DTLS datagram feeds the handshake only from a fresh check
//     (not a retransmission or recent replay, Session.replayed) from the
//     selected address, as if it had come plain from there.
//   - The response to a check that carried a DTLS datagram waits, up to
//     spedResponseWait, for the handshake's answer to it, and carries its
//     first datagram; the rest of the flight goes plain at once. Later
//     responses to fresh checks from the selected address carry the
//     flight's datagrams the client has not acknowledged, one each, in
//     turn (the client's checks pace the retransmission), at most
//     maxSPEDData times per session. The handshake's own retransmissions
//     (feed.go) go plain as for any session.
//   - Every response carries the ACK of the client's last DTLS datagrams
//     while the piggybacking lasts.
//
// What a check earns (docs/security.md): a replayed check (a recent
// transaction ID) and a check from any address but the selected one earn
// their Binding response with at most an ACK, never a DTLS datagram, and
// feed nothing to the handshake. A fresh check from the selected address
// earns at most one datagram of the session's own handshake (900 bytes)
// inside its response, maxSPEDData times per session in all, sent to the
// address the check came from, which is the one the session's DTLS goes to
// anyway. A check replayed from the selected address (an older one, past
// the transaction-ID ring) is the client's own check sent again from its
// own address: what it earns goes to the client.

// spedOptions are the a=ice-options tokens of SPED, in the order an
// answer lists them.
var spedOptions = []string{"sped", "googspedv1", "goog-sped-v1"}

// SPED's sizes and bounds.
const (
	// spedMTU is the largest DTLS datagram of a SPED session's handshake,
	// so that one fits in a Binding message.
	spedMTU = 900
	// maxSPEDMessage bounds a Binding message carrying SPED attributes,
	// in bytes after the 20-byte header (libwebrtc's
	// kMaxStunBindingLength: 1200 less an IPv6 and UDP header).
	maxSPEDMessage = 1168
	// maxSPEDAcks is how many received datagrams an ACK names.
	maxSPEDAcks = 4
	// maxSPEDStash bounds the datagrams of one flight kept for
	// responses.
	maxSPEDStash = 8
	// maxSPEDData bounds the responses that carry a DTLS datagram, per
	// session.
	maxSPEDData = 16
	// spedResponseWait is how long the response to the check that ended
	// the ClientHello waits for the handshake's answer before it goes with
	// the ACK alone. The DTLS goroutine writes its ServerHello flight
	// within about a millisecond (tens under -race on a loaded machine),
	// and the response leaves as soon as it has. Waiting costs the
	// client nothing it could use: until the flight comes its DTLS cannot
	// finish, and its ICE, which the response makes writable, has nothing
	// to send (its ClientHello is acknowledged) but its nomination, which
	// nothing waits for. The bound is for a handshake that does not answer
	// (a ClientHello it refuses).
	spedResponseWait = 100 * time.Millisecond
)

// spedState is how far a session's piggybacking has come.
type spedState uint8

const (
	// spedTentative: answered with SPED; no check has shown the client's
	// piggybacking yet.
	spedTentative spedState = iota
	// spedOn: the client's checks carry DTLS-IN-STUN or its ACK.
	spedOn
	// spedOff: a check carried neither before any did: a plain handshake.
	spedOff
	// spedDone: the handshake completed and the client stopped sending
	// DTLS in its checks.
	spedDone
)

// stashed is one datagram of the session's current handshake flight.
type stashed struct {
	b   []byte
	crc uint32
}

// held is a Binding response waiting for the handshake's next datagram.
type held struct {
	txid  [stun.TransactionIDSize]byte
	addr  netip.AddrPort
	cred  *credentials
	timer *time.Timer
}

// sped is a SPED session's piggybacking state. mu guards all of it: the
// read loop, the DTLS goroutine (feed writes) and a held response's timer
// take it.
type sped struct {
	mu     sync.Mutex
	state  spedState
	acks   []uint32  // CRC-32s of the client's last DTLS datagrams, oldest first
	stash  []stashed // the current flight, not yet acknowledged
	next   int       // the stash entry the next response carries
	data   int       // responses that carried a datagram
	heard  bool      // client DTLS came since the session last wrote: its next write starts a flight
	done   bool      // the handshake completed
	used   bool      // a DTLS datagram came inside a check
	wrote  bool      // the session has written handshake datagrams
	held   *held     // a response waiting for the handshake's answer
	closed bool
	wait   time.Duration // spedResponseWait; tests lengthen it (export_test.go)
}

// spedCRC is the checksum SPED's ACK names a datagram by.
func spedCRC(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

// inSTUN returns a check's DTLS-IN-STUN and DTLS-IN-STUN-ACK values
// and whether each is present, from the attributes before its
// MESSAGE-INTEGRITY only.
func inSTUN(m *stun.Message) (data, ack []byte, hasData, hasAck bool) {
	for _, a := range m.Attributes {
		switch a.Type {
		case stun.AttrMessageIntegrity:
			return data, ack, hasData, hasAck
		case stun.AttrDtlsInStun:
			if !hasData {
				data, hasData = a.Value, true
			}
		case stun.AttrDtlsInStunAck:
			if !hasAck {
				ack, hasAck = a.Value, true
			}
		}
	}
	return data, ack, hasData, hasAck
}

// spedReply is what a check's response carries: the ACK (when ack), and
// a DTLS datagram (data, nil for none).
type spedReply struct {
	ack  bool
	acks []uint32
	data []byte
	// hold: the check fed DTLS to the handshake; its response waits for
	// the handshake's answer (sped.hold).
	hold bool
}

// onCheck takes an authenticated check's SPED attributes and says what
// its response carries. selected is true for a fresh check (not in the
// transaction-ID ring) from the selected address, the only kind whose DTLS
// feeds the handshake and whose response may carry a datagram. Read loop.
func (sp *sped) onCheck(s *Session, m *stun.Message, addr netip.AddrPort, cred *credentials, selected bool) spedReply {
	data, ack, hasData, hasAck := inSTUN(m)
	if len(data) > 0 && !isDTLS(data) || len(ack)%4 != 0 {
		s.e.drop(DropSPEDMalformed) // and the attribute is not used below
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	switch sp.state {
	case spedOff, spedDone:
		return spedReply{}
	case spedTentative:
		if !hasData && !hasAck {
			sp.state = spedOff
			sp.stash = nil
			return spedReply{}
		}
		sp.state = spedOn
	}
	if hasAck && len(ack)%4 == 0 {
		sp.prune(ack)
	}
	var r spedReply
	switch {
	case hasData && len(data) > 0 && selected && isDTLS(data):
		sp.used = true
		sp.noteReceived(data)
		// The response waits for the handshake's answer, held before the
		// datagram is queued: a running handshake may answer at once.
		if r.hold = !sp.done && sp.held == nil && !sp.wrote && endsClientHello(data); r.hold {
			sp.held = &held{txid: m.TransactionID, addr: addr, cred: cred}
		}
		// The read loop's push, as for a plain datagram; a full queue
		// drops it, as it would a plain one, and the client sends it
		// again (its next check, or plain).
		if s.dtls.enqueue(data) {
			s.e.spedIn.Add(1)
		} else {
			s.e.drop(DropDTLSQueueFull)
		}
	case !hasData:
		if sp.done {
			// The client is done too (libwebrtc: a message without DTLS
			// after the handshake ends the piggybacking).
			sp.state = spedDone
			sp.stash, sp.acks = nil, nil
			return spedReply{}
		}
		sp.acks = sp.acks[:0] // it is not retransmitting: nothing to acknowledge
	}
	r.ack, r.acks = true, append([]uint32(nil), sp.acks...)
	if selected && !sp.done && !r.hold {
		r.data = sp.nextData()
	}
	return r
}

// endsClientHello reports whether b's first record is a plaintext
// handshake record whose fragment ends a ClientHello (RFC 6347 §4.2.2 and
// RFC 9147 §5.2: msg_type 1, fragment_offset + fragment_length = length):
// the datagram the handshake answers with its first flight.
func endsClientHello(b []byte) bool {
	f, ok := firstFragment(b)
	return ok && f.typ == 1 && f.offset+f.fragLen == f.length
}

// isDTLS reports whether b starts like a DTLS record (RFC 7983 §7, as the
// read loop demultiplexes) of at least a record header.
func isDTLS(b []byte) bool { return len(b) >= 13 && stunpeek.Classify(b) == stunpeek.KindDTLS }

// noteReceived adds a client datagram's checksum to the ACK list. sp.mu
// held.
func (sp *sped) noteReceived(b []byte) {
	sp.heard = true
	c := spedCRC(b)
	for _, a := range sp.acks {
		if a == c {
			return
		}
	}
	if len(sp.acks) == maxSPEDAcks {
		copy(sp.acks, sp.acks[1:])
		sp.acks = sp.acks[:maxSPEDAcks-1]
	}
	sp.acks = append(sp.acks, c)
}

// received notes a plain DTLS datagram from the client (the read loop's
// push): the ACK names those too.
func (sp *sped) received(b []byte) {
	sp.mu.Lock()
	if sp.state == spedTentative || sp.state == spedOn {
		sp.noteReceived(b)
	}
	sp.mu.Unlock()
}

// prune drops the stashed datagrams an ACK names. sp.mu held.
func (sp *sped) prune(ack []byte) {
	kept := sp.stash[:0]
	for _, st := range sp.stash {
		named := false
		for i := 0; i+4 <= len(ack); i += 4 {
			if binary.BigEndian.Uint32(ack[i:]) == st.crc {
				named = true
				break
			}
		}
		if !named {
			kept = append(kept, st)
		}
	}
	clear(sp.stash[len(kept):])
	sp.stash = kept
	if sp.next >= len(sp.stash) {
		sp.next = 0
	}
}

// nextData returns the next stashed datagram for a response, in turn, or
// nil when none is left or the session's budget is spent. sp.mu held.
func (sp *sped) nextData() []byte {
	if len(sp.stash) == 0 || sp.data == maxSPEDData {
		return nil
	}
	b := sp.stash[sp.next].b
	sp.next = (sp.next + 1) % len(sp.stash)
	sp.data++
	return b
}

// hold keeps the response to the check that fed DTLS (onCheck made it
// sp.held) until the handshake's answer is written (written) or
// spedResponseWait passes, when it goes with the ACK alone. Read loop.
func (sp *sped) hold(s *Session) {
	sp.mu.Lock()
	h := sp.held
	if h == nil {
		sp.mu.Unlock()
		return // the handshake's answer took it already
	}
	h.timer = time.AfterFunc(sp.wait, func() {
		sp.mu.Lock()
		if sp.held != h {
			sp.mu.Unlock()
			return
		}
		sp.held = nil
		acks := append([]uint32(nil), sp.acks...)
		closed := sp.closed
		sp.mu.Unlock()
		if !closed {
			s.sendResponse(h, acks, nil)
		}
	})
	sp.mu.Unlock()
}

// written takes a handshake datagram the session writes before the
// handshake ends: it joins the current flight's stash (a write after the
// client's DTLS starts a new flight), and a held response carries it.
// It reports whether the held response took it, so that it does not go
// plain too. The DTLS goroutine (feed.WriteTo).
func (sp *sped) written(s *Session, b []byte) bool {
	sp.mu.Lock()
	if sp.state != spedTentative && sp.state != spedOn || sp.done {
		sp.mu.Unlock()
		return false
	}
	sp.wrote = true
	if sp.heard {
		sp.heard = false
		clear(sp.stash)
		sp.stash, sp.next = sp.stash[:0], 0
	}
	if len(sp.stash) < maxSPEDStash && len(b) <= spedMTU {
		sp.stash = append(sp.stash, stashed{b: bytes.Clone(b), crc: spedCRC(b)})
	}
	h := sp.held
	if h == nil || len(b) > spedMTU || sp.data == maxSPEDData {
		sp.mu.Unlock()
		return false
	}
	sp.held = nil
	if h.timer != nil {
		h.timer.Stop()
	}
	sp.data++
	acks := append([]uint32(nil), sp.acks...)
	sp.mu.Unlock()
	return s.sendResponse(h, acks, b)
}

// handshaken ends the stash: nothing more of the handshake is sent in
// responses, which carry the ACK until the client stops piggybacking.
func (sp *sped) handshaken() {
	sp.mu.Lock()
	sp.done = true
	sp.stash = nil
	sp.mu.Unlock()
}

// close stops a held response.
func (sp *sped) close() {
	sp.mu.Lock()
	sp.closed = true
	if sp.held != nil && sp.held.timer != nil {
		sp.held.timer.Stop()
	}
	sp.held = nil
	sp.mu.Unlock()
}

// sendResponse sends a held Binding response with the ACK and data. It
// reports whether it was sent.
func (s *Session) sendResponse(h *held, acks []uint32, data []byte) bool {
	var res stun.Message
	if err := bindingResponse(&res, h.txid, h.addr, h.cred, spedReply{ack: true, acks: acks, data: data}); err != nil {
		return false
	}
	if _, err := s.e.conn.WriteToAddrPort(res.Raw, h.addr); err != nil {
		return false
	}
	if data != nil {
		s.e.spedOut.Add(1)
	}
	return true
}

// bindingResponse builds into res the Binding success response to the
// check txid from addr: XOR-MAPPED-ADDRESS, SPED's attributes when r has
// them, MESSAGE-INTEGRITY with cred's pwd, FINGERPRINT. A datagram that
// would take the message past maxSPEDMessage is left out.
func bindingResponse(res *stun.Message, txid [stun.TransactionIDSize]byte, addr netip.AddrPort, cred *credentials, r spedReply) error {
	ip := addr.Addr().Unmap()
	setters := [6]stun.Setter{
		stun.NewType(stun.MethodBinding, stun.ClassSuccessResponse),
		stun.NewTransactionIDSetter(txid),
		&stun.XORMappedAddress{IP: net.IP(ip.AsSlice()), Port: int(addr.Port())},
	}
	n := 3
	if r.ack {
		var ack [maxSPEDAcks * 4]byte
		for i, c := range r.acks {
			binary.BigEndian.PutUint32(ack[4*i:], c)
		}
		setters[n] = stun.RawAttribute{Type: stun.AttrDtlsInStunAck, Value: ack[:4*len(r.acks)]}
		n++
		// Header, XOR-MAPPED-ADDRESS (IPv6 at most), the ACK,
		// MESSAGE-INTEGRITY and FINGERPRINT, each with its 4-byte
		// attribute header: what the datagram must leave room for.
		fixed := 24 + 4 + len(r.acks)*4 + 24 + 8
		if len(r.data) > 0 && fixed+4+len(r.data) <= maxSPEDMessage {
			setters[n] = stun.RawAttribute{Type: stun.AttrDtlsInStun, Value: r.data}
			n++
		}
	}
	if err := res.Build(setters[:n]...); err != nil {
		return err
	}
	if err := cred.integrity.AddTo(res); err != nil {
		return err
	}
	return stun.Fingerprint.AddTo(res)
}
