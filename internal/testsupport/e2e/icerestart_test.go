package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"
	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/sdpfrag"
)

// TestICERestart: a PATCH with the client's new credentials (RFC 9725
// §4.3) gives the session a fresh routing token as ufrag and a fresh pwd;
// media and the data channel carry on over the new ICE session; the old
// ufrag's state is gone (a check with the old credentials gets no answer,
// one with the new does); a stale ETag gets 412 and none gets 428.
func TestICERestart(t *testing.T) {
	s := startStack(t, 21)
	c := dial(t, s)
	pc, dc, echoes, session, etag := c.pc, c.dc, c.msgs, c.session, c.etag
	failed := make(chan struct{}, 1)
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		if st == webrtc.PeerConnectionStateFailed || st == webrtc.PeerConnectionStateClosed {
			select {
			case failed <- struct{}{}:
			default:
			}
		}
	})
	before, err := sdpfrag.FromSDP(pc.RemoteDescription().SDP)
	if err != nil {
		t.Fatal(err)
	}
	echo := func(msg string) {
		t.Helper()
		if err := dc.SendText(msg); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-echoes:
			if got != msg {
				t.Fatalf("echo %q, want %q", got, msg)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no echo of %q", msg)
		}
	}
	echo(`{"type":"ping","id":"before"}`)

	// Preconditions (RFC 9725 §4.3.1): none is 428, a stale tag is 412.
	frag := "a=ice-ufrag:abcd\r\na=ice-pwd:" + strings.Repeat("p", 22) + "\r\n"
	for _, c := range []struct {
		ifMatch string
		want    int
	}{{"", http.StatusPreconditionRequired}, {`"stale/1"`, http.StatusPreconditionFailed}} {
		req, _ := http.NewRequest(http.MethodPatch, session, strings.NewReader(frag))
		req.Header.Set("Content-Type", sdpfrag.ContentType)
		if c.ifMatch != "" {
			req.Header.Set("If-Match", c.ifMatch)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != c.want {
			t.Fatalf("PATCH If-Match %q: %d %s, want %d", c.ifMatch, r.StatusCode, body, c.want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	newTag, err := callclient.RestartICE(ctx, http.DefaultClient, pc, session, etag, nil)
	if err != nil {
		t.Fatalf("ICE restart: %v", err)
	}
	if newTag == etag {
		t.Fatalf("ETag %s did not change with the ICE session", newTag)
	}
	after, err := sdpfrag.FromSDP(pc.RemoteDescription().SDP)
	if err != nil {
		t.Fatal(err)
	}
	if after.Ufrag == before.Ufrag || after.Pwd == before.Pwd {
		t.Fatalf("restart kept credentials: ufrag %s -> %s", before.Ufrag, after.Ufrag)
	}
	for _, u := range []string{before.Ufrag, after.Ufrag} {
		c, err := s.keys.Open([]byte(u), time.Now())
		if err != nil || c.Transceiver != 21 || c.Cluster != 4 {
			t.Fatalf("ufrag %s is not a routing token for transceiver 21 in cluster 4: %+v, %v", u, c, err)
		}
	}
	// The data channel (DTLS, SCTP) carries on over the new ICE session.
	echo(`{"type":"ping","id":"after"}`)
	t.Logf("ICE restart: data channel echoed %v after the restart began", time.Since(start).Round(time.Millisecond))

	// The old tag is stale now; the new one is current (a trickle-only
	// fragment changes nothing: 204).
	for _, c := range []struct {
		tag  string
		want int
	}{{etag, http.StatusPreconditionFailed}, {newTag, http.StatusNoContent}} {
		req, _ := http.NewRequest(http.MethodPatch, session, strings.NewReader("a=mid:0\r\na=end-of-candidates\r\n"))
		req.Header.Set("Content-Type", sdpfrag.ContentType)
		req.Header.Set("If-Match", c.tag)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != c.want {
			t.Fatalf("PATCH If-Match %s: %d, want %d", c.tag, r.StatusCode, c.want)
		}
	}

	// The old ufrag's state is purged: a check with the old credentials,
	// from a new address through the relay, gets no answer; the same check
	// with the new credentials does.
	local, err := sdpfrag.FromSDP(pc.LocalDescription().SDP)
	if err != nil {
		t.Fatal(err)
	}
	if got := probe(t, s, before.Ufrag+":"+local.Ufrag, before.Pwd); got {
		t.Fatal("a Binding request with the old ufrag and pwd was answered")
	}
	if got := probe(t, s, after.Ufrag+":"+local.Ufrag, after.Pwd); !got {
		t.Fatal("a Binding request with the new ufrag and pwd was not answered (the probe is broken)")
	}
	select {
	case <-failed:
		t.Fatalf("peer connection %s", pc.ConnectionState())
	default:
	}
	if n := restartsOK(t, s); n != 1 {
		t.Fatalf("ice_restarts_total{result=ok} = %v, want 1", n)
	}
}

// probe sends a Binding request with USERNAME user and MESSAGE-INTEGRITY
// keyed by pwd to the relay from a fresh socket and reports whether a
// success response came back within a second.
func probe(t *testing.T, s *stack, user, pwd string) bool {
	t.Helper()
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(s.relay.PublicAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(stun.Message)
	if err := m.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(user),
		ice.AttrControlling(1), ice.PriorityAttr(1<<24), stun.NewShortTermIntegrity(pwd), stun.Fingerprint); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	for range 3 {
		if _, err := c.Write(m.Raw); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(330 * time.Millisecond))
		n, err := c.Read(buf)
		if err != nil {
			continue
		}
		resp := &stun.Message{Raw: append([]byte(nil), buf[:n]...)}
		if resp.Decode() == nil && resp.Type == stun.BindingSuccess && resp.TransactionID == m.TransactionID {
			return true
		}
	}
	return false
}

// restartsOK reads switchboard_transceiver_ice_restarts_total{result="ok"}.
func restartsOK(t *testing.T, s *stack) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "switchboard_transceiver_ice_restarts_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "ok" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatal("no switchboard_transceiver_ice_restarts_total{result=ok}")
	return 0
}

// TestICERestartAudio: a call that restarts ICE mid-stream keeps its echoed
// audio, in order, with a gap of a few packets.
func TestICERestartAudio(t *testing.T) {
	s := startStack(t, 22)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := callclient.Run(ctx, callclient.Options{
		URL: s.signaling.URL + "/v1/calls", AudioPath: speech, Duration: 4 * time.Second,
		IPv4Only: true, ICERestartAfter: 1500 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("call: %v\n%s", err, r)
	}
	rr := r.ICERestart
	if rr == nil || rr.Error != "" || rr.ResumedMS == 0 {
		t.Fatalf("ICE restart did not complete with audio after it: %+v", rr)
	}
	t.Logf("ICE restart: answer applied after %.1f ms, audio back after %.1f ms; audio gap across the restart %.1f ms (longest in the call %.1f ms); %d/%d packets back",
		rr.PatchMS, rr.ResumedMS, rr.GapMS, r.MaxGapMS, r.PacketsReceived, r.PacketsSent)
	if rr.GapMS == 0 || rr.GapMS > r.MaxGapMS {
		t.Fatalf("restart gap %.1f ms is not within the call's longest gap %.1f ms", rr.GapMS, r.MaxGapMS)
	}
	if r.PayloadMismatches != 0 || !r.DataChannelEchoed {
		t.Fatalf("echo broken across the restart: %s", r)
	}
	// Bound the outage loosely (a loaded CI machine); the figure is logged.
	if r.MaxGapMS > 2000 {
		t.Fatalf("audio gap %.0f ms across the ICE restart", r.MaxGapMS)
	}
}
