package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/switchboard-rtc/switchboard/bench"
	"github.com/switchboard-rtc/switchboard/internal/setupbench"
)

// runBench is `switchboard bench relay` (the benchmark, docs/benchmarks.md)
// and `switchboard bench serve` (one system under test, started by the
// benchmark as a pinned child process).
func runBench(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || (args[0] != "relay" && args[0] != "serve" && args[0] != "setup") {
		fmt.Fprintln(os.Stderr, "usage: switchboard bench relay [-quick] [-runs N] [-systems list]\n       switchboard bench setup [-rtt 50ms] [-runs N] [-paths list] [-client pion|chromium]\n       switchboard bench serve ... (internal: a system under test)")
		return flag.ErrHelp
	}
	if args[0] == "setup" {
		return runBenchSetup(ctx, args[1:], stdout)
	}
	if args[0] == "serve" {
		return bench.Serve(ctx, args[1:], stdout)
	}
	fs := flag.NewFlagSet("bench relay", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "smoke run: one run, short steps (about a minute)")
	runs := fs.Int("runs", 0, "runs per system (median); 0 means 3, or 1 with -quick")
	systems := fs.String("systems", "", "comma-separated systems: raw, relay, relay-nobatch, relay-nolock, naive, coturn (default all)")
	sessions := fs.Int("sessions", 2000, "sessions in the voice step")
	loadCPU := fs.Int("load-cpu", 0, "CPU for the load generator")
	sutCPU := fs.Int("sut-cpu", 1, "CPU for the system under test")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	opt := bench.Defaults(*quick)
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
	opt.Serve = func(a []string) *exec.Cmd { return exec.Command(exe, append([]string{"bench", "serve"}, a...)...) }
	opt.Log = os.Stderr
	return bench.Run(ctx, opt, stdout)
}

// runBenchSetup is `switchboard bench setup`: call setup time, POST to first
// audio at the backend, over direct, relay, Global Relay and TURN paths
// with an added round-trip time (internal/setupbench).
func runBenchSetup(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench setup", flag.ContinueOnError)
	rtt := fs.Duration("rtt", 50*time.Millisecond, "round-trip time added between client and server (half each way)")
	runs := fs.Int("runs", 10, "calls per path and DTLS role (median)")
	paths := fs.String("paths", "", "comma-separated paths: direct, relay, global, turn (default all)")
	roles := fs.String("roles", "", "comma-separated transceiver DTLS roles: client, server (default both)")
	skipHVR := fs.Bool("client-skip-hello-verify", false, "the client, as DTLS server, sends no HelloVerifyRequest (as browsers)")
	client := fs.String("client", setupbench.ClientPion, "client: pion (callclient) or chromium (headless Chromium running the demo page)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts := setupbench.Options{RTT: *rtt, Runs: *runs, ClientSkipHelloVerify: *skipHVR, Client: *client,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if *paths != "" {
		opts.Paths = strings.Split(*paths, ",")
	}
	if *roles != "" {
		opts.DTLSRoles = strings.Split(*roles, ",")
	}
	res, err := setupbench.Run(ctx, opts)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, setupbench.Markdown(res, opts))
	return err
}
