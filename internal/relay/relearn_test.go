package relay

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/hop"
)

// TestRelearn: with Relearn, a member's datagram for a client the relay
// does not know (it restarted) creates a confirmed flow, so the reply and
// the client's media that follows are forwarded at once. Without it, the
// relay never sends to a client without a flow.
func TestRelearn(t *testing.T) {
	rtp := []byte{0x80, 111, 0, 1, 0, 0, 0, 1}
	reply := append(hop.AppendHeader(nil, hop.TypeData, c1), 0x80, 111, 0, 9)
	tests := []struct {
		name    string
		relearn bool
		to      netip.AddrPort
		drop    DropReason
	}{
		{"off", false, netip.AddrPort{}, DropInternalNoFlow},
		{"on", true, c1, dropNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, Config{Relearn: tt.relearn})
			to, out, drop := f.r.handleInternal(t7, bytes.Clone(reply), f.now)
			if drop != tt.drop || to != tt.to {
				t.Fatalf("reply for an unknown client: %v to %v, want %v to %v", drop, to, tt.drop, tt.to)
			}
			st := f.r.Stats()
			if !tt.relearn {
				if st.Flows != 0 || st.FlowsRelearned != 0 {
					t.Fatalf("flows %d, relearned %d", st.Flows, st.FlowsRelearned)
				}
				return
			}
			if !bytes.Equal(out, reply[hop.HeaderLenV4:]) || st.Flows != 1 || st.PendingFlows != 0 || st.FlowsRelearned != 1 {
				t.Fatalf("out %x, stats %+v", out, st)
			}
			// The client's media now follows the relearned flow.
			if to, _, drop := f.pub(c1, rtp); drop != dropNone || to != t7 {
				t.Fatalf("client media after relearning: %v to %v", drop, to)
			}
			// A non-member still reaches nobody.
			if _, _, drop := f.r.handleInternal(netip.MustParseAddrPort("192.0.2.99:4000"), bytes.Clone(reply), f.now); drop != DropInternalUnknownPeer {
				t.Fatalf("non-member: %v", drop)
			}
		})
	}
}
