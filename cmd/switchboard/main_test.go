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

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func freeUDP(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

func freeTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
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
	agentHTTP, trxHTTP, relayOps := freeTCP(t), freeTCP(t), freeTCP(t)
	public, internal, trxHop := freeUDP(t), freeUDP(t), freeUDP(t)

	relayYAML := filepath.Join(t.TempDir(), "relay.yaml")
	members := "members: 7=" + trxHop
	var trxExtra []string
	if redisAddr != "" {
		members = "membership: redis\nredis: " + redisAddr
		trxExtra = []string{"-redis", redisAddr}
	}
	if err := os.WriteFile(relayYAML, []byte(fmt.Sprintf(
		"public_addr: %s\ninternal_addr: %s\n%s\nworkers: 2\n", public, internal, members)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs []*logbuf.Buffer
	start := func(env []string, args ...string) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), env...)
		buf := &logbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = buf, buf
		logs = append(logs, buf)
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	}
	defer func() {
		if t.Failed() {
			for _, l := range logs {
				t.Log(l.String())
			}
		}
	}()
	start(nil, "agent", "-mode", "echo", "-listen", agentHTTP)
	start([]string{"SWITCHBOARD_TOKEN_KEY=" + key}, append([]string{"transceiver", "-id", "7", "-listen", trxHop,
		"-advertise", public, "-backend", "ws://" + agentHTTP + "/v1/bridge", "-http", trxHTTP}, trxExtra...)...)
	start([]string{"SWITCHBOARD_TOKEN_KEY=" + key}, "relay", "-config", relayYAML, "-metrics", relayOps)
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
