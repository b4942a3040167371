package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/config"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(cleanupAfter{m}) }

// cleanupAfter runs the tests, then removes what they left for each
// other (the binary testBinary built).
type cleanupAfter struct{ m *testing.M }

func (c cleanupAfter) Run() int {
	defer removeBuilt()
	return c.m.Run()
}

// freeUDP returns a loopback UDP address that was free a moment ago.
func freeUDP(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

// child is a process of the binary under test.
type child struct {
	cmd    *exec.Cmd
	log    *logbuf.Buffer
	exited chan struct{}
}

// startChild runs bin with args and env added to the test's environment,
// and stops it when the test ends.
func startChild(t *testing.T, bin string, env []string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(bin, args...), log: &logbuf.Buffer{}, exited: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(c.stop)
	return c
}

// stop interrupts the process (a graceful stop), kills it 5 s later if it
// is still running, and waits for it.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// bound waits for the start-up log line msg and returns its address
// fields keys, in order: the addresses the process bound, when it was
// given port 0. busy reports instead that the process exited because an
// address it was given was in use; the test fails on any other exit.
func (c *child) bound(t *testing.T, msg string, keys ...string) (addrs []string, busy bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if a, ok := c.log.JSONField(msg, keys[0]); ok {
			addrs = append(addrs, a)
			for _, k := range keys[1:] {
				a, _ := c.log.JSONField(msg, k)
				addrs = append(addrs, a)
			}
			return addrs, false
		}
		select {
		case <-c.exited:
			if strings.Contains(c.log.String(), "address already in use") {
				return nil, true
			}
			t.Fatalf("%q exited before it logged %q:\n%s", c.cmd.Args, msg, c.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q did not log %q in 20 s:\n%s", c.cmd.Args, msg, c.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitHTTP(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never answered", url)
}

// TestSeparateProcesses runs agent, transceiver and relay as three
// processes of the real binary, configured by flags, environment and a
// YAML file, and places a call through them with `switchboard call`.
func TestSeparateProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "switchboard")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	t.Run("static membership", func(t *testing.T) { separateProcesses(t, bin, "") })
	t.Run("redis membership", func(t *testing.T) { separateProcesses(t, bin, redistest.Start(t).Addr) })
}

// separateProcesses runs the parts as processes; with redisAddr the relay
// learns the transceiver from the Redis registry instead of -members.
func separateProcesses(t *testing.T, bin, redisAddr string) {
	key := "c3dpdGNoYm9hcmQtdGVzdC1mbGVldC1rZXktMzItYnl0ZXM="
	var logs []*logbuf.Buffer
	defer func() {
		if t.Failed() {
			for _, l := range logs {
				t.Log(l.String())
			}
		}
	}()
	keyEnv := []string{"SWITCHBOARD_TOKEN_KEY=" + key}
	var trxExtra []string
	if redisAddr != "" {
		trxExtra = []string{"-redis", redisAddr}
	}
	// Each process binds port 0 and logs what it bound, except the relay's
	// public address: the transceiver advertises it before the relay
	// starts (the relay needs the transceiver's hop address first), so it
	// is picked free beforehand, and the two start again on another port
	// if a third process took it in between.
	agent := startChild(t, bin, nil, "agent", "-mode", "echo", "-listen", "127.0.0.1:0")
	logs = append(logs, agent.log)
	a, _ := agent.bound(t, "http listening", "addr")
	agentHTTP := a[0]
	var trxHTTP, relayOps string
	for attempt := 1; ; attempt++ {
		public := freeUDP(t)
		trx := startChild(t, bin, keyEnv, append([]string{"transceiver", "-id", "7", "-listen", "127.0.0.1:0",
			"-advertise", public, "-backend", "ws://" + agentHTTP + "/v1/bridge", "-http", "127.0.0.1:0"}, trxExtra...)...)
		logs = append(logs, trx.log)
		a, _ := trx.bound(t, "transceiver running", "hop", "http")
		trxHop := a[0]
		trxHTTP = a[1]

		relayYAML := filepath.Join(t.TempDir(), "relay.yaml")
		members := "members: 7=" + trxHop
		if redisAddr != "" {
			members = "membership: redis\nredis: " + redisAddr
		}
		if err := os.WriteFile(relayYAML, []byte(fmt.Sprintf(
			"public_addr: %s\ninternal_addr: 127.0.0.1:0\n%s\nworkers: 2\n", public, members)), 0o600); err != nil {
			t.Fatal(err)
		}
		relay := startChild(t, bin, keyEnv, "relay", "-config", relayYAML, "-metrics", "127.0.0.1:0")
		logs = append(logs, relay.log)
		if _, busy := relay.bound(t, "relay running", "public"); busy {
			if attempt == 5 {
				t.Fatalf("the relay's public address was taken %d times", attempt)
			}
			relay.stop()
			trx.stop()
			continue
		}
		a, _ = relay.bound(t, "http listening", "addr")
		relayOps = a[0]
		break
	}
	waitHTTP(t, "http://"+agentHTTP+"/live")
	waitHTTP(t, "http://"+trxHTTP+"/live")
	waitHTTP(t, "http://"+relayOps+"/live")

	out, err := exec.Command(bin, "call", "http://"+trxHTTP+"/v1/calls", "-audio", "../../testdata/speech.wav",
		"-duration", "1s", "-ipv4").Output()
	if err != nil {
		t.Fatalf("call: %v\n%s", err, out)
	}
	var report struct {
		PacketsSent       int  `json:"packets_sent"`
		AudioEchoed       bool `json:"audio_echoed"`
		DataChannelEchoed bool `json:"data_channel_echoed"`
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if !report.AudioEchoed || !report.DataChannelEchoed || report.PacketsSent == 0 {
		t.Fatalf("call through separate processes failed:\n%s", out)
	}
	resp, err := http.Get("http://" + relayOps + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var metrics bytes.Buffer
	_, _ = metrics.ReadFrom(resp.Body)
	if !strings.Contains(metrics.String(), `switchboard_relay_packets_total{direction="to_client"}`) {
		t.Fatalf("relay metrics lack packet counters:\n%s", metrics.String())
	}
}

// TestCallArgs: the call subcommand takes its URL before, between or after
// the flags, and exactly one.
func TestCallArgs(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.wav")
	for _, args := range [][]string{
		{"http://127.0.0.1:1/v1/calls", "-audio", missing},
		{"-audio", missing, "http://127.0.0.1:1/v1/calls"},
		{"-ice-restart-after", "2s", "http://127.0.0.1:1/v1/calls", "-audio", missing},
	} {
		var stdout strings.Builder
		err := runCall(context.Background(), args, &stdout)
		// Parsing succeeded when the call gets as far as reading the WAV.
		if err == nil || !strings.Contains(err.Error(), "none.wav") {
			t.Errorf("call %q: %v, want the missing WAV reported (flags and URL parsed)", args, err)
		}
		// A usage error prints no report: there was no call.
		if stdout.Len() > 0 {
			t.Errorf("call %q printed a report for a usage error:\n%s", args, stdout.String())
		}
	}
	err := runCall(context.Background(), []string{"http://a/v1/calls", "http://b/v1/calls", "-audio", missing}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "one signaling URL") {
		t.Errorf("two URLs: %v", err)
	}
}

// TestServerCommandsHaveFlagSets: each flag set package config builds (and
// deploy/ checks the chart against) is a subcommand of this binary.
func TestServerCommandsHaveFlagSets(t *testing.T) {
	have := map[string]bool{}
	for _, c := range commands {
		have[c.name] = true
	}
	for name := range config.FlagSets() {
		if !have[name] {
			t.Errorf("config has flags of %q, which is no subcommand", name)
		}
	}
}
