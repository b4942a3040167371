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

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/director"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// globalTopology is two regions (A, B), each with a Global Relay, and two
// clusters (1, 2), each with a relay and two transceivers; a director sends
// region A to cluster 1 and region B to cluster 2.
type globalTopology struct {
	ingress  map[string]*relay.Relay // by region
	relays   map[uint16]*relay.Relay // by cluster
	trx      map[uint16][]*transceiver.Server
	director *httptest.Server
}

func startGlobal(t *testing.T) *globalTopology {
	t.Helper()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, _ := token.NewKeyring(token.Key{ID: 2, Secret: secret})
	log := slog.New(slog.DiscardHandler)
	backend := httptest.NewServer(agent.NewEcho(log))
	t.Cleanup(backend.Close)
	g := &globalTopology{ingress: map[string]*relay.Relay{}, relays: map[uint16]*relay.Relay{}, trx: map[uint16][]*transceiver.Server{}}

	// Global Relays first: cluster relays trust their internal addresses.
	ingressTables := map[string]*membership.Table{}
	for _, region := range []string{"A", "B"} {
		tab := &membership.Table{}
		r, err := relay.New(relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Ingress: true, Workers: 1}, keys, tab, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		g.ingress[region], ingressTables[region] = r, tab
	}
	ingressByRegion := map[string]string{"A": g.ingress["A"].PublicAddr().String(), "B": g.ingress["B"].PublicAddr().String()}
	clusterRelays := map[uint32]netip.AddrPort{}
	signaling := map[string][]string{}
	for _, cl := range []uint16{1, 2} {
		members := &membership.Table{}
		r, err := relay.New(relay.Config{
			PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: cl, Workers: 1,
			TrustedIngress: []string{"127.0.0.0/8"},
		}, keys, members, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		g.relays[cl] = r
		clusterRelays[uint32(cl)] = r.PublicAddr()
		entries := map[uint32]netip.AddrPort{}
		for id := uint32(1); id <= 2; id++ {
			trx, err := transceiver.New(transceiver.Config{
				ID: id, Cluster: cl, ListenAddr: "127.0.0.1:0",
				Advertise:       r.PublicAddr().String(),
				IngressByRegion: ingressByRegion,
				AllowRelays:     []string{"127.0.0.0/8"},
				BackendURL:      "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
			}, keys, nil, log)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = trx.Close() })
			g.trx[cl] = append(g.trx[cl], trx)
			entries[id] = trx.HopAddr().(*net.UDPAddr).AddrPort()
			srv := httptest.NewServer(trx.Handler())
			t.Cleanup(srv.Close)
			name := map[uint16]string{1: "c1", 2: "c2"}[cl]
			signaling[name] = append(signaling[name], srv.URL)
		}
		if err := members.Set(entries); err != nil {
			t.Fatal(err)
		}
	}
	for _, tab := range ingressTables {
		if err := tab.Set(clusterRelays); err != nil {
			t.Fatal(err)
		}
	}
	d, err := director.New(director.Config{
		RegionHeader:  "X-Test-Region",
		Regions:       map[string]director.Region{"A": {Cluster: "c1"}, "B": {Cluster: "c2"}},
		DefaultRegion: "A",
		Clusters:      signaling,
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	g.director = httptest.NewServer(d.Handler())
	t.Cleanup(g.director.Close)
	return g
}

// TestGlobalRelay: each session lands in its region's cluster, its media
// enters at its region's Global Relay, and audio round-trips through
// Global Relay → cluster relay → transceiver → echo agent and back.
func TestGlobalRelay(t *testing.T) {
	g := startGlobal(t)
	tests := []struct {
		region  string
		cluster uint16
		restart bool // restart ICE mid-call: the PATCH goes through the director
	}{
		{"A", 1, false},
		{"B", 2, false},
		{"A", 1, true},
	}
	for _, tt := range tests {
		name := tt.region
		if tt.restart {
			name += "/ice-restart"
		}
		t.Run(name, func(t *testing.T) {
			g.waitQuiet(t) // the previous call's teardown packets are counted before the snapshot
			before := map[string]relay.Stats{"A": g.ingress["A"].Stats(), "B": g.ingress["B"].Stats()}
			beforeCl := map[uint16]relay.Stats{1: g.relays[1].Stats(), 2: g.relays[2].Stats()}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			opts := callclient.Options{
				URL: g.director.URL + "/v1/calls", AudioPath: speech, Duration: time.Second, IPv4Only: true,
				Header: http.Header{"X-Test-Region": {tt.region}},
			}
			if tt.restart {
				opts.Duration, opts.ICERestartAfter = 3*time.Second, time.Second
			}
			report, err := callclient.Run(ctx, opts)
			if err != nil || !report.AudioEchoed || report.PayloadMismatches != 0 || !report.DataChannelEchoed {
				t.Fatalf("call from region %s: %v\n%s", tt.region, err, report)
			}
			if rr := report.ICERestart; tt.restart && (rr == nil || rr.Error != "" || rr.ResumedMS == 0) {
				t.Fatalf("ICE restart through the director and the Global Relay: %+v", rr)
			}
			other := map[string]string{"A": "B", "B": "A"}[tt.region]
			otherCl := map[uint16]uint16{1: 2, 2: 1}[tt.cluster]
			in := g.ingress[tt.region].Stats().ToTransceiverPackets - before[tt.region].ToTransceiverPackets
			out := g.ingress[tt.region].Stats().ToClientPackets - before[tt.region].ToClientPackets
			if in < uint64(report.PacketsSent) || out < uint64(report.PacketsReceived) {
				t.Fatalf("region %s ingress forwarded %d in / %d out, client sent %d and received %d",
					tt.region, in, out, report.PacketsSent, report.PacketsReceived)
			}
			if g.ingress[other].Stats().ToTransceiverPackets != before[other].ToTransceiverPackets {
				t.Fatalf("media entered at the other region's ingress %s", other)
			}
			if got := g.relays[tt.cluster].Stats().ToTransceiverPackets - beforeCl[tt.cluster].ToTransceiverPackets; got < uint64(report.PacketsSent) {
				t.Fatalf("cluster %d relay forwarded %d packets, client sent %d", tt.cluster, got, report.PacketsSent)
			}
			if g.relays[otherCl].Stats().ToTransceiverPackets != beforeCl[otherCl].ToTransceiverPackets {
				t.Fatalf("media reached the other cluster %d", otherCl)
			}
			for _, trx := range g.trx[tt.cluster] {
				if hs := trx.HopStats(); hs.DroppedNotHop != 0 || hs.DroppedUntrusted != 0 {
					t.Fatalf("transceiver hop drops: %+v", hs)
				}
			}
		})
	}
}

// waitQuiet waits until no relay's counters change for 300 ms.
func (g *globalTopology) waitQuiet(t *testing.T) {
	t.Helper()
	total := func() (n uint64) {
		for _, r := range g.ingress {
			st := r.Stats()
			n += st.ToTransceiverPackets + st.ToClientPackets
		}
		for _, r := range g.relays {
			st := r.Stats()
			n += st.ToTransceiverPackets + st.ToClientPackets
		}
		return n
	}
	deadline := time.Now().Add(10 * time.Second)
	for last := total(); time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		if now := total(); now == last {
			return
		} else {
			last = now
		}
	}
	t.Fatal("relays never went quiet")
}
