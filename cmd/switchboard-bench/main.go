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
	"io"
	"os"
	"os/signal"
	"syscall"
)

// benchmarks are the benchmarks usage lists, in its order, with what each
// measures.
var benchmarks = []struct{ name, about string }{
	{"relay", "the relay against a raw UDP loop, a naive Go proxy and coturn (-quick: about a minute)"},
	{"setup", "call setup time over direct, relay, Global Relay, ICE-TCP and TURN paths"},
	{"transceiver", "CPU, memory, goroutines and delay inside per session, N sessions as real processes"},
	{"voice", "turn-taking in headless Chromium: speech end to reply, barge-in to silence (edge vs backend; tentative turns, false interruptions, idle timeouts)"},
}

func usage(w io.Writer) {
	fmt.Fprint(w, "Usage: switchboard-bench <benchmark> [flags]\n\nBenchmarks:\n")
	for _, b := range benchmarks {
		fmt.Fprintf(w, "  %-12s %s\n", b.name, b.about)
	}
	fmt.Fprintln(w, "\nRun 'switchboard-bench <benchmark> -h' for its flags; docs/benchmarks.md has the results.")
}

// newFlagSet returns the flag set of benchmark name, writing errors and
// its -h to stderr: the command line, what it measures, then the flags.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: switchboard-bench %s [flags]\n\n", name)
		for _, b := range benchmarks {
			if b.name == name {
				fmt.Fprintf(stderr, "Measures %s; docs/benchmarks.md has the results.\n\n", b.about)
			}
		}
		fmt.Fprintln(stderr, "Flags:")
		fs.PrintDefaults()
	}
	return fs
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the benchmark args name and returns the exit code: 0 for help
// (usage on stdout), 2 for no or an unknown benchmark, 1 when it fails.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	}
	err := runBench(ctx, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errUnknownBench) {
		fmt.Fprintf(stderr, "switchboard-bench: %v\n\n", err)
		usage(stderr)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "switchboard-bench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
