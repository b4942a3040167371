// Command trxbench runs `bench transceiver` (package trxbench) until
// cmd/switchboard-bench hooks it in: it builds the switchboard binary once
// and prints the Markdown table on stdout, progress on stderr.
//
//	go run ./bench/transceiver/cmd -steps 50,100,200 -runs 3 -pprof /tmp/prof
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	trxbench "github.com/switchboard-rtc/switchboard/bench/transceiver"
)

func main() {
	var opt trxbench.Options
	steps := flag.String("steps", "50,100,200", "session counts N, rising, comma separated")
	flag.IntVar(&opt.Runs, "runs", 3, "fresh runs (medians)")
	flag.DurationVar(&opt.Window, "window", 10*time.Second, "measurement window per N")
	flag.DurationVar(&opt.Ramp, "ramp", 20*time.Millisecond, "delay between session starts")
	flag.IntVar(&opt.TrxCPU, "trx-cpu", 1, "core of the transceiver")
	flag.IntVar(&opt.GenCPU, "gen-cpu", 0, "core of the generator, relay and agent")
	flag.StringVar(&opt.ProfileDir, "pprof", "", "directory for the transceiver's CPU and heap profiles at the largest N of run 1")
	flag.StringVar(&opt.Bin, "bin", "", "switchboard binary (default: build ./cmd/switchboard)")
	jsonOut := flag.String("json", "", "also write the result as JSON to this file")
	trxArgs := flag.String("trx-args", "", "extra transceiver flags, space separated")
	flag.Parse()
	for _, s := range strings.Split(*steps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintf(os.Stderr, "trxbench: -steps: %v\n", err)
			os.Exit(2)
		}
		opt.Steps = append(opt.Steps, n)
	}
	if *trxArgs != "" {
		opt.TrxArgs = strings.Fields(*trxArgs)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if opt.Bin == "" {
		dir, err := os.MkdirTemp("", "trxbench-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "trxbench:", err)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
		opt.Bin = filepath.Join(dir, "switchboard")
		build := exec.Command("go", "build", "-o", opt.Bin, "./cmd/switchboard")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "trxbench: building switchboard (run from the repository root):", err)
			os.Exit(1)
		}
	}
	opt.Log = os.Stderr
	res, err := trxbench.Run(ctx, opt)
	if err != nil {
		fmt.Fprintln(os.Stderr, "trxbench:", err)
	}
	if len(res.Steps) > 0 {
		fmt.Print(trxbench.Markdown(res, opt))
		if *jsonOut != "" {
			b, _ := json.MarshalIndent(res, "", "  ")
			_ = os.WriteFile(*jsonOut, b, 0o644)
		}
	}
	if err != nil {
		os.Exit(1)
	}
}
