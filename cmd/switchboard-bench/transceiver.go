package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	trxbench "github.com/switchboard-rtc/switchboard/bench/transceiver"
)

// runBenchTransceiver is `switchboard-bench transceiver`: what one voice
// session costs a transceiver (CPU, memory, goroutines, delay inside), with
// agent, relay and a pinned transceiver as processes of one switchboard
// binary and `switchboard load` driving N sessions (bench/transceiver),
// for Opus passthrough and PCM sessions (-format).
// Without -bin it builds ./cmd/switchboard, so run it from the repository
// root. The Markdown table goes to stdout, progress to stderr.
func runBenchTransceiver(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var opt trxbench.Options
	fs := newFlagSet("transceiver", stderr)
	steps := fs.String("steps", "50,100,200", "session counts N, rising, comma separated")
	formats := fs.String("format", "opus/48000/2,pcm16/24000/1", "bridge formats the echo agent asks for, comma separated, each measured with its own processes: opus/48000/2 (Opus passthrough), pcm16/24000/1, pcm16/16000/1 (the transceiver decodes, encodes and paces)")
	fs.IntVar(&opt.Runs, "runs", 3, "fresh runs (medians)")
	fs.DurationVar(&opt.Window, "window", 10*time.Second, "measurement window per N")
	fs.DurationVar(&opt.Ramp, "ramp", 20*time.Millisecond, "delay between session starts")
	fs.IntVar(&opt.TrxCPU, "trx-cpu", 1, "core of the transceiver")
	fs.IntVar(&opt.GenCPU, "gen-cpu", 0, "core of the generator, relay and agent")
	fs.StringVar(&opt.ProfileDir, "pprof", "", "directory for the transceiver's CPU and heap profiles at the largest N of run 1")
	fs.StringVar(&opt.Bin, "bin", "", "switchboard binary (default: build ./cmd/switchboard)")
	jsonOut := fs.String("json", "", "also write the result as JSON to this file")
	trxArgs := fs.String("trx-args", "", "extra transceiver flags, space separated")
	fs.Func("gen-arg", "an extra flag of the load generator, switchboard load (repeat for more), e.g. -gen-arg=-audio=speech.wav: sessions send that speech, looped, instead of counter payloads", func(v string) error {
		opt.GenArgs = append(opt.GenArgs, v)
		return nil
	})
	fs.Func("agent-arg", "an extra flag of the echo agent (repeat for more), e.g. -agent-arg=-turn-detection='{...}' (docs/benchmarks.md: input cleaning)", func(v string) error {
		opt.AgentArgs = append(opt.AgentArgs, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, s := range strings.Split(*steps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-steps: %q is not a positive session count", s)
		}
		opt.Steps = append(opt.Steps, n)
	}
	for _, f := range strings.Split(*formats, ",") {
		opt.Formats = append(opt.Formats, strings.TrimSpace(f))
	}
	if *trxArgs != "" {
		opt.TrxArgs = strings.Fields(*trxArgs)
	}
	if opt.Bin == "" {
		dir, err := os.MkdirTemp("", "trxbench-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		opt.Bin = filepath.Join(dir, "switchboard")
		build := exec.CommandContext(ctx, "go", "build", "-o", opt.Bin, "./cmd/switchboard")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building ./cmd/switchboard (run from the repository root, or pass -bin): %w", err)
		}
	}
	opt.Log = os.Stderr
	res, err := trxbench.Run(ctx, opt)
	if len(res.Steps) > 0 {
		if _, werr := io.WriteString(stdout, trxbench.Markdown(res, opt)); werr != nil && err == nil {
			err = werr
		}
		if *jsonOut != "" {
			b, jerr := json.MarshalIndent(res, "", "  ")
			if jerr == nil {
				jerr = os.WriteFile(*jsonOut, b, 0o644)
			}
			if jerr != nil && err == nil {
				err = jerr
			}
		}
	}
	return err
}
