package relay

// Tests of the relay's security properties (issue 4, docs/security.md):
// what nothing a client or a stranger sends can make the relay do.

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/stunpeek"
)

var (
	c3      = netip.MustParseAddrPort("198.51.100.3:50003")  // confirmed to 7, candidate 8
	c4      = netip.MustParseAddrPort("198.51.100.4:50004")  // never has a flow at the start
	c6      = netip.MustParseAddrPort("[2001:db8::6]:50006") // idem, IPv6
	ingress = netip.MustParseAddrPort("192.0.2.1:5000")      // a trusted Global Relay
	outside = netip.MustParseAddrPort("127.0.0.1:9999")      // not a member
)

// fuzzState is the relay state every FuzzHandlers input starts from.
type fuzzState struct {
	f                *fixture
	bind7, bind8     []byte // Binding requests with tokens for 7 and 8
	bind8c3          []byte // the candidate's Binding request of c3
	publicFrom       []netip.AddrPort
	internalFrom     []netip.AddrPort
	bufPub, bufInter []byte
	named            netip.AddrPort // a client named by a hop header in the last input
}

func newFuzzState(tb testing.TB) *fuzzState {
	f := newFixture(tb, Config{
		NewFlowsPerIP: maxLimit, NewFlowsPerSecond: 1<<32 - 1, MaxPendingPerIP: maxLimit,
		TrustedIngress: []string{"192.0.2.0/24"},
	})
	s := &fuzzState{
		f: f, bind7: f.good(7), bind8: f.good(8), bind8c3: f.good(8),
		publicFrom:   []netip.AddrPort{c1, c2, c3, c4, c6, ingress, t7},
		internalFrom: []netip.AddrPort{t7, t8, outside},
		bufPub:       make([]byte, hop.MaxHeaderLen+4096),
		bufInter:     make([]byte, 4096),
	}
	s.reset(tb)
	return s
}

// reset removes every flow and builds the baseline: c1 confirmed to 7, c2
// pending to 8, c3 confirmed to 7 with a candidate for 8.
func (s *fuzzState) reset(tb testing.TB) {
	f := s.f
	for _, a := range []netip.AddrPort{c1, c2, c3, c4, c6, ingress, t7, t8, outside, s.named} {
		f.r.flows.remove(a)
	}
	if st := f.r.Stats(); st.Flows != 0 || st.PendingFlows != 0 {
		tb.Fatalf("flows left after removing every address the input could name: %+v", st)
	}
	steps := []struct {
		pub  bool
		from netip.AddrPort
		pkt  []byte
		to   netip.AddrPort
	}{
		{true, c1, s.bind7, t7}, {false, t7, nil, c1},
		{true, c2, s.bind8, t8},
		{true, c3, s.bind7, t7}, {false, t7, nil, c3}, {true, c3, s.bind8c3, t8},
	}
	for _, st := range steps {
		var to netip.AddrPort
		var drop DropReason
		if st.pub {
			to, _, drop = f.pub(st.from, st.pkt)
		} else {
			to, _, drop = f.internal(st.from, st.to, []byte{0x80, 0})
		}
		if drop != dropNone || to != st.to {
			tb.Fatalf("baseline step %v: (%v, %v)", st.from, to, drop)
		}
	}
}

// FuzzHandlers feeds arbitrary datagrams to handlePublic and handleInternal
// from a fixed set of senders, starting from a baseline of a confirmed flow,
// a pending flow and a flow with a restart candidate. Properties: no panic;
// a drop returns no output; a forward to a transceiver goes to a member and
// carries the datagram unchanged behind a header naming the client; a flow
// is created only by a Binding request with a valid token; a forward to the
// public side goes only to a client with a flow to the sending member (or
// to that flow's Global Relay) and carries the payload unchanged.
func FuzzHandlers(f *testing.F) {
	s := newFuzzState(f)
	for _, pkt := range [][]byte{
		s.bind7, s.bind8, s.bind8c3, {0x80, 111, 0, 1, 2, 3}, {22, 0xfe, 0xfd, 0, 0}, {0x81, 200}, {}, {hop.Magic},
		rawSTUN(0x0001, 0x0006, []byte("abcd:efgh")), rawSTUN(0x0001, 0x8022, []byte("soft")),
		append(hop.AppendHeader(nil, hop.TypeData, c4), s.bind7...),
		append(hop.AppendHeader(nil, hop.TypeData, c1), 0x80, 1),
		append(hop.AppendHeader(nil, hop.TypeData, c3), 0x01, 0x01, 0, 0),
		append(hop.AppendHeader(nil, hop.TypeData, netip.MustParseAddrPort("[2001:db8::2]:50001")), 0x80),
	} {
		for sel := range 10 {
			f.Add(uint8(sel), pkt)
		}
	}
	f.Fuzz(func(t *testing.T, sel uint8, pkt []byte) {
		defer s.reset(t)
		if len(pkt) > 4000 {
			pkt = pkt[:4000]
		}
		r := s.f.r
		if sel&1 == 0 {
			from := s.publicFrom[int(sel>>1)%len(s.publicFrom)]
			client, framed := from, false
			inner := pkt
			if _, named, payload, err := hop.ParseHeader(pkt); err == nil && from == ingress && len(pkt) > 0 && pkt[0] == hop.Magic {
				client, framed, inner = named, true, payload
				s.named = named
			}
			before, had := r.flows.touch(client, 0)
			buf := s.bufPub[:hop.MaxHeaderLen+copy(s.bufPub[hop.MaxHeaderLen:], pkt)]
			to, out, drop := r.handlePublic(from, buf, s.f.now)
			after, has := r.flows.touch(client, 0)
			if drop != dropNone {
				if out != nil || to.IsValid() {
					t.Fatalf("drop %v with output (%v, %d bytes)", drop, to, len(out))
				}
				if !had && has {
					t.Fatalf("dropped datagram (%v) created a flow", drop)
				}
				if had && after != before {
					t.Fatalf("dropped datagram (%v) re-pointed the flow %v -> %v", drop, before, after)
				}
				return
			}
			if !r.members.Contains(to) {
				t.Fatalf("forwarded to %v, not a member", to)
			}
			if !has {
				t.Fatal("forwarded without a flow")
			}
			if !had {
				if _, res := stunpeek.PeekBindingRequest(inner); res != stunpeek.OK {
					t.Fatalf("flow created by a datagram that is not a Binding request (%v)", res)
				}
			}
			if had && stunpeek.Classify(inner) != stunpeek.KindSTUN && to != before {
				t.Fatalf("media sent to %v, the flow goes to %v", to, before)
			}
			_ = framed
			_, named, payload, err := hop.ParseHeader(out)
			if err != nil || named != client || !bytes.Equal(payload, inner) {
				t.Fatalf("forwarded %x for %v (%v), want the datagram unchanged for %v", payload, named, err, client)
			}
			return
		}
		from := s.internalFrom[int(sel>>1)%len(s.internalFrom)]
		b := s.bufInter[:copy(s.bufInter, pkt)]
		to, out, drop := r.handleInternal(from, b, s.f.now)
		if drop != dropNone {
			if out != nil || to.IsValid() {
				t.Fatalf("drop %v with output", drop)
			}
			return
		}
		if !r.members.Contains(from) {
			t.Fatalf("forwarded for non-member %v", from)
		}
		_, client, payload, err := hop.ParseHeader(pkt)
		if err != nil {
			t.Fatalf("forwarded a datagram whose header does not parse: %v", err)
		}
		dst, ok := r.flows.touch(client, 0)
		if !ok || dst != from {
			t.Fatalf("sent to %v, whose flow is (%v, %v), for member %v", client, dst, ok, from)
		}
		switch {
		case to == client:
			if !bytes.Equal(out, payload) {
				t.Fatal("payload changed")
			}
		case to == ingress:
			if !bytes.Equal(out, pkt) {
				t.Fatal("datagram to the Global Relay changed")
			}
		default:
			t.Fatalf("sent to %v for client %v", to, client)
		}
	})
}
