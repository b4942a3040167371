// Package e2e runs whole calls across separately constructed parts (relay,
// transceiver, echo agent, each with its own sockets and HTTP servers) over
// real loopback sockets, with real clients: Pion, and in the *_browser_test
// files headless Chromium, Firefox ESR and GStreamer against the demo
// (internal/demo) as a fixture, some in network namespaces. Whole calls
// across the parts and every browser test live here; a package's own
// tests stay with it, and the binary's command line is tested in
// cmd/switchboard (docs/design.md §8.2).
package e2e

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const speech = "../../../testdata/speech.wav"

// stack is one relay, one transceiver and one echo agent, wired as in
// production but on loopback.
type stack struct {
	keys      *token.Keyring
	members   *membership.Table
	reg       *prometheus.Registry // the transceiver's metrics
	relay     *relay.Relay
	trx       *transceiver.Server
	signaling *httptest.Server
}

func startStack(t *testing.T, trxID uint32) *stack {
	t.Helper()
	return startStackWithLog(t, trxID, slog.New(slog.DiscardHandler))
}

func startStackWithLog(t *testing.T, trxID uint32, log *slog.Logger) *stack {
	t.Helper()
	return startStackFront(t, trxID, log, nil)
}

// startStackFront is startStack with front, if not nil, called with the
// relay's public address to return the address clients are told to use
// (a proxy in front of the relay).
func startStackFront(t *testing.T, trxID uint32, log *slog.Logger, front func(netip.AddrPort) netip.AddrPort) *stack {
	t.Helper()
	return startStackTCP(t, trxID, log, front, false)
}

// startStackTCP is startStackFront with, if tcp, the relay's ICE-TCP
// listener on and the answers' passive TCP candidate naming it.
func startStackTCP(t *testing.T, trxID uint32, log *slog.Logger, front func(netip.AddrPort) netip.AddrPort, tcp bool) *stack {
	t.Helper()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, err := token.NewKeyring(token.Key{ID: 1, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewServer(agent.NewEcho(log))
	t.Cleanup(backend.Close)

	members := &membership.Table{}
	reg := prometheus.NewRegistry()
	rcfg := relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: 4, Workers: 2}
	if tcp {
		rcfg.TCPAddr = "127.0.0.1:0"
	}
	rly, err := relay.New(rcfg, keys, members, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rly.Close() })
	var advertiseTCP string
	if tcp {
		advertiseTCP = rly.TCPAddr().String()
	}
	internal := rly.InternalAddr().Addr()
	advertise := rly.PublicAddr()
	if front != nil {
		advertise = front(advertise)
	}
	trx, err := transceiver.New(transceiver.Config{
		ID:           trxID,
		Cluster:      4,
		ListenAddr:   "127.0.0.1:0",
		Advertise:    advertise.String(),
		AdvertiseTCP: advertiseTCP,
		AllowRelays:  []string{netip.PrefixFrom(internal, 32).String()},
		BackendURL:   "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
	}, keys, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = trx.Close() })
	if err := members.Set(map[uint32]netip.AddrPort{trxID: trx.HopAddr().(*net.UDPAddr).AddrPort()}); err != nil {
		t.Fatal(err)
	}
	sig := httptest.NewServer(trx.Handler())
	t.Cleanup(sig.Close)
	return &stack{keys: keys, members: members, reg: reg, relay: rly, trx: trx, signaling: sig}
}

// TestCallThroughRelay sends speech as Opus from a Pion client through the
// relay and transceiver to the echo agent and back.
func TestCallThroughRelay(t *testing.T) {
	s := startStack(t, 77)

	// A client that ignores the answer and sends straight to the
	// transceiver's own port must get nowhere.
	direct, err := net.DialUDP("udp4", nil, s.trx.HopAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	req := stun.MustBuild(stun.TransactionID, stun.BindingRequest, stun.NewUsername("x:y"))
	if _, err := direct.Write(req.Raw); err != nil {
		t.Fatal(err)
	}
	_ = direct.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	report, err := callclient.Run(ctx, callclient.Options{
		URL:       s.signaling.URL + "/v1/calls",
		AudioPath: speech,
		Duration:  2 * time.Second,
		IPv4Only:  true,
	})
	if err != nil {
		t.Fatalf("call: %v\n%s", err, report)
	}
	t.Logf("report: %s", report)

	// The echoed Opus payloads match the ones sent.
	if !report.AudioEchoed || report.PayloadMismatches != 0 || report.PacketsSent < 90 {
		t.Fatalf("audio not echoed intact: sent %d, received %d, mismatches %d",
			report.PacketsSent, report.PacketsReceived, report.PayloadMismatches)
	}
	for i, p := range report.ReceivedPayloads {
		if len(p) == 0 {
			t.Fatalf("received payload %d is empty", i)
		}
	}
	// A data-channel message is echoed.
	if !report.DataChannelEchoed {
		t.Fatal("data-channel message not echoed")
	}

	// The transceiver received no client packet except through the relay:
	// every datagram its socket accepted carried a hop header from the
	// relay's internal address; the direct probe was dropped.
	hs := s.trx.HopStats()
	rs := s.relay.Stats()
	if hs.DroppedNotHop != 1 || hs.DroppedUntrusted != 0 {
		t.Fatalf("hop stats %+v: want exactly the one direct probe dropped", hs)
	}
	if hs.Received == 0 || hs.Received > rs.ToTransceiverPackets {
		t.Fatalf("transceiver got %d datagrams, relay forwarded %d", hs.Received, rs.ToTransceiverPackets)
	}
	if rs.ToClientPackets < uint64(report.PacketsReceived) {
		t.Fatalf("relay sent %d packets to clients, client received %d audio packets", rs.ToClientPackets, report.PacketsReceived)
	}

	// The transceiver measured each setup phase once, and the client's
	// RTCP receiver reports reached the quality metrics.
	counts := histogramCounts(t, s.reg)
	for _, name := range []string{
		`switchboard_transceiver_setup_seconds{phase="ice"}`,
		`switchboard_transceiver_setup_seconds{phase="dtls"}`,
		`switchboard_transceiver_setup_seconds{phase="first_audio"}`,
		`switchboard_transceiver_setup_phase_seconds{phase="check"}`,
		`switchboard_transceiver_setup_phase_seconds{phase="dtls"}`,
		`switchboard_transceiver_setup_phase_seconds{phase="first_audio"}`,
		`switchboard_transceiver_bridge_dial_seconds`,
	} {
		if counts[name] != 1 {
			t.Errorf("%s observed %d times, want 1", name, counts[name])
		}
	}
	if counts["switchboard_transceiver_loss_ratio"] == 0 || counts["switchboard_transceiver_jitter_seconds"] == 0 {
		t.Errorf("no RTCP receiver report reached the quality metrics: %v", counts)
	}
	t.Logf("RTT samples from RTCP: %d", counts["switchboard_transceiver_rtt_seconds"])

	// Hanging up ended the session on the transceiver.
	deadline := time.Now().Add(5 * time.Second)
	for s.trx.Sessions() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := s.trx.Sessions(); n != 0 {
		t.Fatalf("%d sessions still live after hangup", n)
	}
	// A normal hangup is not a backend bridge error.
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "switchboard_transceiver_bridge_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("bridge errors %v = %v after a normal call", m.GetLabel(), v)
			}
		}
	}
}

// TestConcurrentCalls runs several sessions at once through one relay and
// one transceiver: each client's media stays its own.
func TestConcurrentCalls(t *testing.T) {
	s := startStack(t, 5)
	const n = 4
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	type result struct {
		r   callclient.Report
		err error
	}
	results := make(chan result, n)
	for range n {
		go func() {
			r, err := callclient.Run(ctx, callclient.Options{
				URL: s.signaling.URL + "/v1/realtime/calls", AudioPath: speech, Duration: time.Second, IPv4Only: true,
			})
			results <- result{r, err}
		}()
	}
	for range n {
		res := <-results
		if res.err != nil || !res.r.AudioEchoed || res.r.PayloadMismatches != 0 || !res.r.DataChannelEchoed {
			t.Errorf("call: %v\n%s", res.err, res.r)
		}
	}
}

// TestDirectMode runs a call with the transceiver's socket facing the
// client, no relay: the single-host setup and the latency baseline.
func TestDirectMode(t *testing.T) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, _ := token.NewKeyring(token.Key{Secret: secret})
	log := slog.New(slog.DiscardHandler)
	backend := httptest.NewServer(agent.NewEcho(log))
	defer backend.Close()
	trx, err := transceiver.New(transceiver.Config{
		ID: 1, Direct: true, ListenAddr: "127.0.0.1:0",
		BackendURL: "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
	}, keys, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	defer trx.Close()
	sig := httptest.NewServer(trx.Handler())
	defer sig.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	report, err := callclient.Run(ctx, callclient.Options{URL: sig.URL + "/v1/calls", AudioPath: speech, Duration: time.Second, IPv4Only: true})
	if err != nil || !report.AudioEchoed || !report.DataChannelEchoed || report.PayloadMismatches != 0 {
		t.Fatalf("direct call: %v\n%s", err, report)
	}
}

// histogramCounts returns the sample count of every histogram in reg, keyed
// by name and labels as in the exposition format.
func histogramCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetHistogram() == nil {
				continue
			}
			name := mf.GetName()
			if lp := m.GetLabel(); len(lp) > 0 {
				var parts []string
				for _, l := range lp {
					parts = append(parts, l.GetName()+`="`+l.GetValue()+`"`)
				}
				name += "{" + strings.Join(parts, ",") + "}"
			}
			out[name] = m.GetHistogram().GetSampleCount()
		}
	}
	return out
}

// callResult is the outcome of a call run in the background.
type callResult struct {
	r   callclient.Report
	err error
}

// callInBackground starts a call of the given length through s and
// returns once the relay has forwarded 100 packets to the client (the call
// is under way), with a channel that yields the call's outcome.
func callInBackground(t *testing.T, s *stack, d time.Duration) <-chan callResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	done := make(chan callResult, 1)
	go func() {
		defer cancel()
		r, err := callclient.Run(ctx, callclient.Options{URL: s.signaling.URL + "/v1/calls", AudioPath: speech, Duration: d, IPv4Only: true})
		done <- callResult{r, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s.relay.Stats().ToClientPackets < 100 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return done
}
