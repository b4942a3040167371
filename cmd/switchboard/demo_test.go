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

// TestPprof: `switchboard demo -pprof` and `switchboard agent -pprof`
// serve Go's profiles at /debug/pprof/ on their HTTP address; without
// -pprof the agent answers 404 there.
func TestPprof(t *testing.T) {
	for _, tt := range []struct {
		name string
		run  func(ctx context.Context, args []string, stdout io.Writer) error
		args func(addr string) []string
		want int
	}{
		{"demo -pprof", runDemo, func(a string) []string { return []string{"-http", a, "-relay", "127.0.0.1:0", "-pprof"} }, http.StatusOK},
		{"agent -pprof", runAgent, func(a string) []string { return []string{"-listen", a, "-pprof"} }, http.StatusOK},
		{"agent", runAgent, func(a string) []string { return []string{"-listen", a} }, http.StatusNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- tt.run(ctx, append(tt.args(addr), "-log-level", "error"), io.Discard) }()
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
				ok := resp.StatusCode == tt.want
				if tt.want == http.StatusOK {
					ok = ok && strings.Contains(string(body), "Types of profiles")
				}
				if ok {
					return
				}
				last = resp.Status
			}
			t.Fatalf("GET /debug/pprof/: %s, want %d", last, tt.want)
		})
	}
}
