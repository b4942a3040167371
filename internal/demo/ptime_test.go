package demo

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestPtimeSetting: the demo hands its ptime to the transceiver: 10 starts,
// and a value the transceiver does not take fails Start with the
// transceiver's error, which names the setting, before any part listens.
func TestPtimeSetting(t *testing.T) {
	d, err := Start(Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), Ptime: 10})
	if err != nil {
		t.Fatalf("ptime 10: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	if _, err := Start(Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(&logged, nil)), Ptime: 15}); err == nil || !strings.Contains(err.Error(), "ptime") {
		t.Fatalf("ptime 15: %v, want an error naming ptime", err)
	}
	if logged.Len() != 0 {
		t.Errorf("ptime 15: the demo started parts before refusing it:\n%s", logged.String())
	}
}
