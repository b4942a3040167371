package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
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
			// The command binds the address itself: one picked free may
			// be taken before it does, and then it returns at once with
			// the bind error, and another is picked.
			for attempt := 1; pprofStatus(t, tt.run, tt.args, tt.want); attempt++ {
				if attempt == 5 {
					t.Fatalf("the address picked was taken %d times", attempt)
				}
			}
		})
	}
}

// pprofStatus runs run on a loopback address picked free, with the
// arguments args gives for it, and fails the test unless GET
// /debug/pprof/ answers want there within 10 s. busy reports instead that
// run returned because the address was taken before it bound it.
func pprofStatus(t *testing.T, run func(ctx context.Context, args []string, stdout io.Writer) error,
	args func(addr string) []string, want int) (busy bool) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, append(args(addr), "-log-level", "error"), io.Discard) }()
	returned := false
	defer func() {
		cancel()
		if !returned {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			returned = true
			if errors.Is(err, syscall.EADDRINUSE) {
				return true
			}
			t.Fatalf("returned before it served: %v", err)
		default:
		}
		resp, err := http.Get("http://" + addr + "/debug/pprof/")
		if err != nil {
			last = err.Error()
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ok := resp.StatusCode == want
		if want == http.StatusOK {
			ok = ok && strings.Contains(string(body), "Types of profiles")
		}
		if ok {
			return false
		}
		last = resp.Status
	}
	t.Fatalf("GET /debug/pprof/: %s, want %d", last, want)
	return false
}
