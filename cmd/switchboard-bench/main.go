// Command switchboard-bench runs Switchboard's benchmarks. It is a tool
// for developers, built apart from the server binary (cmd/switchboard) so
// that the image shipped to production links no load generator, no coturn
// launcher and no browser driver:
//
//	switchboard-bench relay   the relay against a raw UDP loop, a naive Go proxy and coturn
//	switchboard-bench setup   call setup time, POST to first audio at the backend, per path
//	switchboard-bench transceiver   what a session costs a transceiver: CPU, memory, goroutines, delay inside
//	switchboard-bench voice   turn-taking heard in a browser: reply and barge-in latency
//	switchboard-bench serve   (internal) one system under test, started by `relay` as a child
//
// Results and how to read them are in docs/benchmarks.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func usage() {
	fmt.Fprintln(os.Stderr, `Usage: switchboard-bench <benchmark> [flags]

Benchmarks:
  relay   the relay against a raw UDP loop, a naive Go proxy and coturn (-quick: about a minute)
  setup   call setup time over direct, relay, Global Relay and TURN paths
  transceiver   CPU, memory, goroutines and delay inside per session, N sessions as real processes
  voice   turn-taking in headless Chromium: speech end to reply, barge-in to silence (edge vs backend)

Run 'switchboard-bench <benchmark> -h' for its flags; docs/benchmarks.md has the results.`)
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runBench(ctx, os.Args[1:], os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "switchboard-bench %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
