package main

import (
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestRelayDrainsTCP: `switchboard relay -tcp` on SIGTERM fails /ready,
// refuses new ICE-TCP connections and keeps the open one until it ends,
// then exits.
func TestRelayDrainsTCP(t *testing.T) {
	bin := testBinary(t)
	env := []string{"SWITCHBOARD_TOKEN_KEY=c3dpdGNoYm9hcmQtdGVzdC1mbGVldC1rZXktMzItYnl0ZXM="}
	relay := startChild(t, bin, env, "relay", "-public", "127.0.0.1:0", "-internal", "127.0.0.1:0", "-tcp", "127.0.0.1:0",
		"-members", "1=127.0.0.1:9", "-metrics", "127.0.0.1:0", "-drain-timeout", "20s")
	a, _ := relay.bound(t, "relay running", "tcp")
	tcpAddr := a[0]
	a, _ = relay.bound(t, "http listening", "addr")
	ops := "http://" + a[0]
	waitHTTP(t, ops+"/ready")
	open, err := net.Dial("tcp", tcpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	time.Sleep(100 * time.Millisecond) // accepted
	if err := relay.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(ops + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready did not fail while draining (last: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c, err := net.Dial("tcp", tcpAddr); err == nil {
		c.Close()
		t.Fatal("a draining relay accepted a new ICE-TCP connection")
	}
	select {
	case <-relay.exited:
		t.Fatal("the relay exited with an ICE-TCP connection open")
	case <-time.After(300 * time.Millisecond):
	}
	// The connection stays open until its first-frame timeout (5 s) or
	// its client closes it: the client closes.
	open.Close()
	select {
	case <-relay.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not exit after its last ICE-TCP connection ended")
	}
}
