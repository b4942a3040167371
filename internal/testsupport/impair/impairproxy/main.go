// Command impairproxy runs an internal/testsupport/impair UDP proxy in a
// process of its own, for tests that must not pay the race detector on
// every datagram (the chaos suite builds it without it): from -listen to
// -target, with -loss, -dup, -reorder and -delay on each direction. Once
// it listens it logs the address it bound (a JSON line on stderr, msg
// "impairproxy listening", field addr: what a harness that gave it port 0
// sends to). On SIGINT or SIGTERM it prints the proxy's counters (impair.Stats) as one
// JSON object on stdout and exits.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/impair"
)

func main() {
	var cfg impair.Config
	listen := flag.String("listen", "127.0.0.1:0", "UDP address clients send to")
	target := flag.String("target", "", "UDP address the proxy forwards to (required)")
	seed := flag.Uint64("seed", 1, "random seed of the impairment")
	flag.Float64Var(&cfg.Loss, "loss", 0, "probability a datagram is dropped, per direction")
	flag.Float64Var(&cfg.Duplicate, "dup", 0, "probability a datagram is sent twice")
	flag.Float64Var(&cfg.Reorder, "reorder", 0, "probability a datagram is held back so later ones overtake it")
	flag.DurationVar(&cfg.Delay, "delay", 0, "one-way delay")
	flag.Parse()
	to, err := netip.ParseAddrPort(*target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "impairproxy: -target:", err)
		os.Exit(2)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	p, err := impair.NewUDP(*listen, to, cfg, *seed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "impairproxy:", err)
		os.Exit(1)
	}
	slog.New(slog.NewJSONHandler(os.Stderr, nil)).Info("impairproxy listening", "addr", p.Addr().String())
	<-stop
	_ = p.Close()
	_ = json.NewEncoder(os.Stdout).Encode(p.Stats())
}
