package e2e

import (
	"log/slog"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/relay"
)

// TestRelayRestart kills the relay mid-call and starts a new one on the
// same addresses, with an empty flow table. No session may be lost
// (invariant 7): the flow comes back from the client's next consent check
// (a Binding request with the token) or, with Relearn, from the
// transceiver's next datagram for the client. The gap is reported.
func TestRelayRestart(t *testing.T) {
	for _, relearn := range []bool{false, true} {
		name := map[bool]string{false: "next STUN", true: "relearn"}[relearn]
		t.Run(name, func(t *testing.T) {
			s := startStackWithLog(t, 11, slog.New(slog.DiscardHandler))
			public, internal := s.relay.PublicAddr(), s.relay.InternalAddr()
			done := callInBackground(t, s, 8*time.Second)
			_ = s.relay.Close()
			killed := time.Now()
			members := s.members
			var fresh *relay.Relay
			var err error
			for fresh == nil && time.Since(killed) < 2*time.Second {
				fresh, err = relay.New(relay.Config{
					PublicAddr: public.String(), InternalAddr: internal.String(), Cluster: 4, Workers: 2, Relearn: relearn,
				}, s.keys, members, nil, slog.New(slog.DiscardHandler))
			}
			if err != nil {
				t.Fatalf("restart: %v", err)
			}
			defer fresh.Close()
			var back time.Duration
			for time.Since(killed) < 10*time.Second {
				if st := fresh.Stats(); st.Flows > 0 && st.ToClientPackets > 0 && st.ToTransceiverPackets > 0 {
					back = time.Since(killed)
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			res := <-done
			st := fresh.Stats()
			t.Logf("media back in both directions %v after the kill; relearned %d, created %d; client sent %d, received %d",
				back.Round(time.Millisecond), st.FlowsRelearned, st.FlowsCreated, res.r.PacketsSent, res.r.PacketsReceived)
			if back == 0 {
				t.Fatal("media did not come back through the restarted relay")
			}
			if res.err != nil || !res.r.DataChannelEchoed || res.r.PayloadMismatches != 0 {
				t.Fatalf("the session did not survive the relay restart: %v\n%s", res.err, res.r)
			}
			if relearn && st.FlowsRelearned == 0 {
				t.Fatal("with Relearn, no flow was relearned")
			}
			lost := res.r.PacketsSent - res.r.PacketsReceived
			if maxLost := int(back/(20*time.Millisecond)) + 50; lost > maxLost {
				t.Fatalf("%d packets lost, more than the %v gap explains (%d)", lost, back, maxLost)
			}
		})
	}
}
