package e2e

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// gatherByLabel returns the values of metric name by its label values
// (joined with ","), from reg.
func gatherByLabel(t *testing.T, s *stack, name string) map[string]float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			out[strings.Join(labels, ",")] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// TestCallOverTCP: a Pion client that gathers only TCP candidates (as on
// a network that drops UDP) calls through the relay's ICE-TCP port: audio
// both ways and a data-channel echo, every packet through the relay's TCP
// side; the same client with UDP too selects UDP. The transceiver counts
// each session under the transport it used.
func TestCallOverTCP(t *testing.T) {
	s := startStackTCP(t, 21, slog.New(slog.DiscardHandler), nil, true)
	for _, tc := range []struct {
		network, want string
	}{{"tcp", "tcp"}, {"any", "udp"}} {
		t.Run(tc.network, func(t *testing.T) {
			before := s.relay.Stats()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r, err := callclient.Run(ctx, callclient.Options{
				URL: s.signaling.URL + "/v1/calls", AudioPath: speech, Duration: 2 * time.Second, IPv4Only: true, Network: tc.network,
			})
			if err != nil {
				t.Fatalf("call: %v\n%s", err, r)
			}
			after := s.relay.Stats()
			t.Logf("network %s: transport %s, setup %+v, sent %d, received %d, max gap %.0f ms; relay TCP: %d connections accepted, frames %d in, %d out",
				tc.network, r.Transport, r.Setup, r.PacketsSent, r.PacketsReceived, r.MaxGapMS,
				after.TCP.Accepted-before.TCP.Accepted, after.TCP.ToTransceiverFrames-before.TCP.ToTransceiverFrames, after.TCP.ToClientFrames-before.TCP.ToClientFrames)
			if r.Transport != tc.want || !r.AudioEchoed || !r.DataChannelEchoed {
				t.Fatalf("transport %q (want %s), audio echoed %v, data channel echoed %v\n%s", r.Transport, tc.want, r.AudioEchoed, r.DataChannelEchoed, r)
			}
			if tc.want == "tcp" {
				if in, out := after.TCP.ToTransceiverFrames-before.TCP.ToTransceiverFrames, after.TCP.ToClientFrames-before.TCP.ToClientFrames; in < uint64(r.PacketsSent) || out < uint64(r.PacketsReceived) {
					t.Fatalf("relay TCP frames %d in, %d out; the client sent %d and received %d", in, out, r.PacketsSent, r.PacketsReceived)
				}
				if after.ToClientPackets != before.ToClientPackets {
					t.Fatalf("%d UDP datagrams to clients during a TCP-only call", after.ToClientPackets-before.ToClientPackets)
				}
			}
			// The connections close with the call, and their flows with them.
			deadline := time.Now().Add(10 * time.Second)
			for s.relay.Stats().TCP.Open != 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if st := s.relay.Stats(); st.TCP.Open != 0 {
				t.Fatalf("%d TCP connections open after the call", st.TCP.Open)
			}
		})
	}
	// A session is counted at the end of its teardown.
	deadline := time.Now().Add(10 * time.Second)
	ended := gatherByLabel(t, s, "switchboard_transceiver_sessions_ended_by_transport_total")
	for ended["tcp"]+ended["udp"] < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		ended = gatherByLabel(t, s, "switchboard_transceiver_sessions_ended_by_transport_total")
	}
	connect := gatherByLabel(t, s, "switchboard_transceiver_connect_by_transport_seconds")
	if ended["tcp"] != 1 || ended["udp"] != 1 || connect["tcp"] != 1 || connect["udp"] != 1 {
		t.Fatalf("sessions ended by transport %v, connected %v; want one of each", ended, connect)
	}
	if dg := gatherByLabel(t, s, "switchboard_transceiver_hop_datagrams_total"); dg["from_client,tcp"] < 90 || dg["to_client,tcp"] < 90 {
		t.Fatalf("hop datagrams by transport %v", dg)
	}
}

// TestDrainTCP: a draining transceiver keeps a call over ICE-TCP as it
// keeps a UDP one (the drain does not look at transports): media goes on
// through the relay's TCP side until the bound, then the session ends
// cleanly and the client's TCP connection closes.
func TestDrainTCP(t *testing.T) {
	s := startStackTCP(t, 25, slog.New(slog.DiscardHandler), nil, true)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	done := make(chan callResult, 1)
	go func() {
		r, err := callclient.Run(ctx, callclient.Options{URL: s.signaling.URL + "/v1/calls", AudioPath: speech, Duration: 20 * time.Second, IPv4Only: true, Network: "tcp"})
		done <- callResult{r, err}
	}()
	deadline := time.Now().Add(15 * time.Second)
	for s.relay.Stats().TCP.ToClientFrames < 50 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	dctx, dcancel := context.WithCancel(context.Background())
	drained := make(chan int, 1)
	go func() { drained <- s.trx.Drain(dctx) }()
	before := s.relay.Stats().TCP
	time.Sleep(time.Second)
	during := s.relay.Stats().TCP
	if s.trx.Sessions() != 1 || during.ToClientFrames-before.ToClientFrames < 30 || during.ToTransceiverFrames-before.ToTransceiverFrames < 30 {
		t.Fatalf("while draining: %d sessions, TCP frames %d out and %d in over 1 s", s.trx.Sessions(),
			during.ToClientFrames-before.ToClientFrames, during.ToTransceiverFrames-before.ToTransceiverFrames)
	}
	dcancel()
	if n := <-drained; n != 1 {
		t.Fatalf("drain ended %d sessions, want 1", n)
	}
	res := <-done
	t.Logf("drained; client: %v, transport %s, sent %d, received %d", res.err, res.r.Transport, res.r.PacketsSent, res.r.PacketsReceived)
	deadline = time.Now().Add(10 * time.Second)
	for s.relay.Stats().TCP.Open != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := s.relay.Stats().TCP; st.Open != 0 {
		t.Fatalf("%d TCP connections open after the drain ended the session", st.Open)
	}
}

// TestCallOverTCPThroughGlobalRelay: a Pion client with TCP candidates
// only, in a region whose ingress is a Global Relay, calls over the Global
// Relay's ICE-TCP port: the answer names that ingress's TCP address (its
// IP, -advertise-tcp's port), the Global Relay carries each frame to the
// cluster relay as DATA_TCP, and the cluster relay, which has no TCP
// listener of its own, to the transceiver and back.
func TestCallOverTCPThroughGlobalRelay(t *testing.T) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, _ := token.NewKeyring(token.Key{ID: 3, Secret: secret})
	log := slog.New(slog.DiscardHandler)
	backend := httptest.NewServer(agent.NewEcho(log))
	t.Cleanup(backend.Close)
	gtab, members := &membership.Table{}, &membership.Table{}
	global, err := relay.New(relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", TCPAddr: "127.0.0.1:0", Ingress: true, Workers: 1}, keys, gtab, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = global.Close() })
	cluster, err := relay.New(relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: 5, Workers: 1,
		TrustedIngress: []string{"127.0.0.0/8"}}, keys, members, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	if err := gtab.Set(map[uint32]netip.AddrPort{5: cluster.PublicAddr()}); err != nil {
		t.Fatal(err)
	}
	trx, err := transceiver.New(transceiver.Config{
		ID: 1, Cluster: 5, ListenAddr: "127.0.0.1:0",
		Advertise:       cluster.PublicAddr().String(),
		AdvertiseTCP:    netip.AddrPortFrom(cluster.PublicAddr().Addr(), global.TCPAddr().Port()).String(),
		IngressByRegion: map[string]string{"A": global.PublicAddr().String()},
		AllowRelays:     []string{"127.0.0.0/8"},
		BackendURL:      "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
	}, keys, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = trx.Close() })
	if err := members.Set(map[uint32]netip.AddrPort{1: trx.HopAddr().(*net.UDPAddr).AddrPort()}); err != nil {
		t.Fatal(err)
	}
	sig := httptest.NewServer(trx.Handler())
	t.Cleanup(sig.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := callclient.Run(ctx, callclient.Options{URL: sig.URL + "/v1/calls", AudioPath: speech, Duration: 2 * time.Second,
		IPv4Only: true, Network: "tcp", Header: http.Header{transceiver.RegionHeader: {"A"}}})
	if err != nil || r.Transport != "tcp" || !r.AudioEchoed || !r.DataChannelEchoed {
		t.Fatalf("call: %v, transport %q\n%s", err, r.Transport, r)
	}
	gs, cs := global.Stats(), cluster.Stats()
	t.Logf("Global Relay: TCP frames %d in, %d out; cluster relay: %d hop datagrams in, %d out; client sent %d, received %d",
		gs.TCP.ToTransceiverFrames, gs.TCP.ToClientFrames, cs.ToTransceiverPackets, cs.ToClientPackets, r.PacketsSent, r.PacketsReceived)
	if gs.TCP.ToTransceiverFrames < uint64(r.PacketsSent) || gs.TCP.ToClientFrames < uint64(r.PacketsReceived) ||
		cs.ToTransceiverPackets < uint64(r.PacketsSent) || cs.ToClientPackets < uint64(r.PacketsReceived) {
		t.Fatal("the media did not go Global Relay (TCP) → cluster relay → transceiver and back")
	}
}
