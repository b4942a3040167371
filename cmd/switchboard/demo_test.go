package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestDemoPprof: `switchboard demo -pprof` serves Go's profiles at
// /debug/pprof/ on the demo's HTTP address.
func TestDemoPprof(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- runDemo(ctx, []string{"-http", addr, "-relay", "127.0.0.1:0", "-pprof", "-log-level", "error"}, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/debug/pprof/")
		if err != nil {
			last = err.Error()
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.Contains(string(body), "Types of profiles") {
			return
		}
		last = resp.Status
	}
	t.Fatalf("GET /debug/pprof/ on the demo's address with -pprof: %s", last)
}
