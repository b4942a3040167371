package demo

import (
	"log/slog"
	"strings"
	"testing"
)

// TestPtimeSetting: the demo hands its ptime to the transceiver: 10 starts,
// and a value the transceiver does not take fails Start with the
// transceiver's error, which names the setting.
func TestPtimeSetting(t *testing.T) {
	d, err := Start(Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), Ptime: 10})
	if err != nil {
		t.Fatalf("ptime 10: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), Ptime: 15}); err == nil || !strings.Contains(err.Error(), "ptime") {
		t.Fatalf("ptime 15: %v, want an error naming ptime", err)
	}
}
