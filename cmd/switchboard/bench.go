package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/switchboard-rtc/switchboard/bench"
)

// runBench is `switchboard bench relay` (the benchmark, docs/benchmarks.md)
// and `switchboard bench serve` (one system under test, started by the
// benchmark as a pinned child process).
func runBench(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || (args[0] != "relay" && args[0] != "serve") {
		fmt.Fprintln(os.Stderr, "usage: switchboard bench relay [-quick] [-runs N] [-systems list]\n       switchboard bench serve ... (internal: a system under test)")
		return flag.ErrHelp
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
