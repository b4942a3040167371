package e2e

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/impair"
)

// TestNATRebinding: mid-call the client's NAT gives it a new source port.
// The relay has no flow for the new address, so its media is dropped until
// the client's next consent check (a Binding request carrying the token)
// creates one; the transceiver's ICE agent then sees the check from the
// new address, and the client's SRTP from it moves the media. Media must resume in both directions with no signaling.
func TestNATRebinding(t *testing.T) {
	var px *impair.UDP
	s := startStackFront(t, 9, slog.New(slog.DiscardHandler), func(relay netip.AddrPort) netip.AddrPort {
		var err error
		if px, err = impair.NewUDP("127.0.0.1:0", relay, impair.Config{}, 1); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = px.Close() })
		return px.Addr()
	})
	// Let the call run, then rebind the client's NAT mapping.
	done := callInBackground(t, s, 12*time.Second)
	flowsBefore := s.relay.Stats().FlowsCreated
	movesBefore := peerMoved(s.trx.PeerMoves())
	rebound := 0
	for _, c := range px.Clients() {
		if px.Rebind(c) {
			rebound++
		}
	}
	if rebound == 0 {
		t.Fatal("no client mapping to rebind")
	}
	rebindAt := time.Now()
	// Media resumes once the client's next consent check (a Binding request
	// with the token and the session's credentials) has created a flow for
	// the new address at the relay, made it a candidate of the session and
	// the client's next SRTP from it has confirmed the move (internal/peer,
	// "Path selection"; the hop reports the new port as it is).
	var resumedAfter time.Duration
	for time.Since(rebindAt) < 10*time.Second {
		time.Sleep(10 * time.Millisecond)
		if s.relay.Stats().FlowsCreated > flowsBefore && peerMoved(s.trx.PeerMoves()) > movesBefore {
			resumedAfter = time.Since(rebindAt)
			break
		}
	}
	res := <-done
	t.Logf("report: %s", res.r)
	t.Logf("peer moves %v", s.trx.PeerMoves())
	if resumedAfter == 0 {
		t.Fatalf("the transceiver did not follow the client to its new address within 10 s (relay %+v)", s.relay.Stats())
	}
	t.Logf("media resumed %v after the rebinding", resumedAfter.Round(time.Millisecond))
	if res.err != nil || res.r.PayloadMismatches != 0 || !res.r.DataChannelEchoed {
		t.Fatalf("call: %v", res.err)
	}
	// Both directions resumed: what was lost is at most the gap until the
	// client's next consent check (Pion's client sends one every 2 s),
	// plus slack for scheduling on a busy machine.
	lost := res.r.PacketsSent - res.r.PacketsReceived
	if maxLost := int(resumedAfter/(20*time.Millisecond)) + 50; lost > maxLost {
		t.Fatalf("%d of %d packets did not come back, more than the %v gap explains (%d)", lost, res.r.PacketsSent, resumedAfter, maxLost)
	}
}

// peerMoved is the number of moves of a session's media to another client
// address (peer.Endpoint.Moves; a deferred nomination is not a move).
func peerMoved(m [peer.NumMoveReasons]uint64) uint64 {
	return m[peer.MoveNominated] + m[peer.MoveConfirmed]
}
