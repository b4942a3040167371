package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	relaybench "github.com/switchboard-rtc/switchboard/bench/relay"
	"github.com/switchboard-rtc/switchboard/bench/setup"
	voicebench "github.com/switchboard-rtc/switchboard/bench/voice"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// runBenchVoice is `switchboard-bench voice`: turn-taking latency heard in
// headless Chromium, barge-in at the edge against the backend's own VAD
// (bench/voice).
func runBenchVoice(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("voice", stderr)
	rtt := fs.Duration("rtt", 50*time.Millisecond, "round-trip time added between the browser and the relay (half each way)")
	cycles := fs.Int("cycles", 20, "script cycles per mode; each has two user turns, the second over the agent's reply")
	modes := fs.String("modes", "", "comma-separated: edge, edge-hint, backend, tentative, resume (default edge,backend); edge-hint is edge with the page's receiver given -jitter-buffer-target; tentative is edge with the early pause (-pause); resume is edge with resume_false_interruption and the idle timeout (-idle-timeout), on a script with coughs and backchannels over the replies")
	jbt := fs.Duration("jitter-buffer-target", 0, "RTCRtpReceiver.jitterBufferTarget the page sets in mode edge-hint")
	ptimes := fs.String("ptime", "20", "comma-separated transceiver -ptime values (10, 20) each mode runs with, e.g. 20,10 to compare them")
	rounds := fs.Int("rounds", 1, "run every mode at every ptime, in turn, this many times (-cycles each); rows pool their rounds, so compared configurations share the machine's load")
	jsonOut := fs.String("json", "", "also write every measurement (per turn, per run) as JSON to this file")
	replyDelay := fs.Duration("reply-delay", 0, "the parrot answers each turn this long after its event, as a real pipeline's latency (e.g. 400ms)")
	pause := fs.Int("pause", voicebench.DefaultPauseMs, "pause_duration_ms, ms, in mode tentative")
	idle := fs.Duration("idle-timeout", voicebench.DefaultIdleTimeout, "idle_timeout_ms in mode resume")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var pts []int
	for f := range strings.SplitSeq(*ptimes, ",") {
		pt, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || (pt != 10 && pt != 20) {
			return fmt.Errorf("-ptime %q: want 10 or 20, comma-separated", f)
		}
		pts = append(pts, pt)
	}
	if *rtt < 0 {
		return errors.New("-rtt must not be negative")
	}
	if *jbt < 0 || *jbt > 4*time.Second {
		return errors.New("-jitter-buffer-target must be from 0 to 4s (the range RTCRtpReceiver.jitterBufferTarget takes)")
	}
	if *replyDelay < 0 {
		return errors.New("-reply-delay must not be negative")
	}
	if td := (vad.TurnDetection{Type: vad.TypeServerVAD, SilenceDurationMs: vad.DefaultSilenceDurationMs, PauseDurationMs: *pause, IdleTimeoutMs: int(idle.Milliseconds())}); *pause <= 0 || td.Validate() != nil {
		return fmt.Errorf("-pause %d, -idle-timeout %v: %v (the pause must be positive)", *pause, *idle, td.Validate())
	}
	opts := voicebench.Options{RTT: *rtt, Cycles: *cycles, JitterBufferTarget: *jbt, Ptimes: pts, Rounds: *rounds,
		ReplyDelay: *replyDelay, PauseMs: *pause, IdleTimeout: *idle,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if *modes != "" {
		opts.Modes = strings.Split(*modes, ",")
	}
	res, err := voicebench.Run(ctx, opts)
	if err != nil {
		return err
	}
	res.Markdown(stdout)
	if *jsonOut != "" {
		b, err := json.MarshalIndent(res, "", " ")
		if err != nil {
			return err
		}
		return os.WriteFile(*jsonOut, b, 0o644)
	}
	return nil
}

// errUnknownBench is runBench's error for a benchmark name it lacks.
var errUnknownBench = errors.New("unknown benchmark")

// runBench is `switchboard-bench relay` (the benchmark, docs/benchmarks.md),
// `switchboard-bench setup`, `switchboard-bench transceiver`,
// `switchboard-bench voice` and `switchboard-bench serve` (one system under
// test, started by the relay benchmark as a pinned child process).
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch args[0] {
	case "relay", "serve":
	case "setup":
		return runBenchSetup(ctx, args[1:], stdout, stderr)
	case "transceiver":
		return runBenchTransceiver(ctx, args[1:], stdout, stderr)
	case "voice":
		return runBenchVoice(ctx, args[1:], stdout, stderr)
	default:
		return fmt.Errorf("%w %q", errUnknownBench, args[0])
	}
	if args[0] == "serve" {
		return relaybench.Serve(ctx, args[1:], stdout)
	}
	fs := newFlagSet("relay", stderr)
	quick := fs.Bool("quick", false, "smoke run: one run, short steps (about a minute)")
	runs := fs.Int("runs", 0, "runs per system (median); 0 means 3, or 1 with -quick")
	systems := fs.String("systems", "", "comma-separated systems: raw, raw-nolock, relay, relay-nobatch, naive, coturn (default all)")
	sessions := fs.Int("sessions", 2000, "sessions in the voice step")
	loadCPU := fs.Int("load-cpu", 0, "CPU for the load generator")
	sutCPU := fs.Int("sut-cpu", 1, "CPU for the system under test")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	opt := relaybench.Defaults(*quick)
	if *runs > 0 {
		opt.Runs = *runs
	}
	if *systems != "" {
		opt.Systems = strings.Split(*systems, ",")
	}
	if *sessions < 1 {
		return errors.New("-sessions must be positive")
	}
	opt.Sessions, opt.LoadCPU, opt.SUTCPU = *sessions, *loadCPU, *sutCPU
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	opt.Serve = func(a []string) *exec.Cmd { return exec.Command(exe, append([]string{"serve"}, a...)...) }
	opt.Log = os.Stderr
	return relaybench.Run(ctx, opt, stdout)
}

// runBenchSetup is `switchboard-bench setup`: call setup time, POST to first
// audio at the backend, over direct, relay, Global Relay, ICE-TCP and TURN paths
// with an added round-trip time (bench/setup).
func runBenchSetup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("setup", stderr)
	rtt := fs.Duration("rtt", 50*time.Millisecond, "round-trip time added between client and server (half each way)")
	runs := fs.Int("runs", 10, "calls per client, path, DTLS role and version (median)")
	paths := fs.String("paths", "", "comma-separated paths: direct, relay, global, tcp (ICE-TCP through the relay), turn (default all)")
	roles := fs.String("roles", "", "comma-separated transceiver DTLS roles: client, server (default both)")
	skipHVR := fs.Bool("client-skip-hello-verify", false, "the client, as DTLS server, sends no HelloVerifyRequest (as browsers)")
	client := fs.String("client", setupbench.ClientPion, "comma-separated clients, measured in one run: pion (callclient), chromium (headless Chromium running the demo page), chromium-sped (the same with its WebRTC-IceHandshakeDtls field trial: DTLS 1.3 in the ICE checks), chromium-sped-nopq (also without its post-quantum key share) or firefox (headless Firefox ESR running it, in a network namespace: needs root)")
	versions := fs.String("dtls-versions", "", "comma-separated transceiver -dtls-version settings: 1.2, 1.3 (default the transceiver's)")
	loss := fs.Float64("loss", 0, "probability (0-1) that the media proxy drops a datagram, each way")
	dropFlight := fs.String("drop-flight", "", "drop each call's first DTLS datagram: to_client or to_server (not on the turn path)")
	audio := fs.Duration("audio", 300*time.Millisecond, "audio the Pion client sends per call (longer under loss: see bench/setup Options.Audio)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts := setupbench.Options{RTT: *rtt, Runs: *runs, ClientSkipHelloVerify: *skipHVR, Clients: strings.Split(*client, ","), Loss: *loss, DropFlight: *dropFlight, Audio: *audio,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if *paths != "" {
		opts.Paths = strings.Split(*paths, ",")
	}
	if *roles != "" {
		opts.DTLSRoles = strings.Split(*roles, ",")
	}
	if *versions != "" {
		opts.DTLSVersions = strings.Split(*versions, ",")
	}
	res, err := setupbench.Run(ctx, opts)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, setupbench.Markdown(res, opts))
	return err
}
