// Command switchboard is the one Switchboard binary. Each subcommand runs
// one part:
//
//	switchboard demo          relay + transceiver + parrot agent (-mode echo: echo) + web page, on loopback
//	switchboard relay         the UDP relay (public VIP:port ⇄ internal hop)
//	switchboard transceiver   the WebRTC endpoint and signaling API
//	switchboard agent         the reference backend: parrot (turn-taking) or echo
//	switchboard director      the signaling front door: region → cluster
//	switchboard call URL      a Pion client that runs one session and prints JSON
//	switchboard load URL      many concurrent sessions: setup, failures, loss, gaps as JSON
//	switchboard version       the version, commit and Go version it was built with
//
// Run `switchboard <command> -h` for each one's flags. Every flag of the
// servers (not of the clients call and load) can also be set in a YAML
// file (-config) or as SWITCHBOARD_<FLAG> in the environment (-mode and
// -listen, which mean something else in each command:
// SWITCHBOARD_<COMMAND>_MODE, SWITCHBOARD_<COMMAND>_LISTEN); flags win
// over the environment, which wins over the file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchboard-rtc/switchboard/internal/httpapi"
)

var commands = []struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout io.Writer) error
}{
	{"demo", "run relay, transceiver, the parrot agent and the web page in one process", runDemo},
	{"relay", "run a relay", runRelay},
	{"transceiver", "run a transceiver (WebRTC endpoint and signaling)", runTransceiver},
	{"agent", "run a reference agent (a bridge backend): parrot or echo", runAgent},
	{"director", "run the signaling director (routes offers to a region's cluster)", runDirector},
	{"call", "run one call against a signaling URL and print a JSON report", runCall},
	{"load", "run many concurrent calls against a signaling URL and print a JSON summary", runLoad},
	{"version", "print the version, the commit it was built from and the Go version", runVersion},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Switchboard: a WebRTC edge for real-time voice AI.")
	fmt.Fprintln(w, "\nUsage: switchboard <command> [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'switchboard <command> -h' for a command's flags.")
}

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		usage(os.Stderr)
		os.Exit(2)
	}
	switch args[0] {
	case "-version", "--version":
		args[0] = "version"
	case "-h", "-help", "--help", "help":
		if len(args) == 1 || args[0] != "help" {
			usage(os.Stdout)
			os.Exit(0)
		}
		args = []string{args[1], "-h"} // switchboard help relay = switchboard relay -h
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], os.Stdout)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "switchboard %s: %s\n", c.name, errorLine(c.name, err))
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "switchboard: unknown command %q\n\n", args[0])
	usage(os.Stderr)
	os.Exit(2)
}

// errorLine is err as the command's failure line prints it after
// "switchboard <name>: ": without the "<name>: " that the command's own
// package puts in front of its errors ("transceiver: backend_url …"), so
// that no prefix is doubled.
func errorLine(name string, err error) string {
	msg := err.Error()
	for strings.HasPrefix(msg, name+": ") {
		msg = strings.TrimPrefix(msg, name+": ")
	}
	if name == "call" || name == "load" {
		msg = strings.TrimPrefix(msg, "callclient: ") // their package, which the user does not know
	}
	return msg
}

// newLogger returns a JSON or text slog logger at the given level that
// writes to stderr.
func newLogger(format, level string) (*slog.Logger, error) {
	return newLoggerTo(os.Stderr, format, level)
}

// newLoggerTo is newLogger writing to w.
func newLoggerTo(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationString}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want json or text", format)
}

// durationString logs a time.Duration as its String form ("30s", "1.5ms"),
// which the JSON handler would otherwise write as integer nanoseconds.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// handleOps mounts /metrics, and /debug/pprof/ when pprof is set, on mux.
func handleOps(mux *http.ServeMux, reg *prometheus.Registry, pprofOn bool) {
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if pprofOn {
		httpapi.HandlePprof(mux)
	}
}
