package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
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

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("a: from-file\nb: from-file\nc: from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		A string `yaml:"a"`
		B string `yaml:"b"`
		C string `yaml:"c"`
		D string `yaml:"d"`
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.StringVar(&cfg.A, "a", "default", "")
	fs.StringVar(&cfg.B, "b", "default", "")
	fs.StringVar(&cfg.C, "c", "default", "")
	fs.StringVar(&cfg.D, "d", "default", "")
	t.Setenv("SWITCHBOARD_A", "from-env")
	t.Setenv("SWITCHBOARD_B", "from-env")
	if err := parseConfig(fs, []string{"-config", file, "-a", "from-flag"}, &cfg); err != nil {
		t.Fatal(err)
	}
	want := [4]string{"from-flag", "from-env", "from-file", "default"}
	if got := [4]string{cfg.A, cfg.B, cfg.C, cfg.D}; got != want {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestConfigFromEnvironment: SWITCHBOARD_CONFIG names the file as -config
// does, and -config on the command line wins over it.
func TestConfigFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	envFile, flagFile := filepath.Join(dir, "env.yaml"), filepath.Join(dir, "flag.yaml")
	if err := os.WriteFile(envFile, []byte("a: from-env-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flagFile, []byte("a: from-flag-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SWITCHBOARD_CONFIG", envFile)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"environment", nil, "from-env-file"},
		{"flag wins", []string{"-config", flagFile}, "from-flag-file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var cfg struct {
				A string `yaml:"a"`
			}
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.StringVar(&cfg.A, "a", "default", "")
			if err := parseConfig(fs, tt.args, &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.A != tt.want {
				t.Fatalf("a = %q, want %q", cfg.A, tt.want)
			}
		})
	}
}

// TestUsageListsFileOnlySettings: -h shows the settings only the YAML file
// sets, after the flags.
func TestUsageListsFileOnlySettings(t *testing.T) {
	var out strings.Builder
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.String("a", "", "flag a")
	err := parseConfig(fs, []string{"-h"}, &struct{}{}, yamlOnly{"regions", "region name → cluster"})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if u := out.String(); !strings.Contains(u, "-a") || !strings.Contains(u, "only in the YAML file") || !strings.Contains(u, "regions") || strings.Index(u, "regions") < strings.Index(u, "-a") {
		t.Fatalf("usage:\n%s", u)
	}
}

func TestParseConfigErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("nosuchkey: 1\n"), 0o600)
	tests := []struct {
		name    string
		args    []string
		mention string
	}{
		{"unknown yaml key", []string{"-config", bad}, "nosuchkey"},
		{"missing file", []string{"-config", filepath.Join(dir, "none.yaml")}, "none.yaml"},
		{"stray argument", []string{"extra"}, "extra"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg struct {
				A string `yaml:"a"`
			}
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.StringVar(&cfg.A, "a", "", "")
			err := parseConfig(fs, tt.args, &cfg)
			if err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %v does not mention %q", err, tt.mention)
			}
		})
	}
}

func TestKeyConfigErrors(t *testing.T) {
	tests := []struct {
		name    string
		k       KeyConfig
		mention string
	}{
		{"missing", KeyConfig{}, "SWITCHBOARD_TOKEN_KEY"},
		{"not base64", KeyConfig{Key: "!!!"}, "hex or base64"},
		{"short", KeyConfig{Key: "AAAA"}, "at least 16"},
		{"id too large", KeyConfig{Key: strings.Repeat("ab", 32), KeyID: 99}, "0-63"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.k.keyring()
			if err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %v does not mention %q", err, tt.mention)
			}
		})
	}
}

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
	start(nil, "agent", "-listen", agentHTTP)
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
