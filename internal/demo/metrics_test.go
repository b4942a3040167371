package demo

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

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
	for _, w := range want {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("/metrics lacks %s", w)
		}
	}
}
