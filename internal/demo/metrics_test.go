package demo

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/relay"
)

// TestMetricsEndpoint: the demo serves the relay's metrics at /metrics on its
// web port, every drop reason exported from the start.
func TestMetricsEndpoint(t *testing.T) {
	d, err := Start(Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	resp, err := http.Get(d.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %v %v", resp.Status, err)
	}
	text := string(body)
	want := []string{
		`switchboard_relay_packets_total{direction="to_client"} 0`,
		`switchboard_relay_bytes_total{direction="to_transceiver"} 0`,
		`switchboard_relay_flows{state="pending"} 0`,
		`switchboard_relay_flows_created_total 0`,
	}
	for r := relay.DropReason(1); r < relay.NumDropReasons; r++ {
		want = append(want, `switchboard_relay_drops_total{reason="`+r.String()+`"} 0`)
	}
	// The transceiver's hop counters, by reason, present before any traffic.
	for _, r := range []string{"not_hop", "untrusted", "too_big", "send_failed"} {
		want = append(want, `switchboard_transceiver_hop_dropped_total{reason="`+r+`"} 0`)
	}
	for r := peer.MoveReason(0); r < peer.NumMoveReasons; r++ {
		want = append(want, `switchboard_transceiver_peer_moves_total{reason="`+r.String()+`"} 0`)
	}
	for _, w := range want {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("/metrics lacks %s", w)
		}
	}
}

// TestPprof: with Pprof the demo serves Go's profiles at /debug/pprof/ on
// its web address; without it, nothing there.
func TestPprof(t *testing.T) {
	for _, on := range []bool{true, false} {
		d, err := Start(Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), Pprof: on})
		if err != nil {
			t.Fatal(err)
		}
		for path, want := range map[string]string{
			"/debug/pprof/":                  "Types of profiles",
			"/debug/pprof/goroutine?debug=1": "goroutine profile:",
			"/debug/pprof/cmdline":           os.Args[0],
		} {
			resp, err := http.Get(d.URL() + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			served := resp.StatusCode == http.StatusOK && strings.Contains(string(body), want)
			if served != on {
				t.Errorf("pprof %v: GET %s: %d, served %v", on, path, resp.StatusCode, served)
			}
		}
		_ = d.Close()
	}
}
