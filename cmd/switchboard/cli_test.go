package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cliResult is one run of the built binary.
type cliResult struct {
	code           int
	stdout, stderr string
}

// runBinary runs bin with args and the fleet key in the environment, and
// returns its exit code and output.
func runBinary(t *testing.T, bin string, args ...string) cliResult {
	t.Helper()
	return runBinaryEnv(t, bin, nil, args...)
}

// runBinaryEnv is runBinary with env (NAME=value) added to the
// environment. A run still going after a minute, a server that started
// when it should have failed, is killed.
func runBinaryEnv(t *testing.T, bin string, env []string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "SWITCHBOARD_TOKEN_KEY=c3dpdGNoYm9hcmQtdGVzdC1mbGVldC1rZXktMzItYnl0ZXM=")
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("%q: %v", args, err)
	}
	return cliResult{cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()}
}

// TestCommandLine runs the real binary the way a user does: asking for
// help succeeds, and servers whose ports are taken fail before they log
// that they run.
func TestCommandLine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "switchboard")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}

	t.Run("help", func(t *testing.T) {
		for _, tt := range []struct {
			args   []string
			code   int
			stdout string // "" means nothing on stdout
			stderr string // "" means nothing on stderr
		}{
			{[]string{"-h"}, 0, "Usage: switchboard <command>", ""},
			{[]string{"--help"}, 0, "Usage: switchboard <command>", ""},
			{[]string{"help"}, 0, "Usage: switchboard <command>", ""},
			{[]string{"help", "relay"}, 0, "", "-public"},
			{[]string{"relay", "-h"}, 0, "", "-public"},
			{nil, 2, "", "Usage: switchboard <command>"},
			{[]string{"nosuch"}, 2, "", `unknown command "nosuch"`},
			{[]string{"version"}, 0, "switchboard ", ""},
			{[]string{"-version"}, 0, "switchboard ", ""},
			{[]string{"--version"}, 0, "switchboard ", ""},
		} {
			r := runBinary(t, bin, tt.args...)
			if r.code != tt.code ||
				!strings.Contains(r.stdout, tt.stdout) || (tt.stdout == "") != (r.stdout == "") ||
				!strings.Contains(r.stderr, tt.stderr) || (tt.stderr == "") != (r.stderr == "") {
				t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					tt.args, r.code, r.stdout, r.stderr, tt.code, tt.stdout, tt.stderr)
			}
		}
	})

	t.Run("busy ports", func(t *testing.T) {
		tcp, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer tcp.Close()
		udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer udp.Close()
		busyTCP, busyUDP := tcp.Addr().String(), udp.LocalAddr().String()
		for _, tt := range []struct {
			args          []string
			want, running string
		}{
			{[]string{"transceiver", "-id", "1", "-listen", "127.0.0.1:0", "-advertise", "127.0.0.1:3478", "-http", busyTCP},
				"switchboard transceiver: -http: listen tcp " + busyTCP, "transceiver running"},
			{[]string{"transceiver", "-id", "1", "-listen", busyUDP, "-advertise", "127.0.0.1:3478", "-http", "127.0.0.1:0"},
				"switchboard transceiver: -listen: listen " + busyUDP, "transceiver running"},
			{[]string{"relay", "-public", "127.0.0.1:0", "-internal", "127.0.0.1:0", "-members", "1=127.0.0.1:4000", "-metrics", busyTCP},
				"switchboard relay: -metrics: listen tcp " + busyTCP, "relay running"},
			{[]string{"relay", "-public", busyUDP, "-internal", "127.0.0.1:0", "-members", "1=127.0.0.1:4000", "-workers", "2", "-metrics", ""},
				"switchboard relay: -public: public socket: udpio: " + busyUDP + " is in use by another process", "relay running"},
			{[]string{"relay", "-public", "127.0.0.1:0", "-internal", "127.0.0.1:0", "-members", "1=127.0.0.1:4000", "-metrics", "", "-tcp", busyTCP},
				"switchboard relay: -tcp: TCP listener: listen tcp " + busyTCP, "relay running"},
			{[]string{"agent", "-listen", busyTCP}, "switchboard agent: -listen: listen tcp " + busyTCP, "http listening"},
			{[]string{"demo", "-http", busyTCP, "-relay", "127.0.0.1:0"},
				"the page's address (-http): listen tcp " + busyTCP, "demo running"},
			{[]string{"demo", "-http", "127.0.0.1:0", "-relay", busyUDP},
				"the relay's address (-relay): relay: public socket: udpio: " + busyUDP + " is in use by another process", "demo running"},
			// The same, for a newcomer who left the quick start's demo running.
			{[]string{"demo", "-http", busyTCP, "-relay", "127.0.0.1:0"},
				"address already in use (is a demo already running, in another terminal? Stop it, or give -http another address)", "demo running"},
			{[]string{"demo", "-http", "127.0.0.1:0", "-relay", busyUDP},
				"(is a demo already running, in another terminal? Stop it, or give -relay another address)", "demo running"},
		} {
			r := runBinary(t, bin, tt.args...)
			if r.code != 1 || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("%q: exit %d, stderr:\n%s\nwant exit 1 and %q", tt.args, r.code, r.stderr, tt.want)
			}
			if strings.Contains(r.stderr, tt.running) {
				t.Errorf("%q logged %q before failing:\n%s", tt.args, tt.running, r.stderr)
			}
		}
	})

	// A setting a newcomer gets wrong is named by the flag that fixes it,
	// in one line (not the flag package's error and then the whole usage)
	// with one "switchboard <command>: " in front.
	t.Run("setting errors", func(t *testing.T) {
		for _, tt := range []struct {
			args []string
			want string
		}{
			{[]string{"director", "-listen", "127.0.0.1:0"}, "give it with -config"},
			{[]string{"relay", "-public", "127.0.0.1:0", "-internal", "127.0.0.1:0", "-members", "1=127.0.0.1:4000", "-metrics", "", "-token-key", "abc"},
				"-token-key: secret is 2 bytes"},
			{[]string{"transceiver", "-id", "1", "-advertise", "127.0.0.1:3478", "-backend", "http://127.0.0.1:8081"}, "switchboard transceiver: backend_url (-backend) \"http://127.0.0.1:8081\" must be a ws:// or wss:// URL"},
			{[]string{"transceiver", "-id", "1", "-advertise", "127.0.0.1:3478", "-output-bitrate", "5"}, "switchboard transceiver: output_bitrate (-output-bitrate) 5 must be 6000 to 128000"},
			{[]string{"transceiver", "-advertise", "127.0.0.1:3478"}, "switchboard transceiver: id (-id) must be set"},
			{[]string{"transceiver", "-id", "1", "-advertise", "127.0.0.1:3478", "-echo-dump-dir", "/nonexistent/dumps"}, "switchboard transceiver: echo_dump_dir (-echo-dump-dir) \"/nonexistent/dumps\" must be an existing directory"},
			{[]string{"relay", "-idle-timeout", "60"}, `switchboard relay: -idle-timeout "60": not a duration: write a number with a unit, such as 60s`},
			{[]string{"relay", "-membrs", "1=127.0.0.1:4000"}, "switchboard relay: no flag -membrs (did you mean -members?); run 'switchboard relay -h' for the flags"},
			{[]string{"call", "-audoi", "x.wav", "http://127.0.0.1:1/v1/calls"}, "switchboard call: no flag -audoi (did you mean -audio?); run 'switchboard call -h' for the flags"},
			{[]string{"load", "-duration", "30", "http://127.0.0.1:1/v1/calls"}, `switchboard load: -duration "30": not a duration: write a number with a unit, such as 30s`},
			{[]string{"call", "http://127.0.0.1:1/v1/calls"}, "switchboard call: need a signaling URL and -audio FILE.wav"},
			{[]string{"load"}, "switchboard load: want one signaling URL (several: comma separated), got 0 arguments"},
		} {
			r := runBinary(t, bin, tt.args...)
			if r.code != 1 || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("%q: exit %d, stderr:\n%s\nwant exit 1 and %q", tt.args, r.code, r.stderr, tt.want)
			}
			if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n > 0 {
				t.Errorf("%q: %d lines on stderr, want the error alone:\n%s", tt.args, n+1, r.stderr)
			}
			if cmd := tt.args[0]; strings.Contains(r.stderr, cmd+": "+cmd+": ") {
				t.Errorf("%q: doubled prefix in %q", tt.args, r.stderr)
			}
		}
	})

	// One environment for every command, as an env file or a ConfigMap
	// shared by all gives: each command binds its own -listen, shown by
	// each failing on the busy address meant for it; and the shared
	// SWITCHBOARD_LISTEN is refused, naming the command's own variable,
	// before anything binds.
	t.Run("listen variables", func(t *testing.T) {
		udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer udp.Close()
		var tcp [3]net.Listener
		for i := range tcp {
			if tcp[i], err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
			defer tcp[i].Close()
		}
		hop, agentHTTP, directorHTTP, trxHTTP := udp.LocalAddr().String(), tcp[0].Addr().String(), tcp[1].Addr().String(), tcp[2].Addr().String()
		directorYAML := filepath.Join(t.TempDir(), "director.yaml")
		if err := os.WriteFile(directorYAML, []byte("default_region: a\nregions: {a: {cluster: c}}\nclusters: {c: [\"http://127.0.0.1:1\"]}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		shared := []string{
			"SWITCHBOARD_TRANSCEIVER_LISTEN=" + hop,
			"SWITCHBOARD_AGENT_LISTEN=" + agentHTTP,
			"SWITCHBOARD_DIRECTOR_LISTEN=" + directorHTTP,
		}
		for _, tt := range []struct {
			args []string
			own  string // the address of its own variable
			name string // that variable
		}{
			{[]string{"transceiver", "-id", "1", "-advertise", "127.0.0.1:3478", "-http", trxHTTP}, hop, "SWITCHBOARD_TRANSCEIVER_LISTEN"},
			{[]string{"agent"}, agentHTTP, "SWITCHBOARD_AGENT_LISTEN"},
			{[]string{"director", "-config", directorYAML}, directorHTTP, "SWITCHBOARD_DIRECTOR_LISTEN"},
		} {
			r := runBinaryEnv(t, bin, shared, tt.args...)
			if want := tt.own + ": bind"; r.code != 1 || !strings.Contains(r.stderr, want) {
				t.Errorf("%q with %v: exit %d, stderr:\n%s\nwant exit 1 and %q", tt.args, shared, r.code, r.stderr, want)
			}
			r = runBinaryEnv(t, bin, append(shared, "SWITCHBOARD_LISTEN=127.0.0.1:0"), tt.args...)
			want := "switchboard " + tt.args[0] + ": SWITCHBOARD_LISTEN is no longer read"
			if r.code != 1 || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, "set "+tt.name+" instead") {
				t.Errorf("%q with SWITCHBOARD_LISTEN: exit %d, stderr:\n%s\nwant exit 1 and %q … set %s instead", tt.args, r.code, r.stderr, want, tt.name)
			}
		}
	})
}
