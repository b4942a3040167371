package relay

import (
	"net/netip"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/stunpeek"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// handlePublic decides what to do with a datagram from client from on the
// public socket. buf holds hop.MaxHeaderLen bytes of headroom followed by the
// datagram; on forward, the header is written into the headroom in front of
// the payload (no copy) and out is the header plus payload, to be sent from
// the internal socket to to. from must be canonical (unmapped).
func (r *Relay) handlePublic(from netip.AddrPort, buf []byte, now time.Time) (to netip.AddrPort, out []byte, drop DropReason) {
	if pkt := buf[hop.MaxHeaderLen:]; len(pkt) > 0 && pkt[0] == hop.Magic && len(r.cfg.trustedIngress) > 0 {
		return r.handleFromIngress(from, pkt, now)
	}
	return r.fromClient(from, netip.AddrPort{}, buf, hop.MaxHeaderLen, now)
}

// fromClient forwards client datagram buf[off:] from client, which arrived
// directly (via invalid) or through the Global Relay via. On forward the
// hop header for client is written just before off, which must leave room
// for it, and out is the header plus payload.
func (r *Relay) fromClient(client, via netip.AddrPort, buf []byte, off int, now time.Time) (to netip.AddrPort, out []byte, drop DropReason) {
	pkt := buf[off:]
	if len(pkt) > hop.MaxPayload {
		return to, nil, DropTooBig
	}
	kind := stunpeek.Classify(pkt)
	if kind == stunpeek.KindOther {
		return to, nil, DropUnknownFirstByte
	}
	t := r.mono(now)
	to, hit := r.flows.touch(client, t)
	switch {
	case !hit && kind != stunpeek.KindSTUN:
		if r.fc == nil || hop.IsTCP(client) {
			// A TCP client's flow lives as long as its connection,
			// which begins with a check: there is nothing to look up.
			return to, nil, DropNotSTUNOnMiss
		}
		// Hold it and ask the flow cache (flowcache.go).
		if to, drop = r.fc.hold(client, via, pkt, t); drop != dropNone {
			return netip.AddrPort{}, nil, drop
		}
		if !to.IsValid() {
			return to, nil, dropNone // held: the third outcome
		}
		// The cache restored the flow meanwhile: ride it.
		if !r.members.Contains(to) {
			return netip.AddrPort{}, nil, DropTransceiverGone
		}
	case !hit:
		if to, drop = r.admit(client, via, pkt, now, t); drop != dropNone {
			return to, nil, drop
		}
		if !to.IsValid() {
			return to, nil, dropNone // held until a cap lets it through (wait.go)
		}
	case kind == stunpeek.KindSTUN:
		to = r.restart(client, via, pkt, to, now, t)
		fallthrough
	default:
		if !r.members.Contains(to) {
			return netip.AddrPort{}, nil, DropTransceiverGone
		}
	}
	start := off - hop.HeaderLen(client.Addr())
	hop.PutHeader(buf[start:], hop.TypeFor(client), client)
	return to, buf[start:], dropNone
}

// admit is the first-packet path for STUN from a client without a flow:
// peek the Binding request's USERNAME, open the token in its server ufrag,
// check cluster and membership, and create a pending flow. A request a
// per-source cap turns away for the moment is held instead (wait.go): then
// the destination is invalid and the drop none.
func (r *Relay) admit(from, via netip.AddrPort, pkt []byte, now time.Time, t int64) (netip.AddrPort, DropReason) {
	user, res := stunpeek.PeekBindingRequest(pkt)
	switch res {
	case stunpeek.OK:
	case stunpeek.NotBindingRequest:
		return netip.AddrPort{}, DropSTUNNotBindingRequest
	case stunpeek.NoUsername:
		return netip.AddrPort{}, DropNoUsername
	case stunpeek.UsernameTooLong:
		return netip.AddrPort{}, DropUsernameMalformed
	default:
		return netip.AddrPort{}, DropSTUNMalformed
	}
	ufrag, ok := stunpeek.ServerUfrag(user)
	if !ok {
		return netip.AddrPort{}, DropUsernameMalformed
	}
	dst, tr, drop := r.route(ufrag, now)
	if drop != dropNone {
		return netip.AddrPort{}, drop
	}
	if drop := r.flows.upsertVia(from, dst, via, tr, ufrag, t); drop != dropNone {
		if holdable(drop) && r.wait.hold(from, via, dst, tr, ufrag, pkt, drop, t) {
			return netip.AddrPort{}, dropNone // held: delayed, not refused (wait.go)
		}
		return netip.AddrPort{}, drop
	}
	return dst, dropNone
}

// restart handles STUN from a client that has a flow towards dst. A Binding
// request whose server ufrag differs from the one that created the flow and
// is a valid token for a member is an ICE restart: for the same transceiver
// it re-points the flow at once; for another one it becomes the flow's
// candidate, which the request goes to and which takes the flow over when
// its transceiver answers (restart.go). Anything else
// (consent checks with the same ufrag, malformed STUN, an invalid new token)
// rides the existing flow unchanged: an invalid token never changes a flow.
func (r *Relay) restart(from, via netip.AddrPort, pkt []byte, dst netip.AddrPort, now time.Time, t int64) netip.AddrPort {
	user, ok := stunpeek.BindingRequestUsername(pkt)
	if !ok {
		return dst
	}
	ufrag, ok := stunpeek.ServerUfrag(user)
	if !ok {
		return dst
	}
	switch m, cand := r.flows.matchUfrag(from, ufrag); m {
	case ufragCurrent:
		// The client's path may have moved to another Global Relay (or
		// from one to none): replies follow its consent checks.
		r.flows.setVia(from, via)
		return dst
	case ufragCandidate:
		return cand
	}
	ndst, tr, drop := r.route(ufrag, now)
	switch {
	case drop != dropNone:
		return dst
	case ndst == dst:
		// Same transceiver: nothing moves, so no confirmation is needed.
		if r.flows.upsertVia(from, ndst, via, tr, ufrag, t) != dropNone {
			return dst
		}
	case !r.flows.propose(from, ndst, via, tr, ufrag, t):
		// Another transceiver: only a candidate until it answers (restart.go).
		return dst
	}
	return ndst
}

// route opens a routing token and resolves its transceiver.
func (r *Relay) route(ufrag []byte, now time.Time) (netip.AddrPort, uint32, DropReason) {
	c, err := r.keys.Open(ufrag, now)
	switch err {
	case nil:
	case token.ErrForged:
		return netip.AddrPort{}, 0, DropTokenForged
	case token.ErrUnknownKey:
		return netip.AddrPort{}, 0, DropTokenUnknownKey
	case token.ErrExpired:
		return netip.AddrPort{}, 0, DropTokenExpired
	default:
		return netip.AddrPort{}, 0, DropTokenMalformed
	}
	if r.cfg.Ingress {
		// A Global Relay: the table maps cluster ids to cluster relays.
		dst, ok := r.members.Lookup(uint32(c.Cluster))
		if !ok {
			return netip.AddrPort{}, 0, DropUnknownCluster
		}
		return dst, uint32(c.Cluster), dropNone
	}
	if c.Cluster != r.cfg.Cluster {
		r.noteDrop(DropWrongCluster, uint32(c.Cluster))
		return netip.AddrPort{}, 0, DropWrongCluster
	}
	dst, ok := r.members.Lookup(c.Transceiver)
	if !ok {
		r.noteDrop(DropUnknownTransceiver, c.Transceiver)
		return netip.AddrPort{}, 0, DropUnknownTransceiver
	}
	return dst, c.Transceiver, dropNone
}

// handleInternal decides what to do with datagram b from transceiver from
// on the internal socket: out is the client payload (aliasing b, unchanged)
// to send from the public socket to the client to. from must be canonical.
func (r *Relay) handleInternal(from netip.AddrPort, b []byte, now time.Time) (to netip.AddrPort, out []byte, drop DropReason) {
	if !r.members.Contains(from) {
		return to, nil, DropInternalUnknownPeer
	}
	typ, client, payload, err := hop.ParseHeader(b)
	if err != nil {
		return to, nil, DropInternalBadHeader
	}
	if len(payload) == 0 {
		return to, nil, DropInternalEmptyPayload
	}
	if len(payload) > hop.MaxPayload {
		return to, nil, DropTooBig
	}
	client = hop.ClientOf(typ, client)
	t := r.mono(now)
	via, drop := r.flows.reply(client, from, t)
	// A TCP client is never relearned: its flow went with its
	// connection, and a new connection begins with a check.
	if drop == DropInternalNoFlow && r.cfg.Relearn && typ == hop.TypeData {
		// The flow records from's real id (Contains above said it has one).
		id, _ := r.members.ID(from)
		if drop = r.flows.relearn(client, from, id, t); drop == dropNone {
			return client, payload, dropNone
		}
	}
	if drop != dropNone {
		return to, nil, drop
	}
	if via.IsValid() {
		// The client is behind a Global Relay: send it the datagram as
		// it came, header naming the client and all.
		return via, b, dropNone
	}
	if typ == hop.TypeDataTCP {
		// Taken: copied into the client's connection queue, whose writer
		// sends it (tcp.go); a full queue drops its oldest audio.
		return netip.AddrPort{}, nil, r.tcp.deliver(client, payload)
	}
	return client, payload, dropNone
}

// sweepInterval is how often the sweeper runs: a quarter of the shorter
