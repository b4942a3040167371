package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestLogDurations: both log formats write a duration as a readable string
// ("30s"), at the top level and inside a group, never as nanoseconds.
func TestLogDurations(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLoggerTo(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.With("idle_timeout", 1500*time.Millisecond).WithGroup("relay").Info("started", "timeout", 30*time.Second, "workers", 2)
	var rec struct {
		IdleTimeout any `json:"idle_timeout"`
		Relay       struct {
			Timeout any `json:"timeout"`
			Workers any `json:"workers"`
		} `json:"relay"`
	}
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	if rec.IdleTimeout != "1.5s" || rec.Relay.Timeout != "30s" {
		t.Errorf("durations logged as %#v and %#v, want \"1.5s\" and \"30s\": %s", rec.IdleTimeout, rec.Relay.Timeout, buf.Bytes())
	}
	if rec.Relay.Workers != float64(2) {
		t.Errorf("an int logged as %#v, want the number 2", rec.Relay.Workers)
	}

	buf.Reset()
	if log, err = newLoggerTo(&buf, "text", "info"); err != nil {
		t.Fatal(err)
	}
	log.Info("started", "timeout", 30*time.Second)
	if !strings.Contains(buf.String(), "timeout=30s") {
		t.Errorf("text log %q, want timeout=30s", buf.String())
	}
}
