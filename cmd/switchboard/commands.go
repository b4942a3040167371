package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/config"
	"github.com/switchboard-rtc/switchboard/internal/demo"
	"github.com/switchboard-rtc/switchboard/internal/flowstore"
	"github.com/switchboard-rtc/switchboard/internal/httpapi"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

func runDemo(ctx context.Context, args []string, _ io.Writer) error {
	var cfg config.Demo
	if err := config.Parse(cfg.Flags(), args, &cfg); err != nil {
		return err
	}
	log, err := newLogger(cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		return err
	}
	d, err := demo.Start(demo.Config{HTTPAddr: cfg.HTTP, RelayAddr: cfg.Relay, NoTCP: !cfg.TCP, Logger: log, Pprof: cfg.Log.Pprof, Agent: cfg.Mode, Ptime: cfg.Ptime})
	if err != nil {
		return err
	}
	relayLine := fmt.Sprintf("Relay UDP %s", d.RelayAddr())
	if a := d.RelayTCPAddr(); a.IsValid() {
		relayLine += fmt.Sprintf(", ICE-TCP %s", a)
	}
	fmt.Fprintf(os.Stderr, "\n  Switchboard demo: open %s in a browser and click Call.\n  %s. Ctrl-C to stop.\n\n", d.URL(), relayLine)
	werr := d.Wait(ctx)
	if cerr := d.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

// serverSetup builds what every server holding the fleet key needs: its
// logger, token keyring and metrics registry.
func serverSetup(l config.Log, k config.Keys) (*slog.Logger, *token.Keyring, *prometheus.Registry, error) {
	log, err := newLogger(l.Format, l.Level)
	if err != nil {
		return nil, nil, nil, err
	}
	keys, err := k.Keyring()
	if err != nil {
		return nil, nil, nil, err
	}
	return log, keys, newRegistry(), nil
}

// newRegistry returns a registry with the Go and process collectors. The
// Go collector adds to its defaults go_gc_heap_live_bytes (runtime/metrics
// /gc/heap/live:bytes): the heap the last GC found live, which unlike
// go_memstats_heap_alloc_bytes leaves out what was allocated since, so
// that after a forced GC it measures what a process keeps.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{Matcher: heapLiveMetric})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// heapLiveMetric selects runtime/metrics' /gc/heap/live:bytes for the Go
// collector.
var heapLiveMetric = regexp.MustCompile(`^/gc/heap/live:bytes$`)

// serveHTTP serves h on addr within lim until ctx ends, then shuts down
// gracefully (httpapi.Server.Run). reg, if not nil, gets the server's
// connection metrics.
func serveHTTP(ctx context.Context, addr string, h http.Handler, lim httpapi.Limits, reg prometheus.Registerer, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return serveListener(ctx, ln, h, lim, reg, log)
}

// serveListener is serveHTTP on a listener the caller bound already (so
// that a busy port fails the command before it logs that it runs). It
// closes ln.
func serveListener(ctx context.Context, ln net.Listener, h http.Handler, lim httpapi.Limits, reg prometheus.Registerer, log *slog.Logger) error {
	srv, err := httpapi.NewServer(ln, h, lim, reg, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	log.Info("http listening", "addr", ln.Addr().String(), "max_conns", srv.MaxConns())
	return srv.Run(ctx)
}

// signalingLimits are the connection caps of a server that clients call
// (a transceiver's or director's signaling): httpapi's defaults, and
// httpapi.DefaultMaxConnsPerSource per client address except from
// loopback (a sidecar proxy) and the trusted proxies (prefixes, valid:
// the component's config checked them).
func signalingLimits(trusted []string) httpapi.Limits {
	lim := httpapi.Limits{Name: "signaling", PerSource: httpapi.DefaultMaxConnsPerSource, Exempt: httpapi.Loopback()}
	for _, p := range trusted {
		if pfx, err := netip.ParsePrefix(strings.TrimSpace(p)); err == nil {
			lim.Exempt = append(lim.Exempt, pfx.Masked())
		}
	}
	return lim
}

func runRelay(ctx context.Context, args []string, _ io.Writer) error {
	var cfg config.Relay
	if err := config.Parse(cfg.Flags(), args, &cfg); err != nil {
		return err
	}
	log, keys, reg, err := serverSetup(cfg.Log, cfg.Keys)
	if err != nil {
		return err
	}
	members, stopMembers, err := relayMembership(ctx, cfg.Source, cfg.Members, cfg.Relay.Cluster, reg, log)
	if err != nil {
		return err
	}
	defer stopMembers()
	if cfg.FlowCache != "" {
		fc, err := flowstore.New(cfg.FlowCache, cfg.Relay.Cluster)
		if err != nil {
			return err
		}
		defer fc.Close()
		flowstore.LogRedisTo(log) // go-redis's per-dial lines at Debug; the relay warns once per interval
		cfg.Relay.FlowStore = fc
	}
	r, err := relay.New(cfg.Relay, keys, members, reg, log)
	if err != nil {
		return err
	}
	defer r.Close()
	var ops net.Listener
	if cfg.Metrics != "" {
		if ops, err = net.Listen("tcp", cfg.Metrics); err != nil {
			return err
		}
	}
	log.Info("relay running", "public", r.PublicAddr().String(), "internal", r.InternalAddr().String(), "tcp", r.TCPAddr().String(), "members", members.Len())
	if !r.TCPAddr().IsValid() {
		return serveOps(ctx, ops, reg, cfg.Log.Pprof, r.Ready, log)
	}
	// With ICE-TCP, drain on SIGTERM: keep serving (and failing /ready)
	// while the open connections' calls go on, up to -drain-timeout.
	opsCtx, stopOps := context.WithCancel(context.Background())
	defer stopOps()
	opsErr := make(chan error, 1)
	go func() { opsErr <- serveOps(opsCtx, ops, reg, cfg.Log.Pprof, r.Ready, log) }()
	select {
	case err := <-opsErr:
		return err
	case <-ctx.Done():
	}
	log.Info("draining", "tcp_connections", r.Stats().TCP.Open, "timeout", cfg.Drain)
	dctx, cancel := context.WithTimeout(context.Background(), cfg.Drain)
	left := r.Drain(dctx)
	cancel()
	log.Info("drained", "tcp_connections_left", left)
	stopOps()
	return <-opsErr
}

// serveOps serves /metrics, /live and /ready on ln until ctx ends, or
// just waits if ln is nil. /ready answers 503 with ready's error while
// it returns one.
func serveOps(ctx context.Context, ln net.Listener, reg *prometheus.Registry, pprofOn bool, ready func() error, log *slog.Logger) error {
	if ln == nil {
		<-ctx.Done()
		return nil
	}
	mux := http.NewServeMux()
	handleOps(mux, reg, pprofOn)
	mux.HandleFunc("/live", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return serveListener(ctx, ln, mux, httpapi.Limits{Name: "ops"}, reg, log)
}

func runTransceiver(ctx context.Context, args []string, _ io.Writer) error {
	var cfg config.Transceiver
	if err := config.Parse(cfg.Flags(), args, &cfg); err != nil {
		return err
	}
	if cfg.Proxy != "" {
		cfg.Trx.TrustedProxies = strings.Split(cfg.Proxy, ",")
	}
	if cfg.Allow != "" {
		cfg.Trx.AllowRelays = strings.Split(cfg.Allow, ",")
	}
	log, keys, reg, err := serverSetup(cfg.Log, cfg.Keys)
	if err != nil {
		return err
	}
	t, err := transceiver.New(cfg.Trx, keys, reg, log)
	if err != nil {
		return err
	}
	defer t.Close()
	ln, err := net.Listen("tcp", cfg.HTTP)
	if err != nil {
		return err
	}
	defer ln.Close() // serveListener closes it too; this covers the returns before it runs
	log.Info("transceiver running", "id", cfg.Trx.ID, "hop", t.HopAddr().String(), "http", ln.Addr().String(), "advertise", cfg.Trx.Advertise,
		"auth", cfg.Trx.Auth.Enabled())
	if cfg.Redis != "" {
		hopAddr := t.HopAddr().(*net.UDPAddr).AddrPort()
		if cfg.HopAd != "" {
			if hopAddr, err = netip.ParseAddrPort(cfg.HopAd); err != nil {
				return fmt.Errorf("-hop-advertise %q: want ip:port", cfg.HopAd)
			}
		}
		rc := redis.NewClient(&redis.Options{Addr: cfg.Redis})
		defer rc.Close()
		registration, err := membership.RegisterRedis(ctx, rc, cfg.Trx.Cluster, cfg.Trx.ID, hopAddr, 0, log)
		if registration == nil {
			return err
		}
		if err != nil {
			log.Warn("first registration in redis failed; retrying in the background", "err", err)
		}
		// Deregistered after the drain: live sessions still need relays to find us.
		defer registration.Close()
	}
	mux := http.NewServeMux()
	handleOps(mux, reg, cfg.Log.Pprof)
	mux.Handle("/", t.Handler())
	// Keep serving while draining, so that /ready fails and offers get 503.
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()
	httpErr := make(chan error, 1)
	go func() { httpErr <- serveListener(httpCtx, ln, mux, signalingLimits(cfg.Trx.TrustedProxies), reg, log) }()
	select {
	case err := <-httpErr:
		return err
	case <-ctx.Done():
	}
	log.Info("draining", "sessions", t.Sessions(), "timeout", cfg.Drain)
	dctx, cancel := context.WithTimeout(context.Background(), cfg.Drain)
	ended := t.Drain(dctx)
	cancel()
	log.Info("drained", "sessions_ended", ended)
	stopHTTP()
	return <-httpErr
}

func runAgent(ctx context.Context, args []string, _ io.Writer) error {
	var cfg config.Agent
	if err := config.Parse(cfg.Flags(), args, &cfg); err != nil {
		return err
	}
	log, err := newLogger(cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		return err
	}
	backend, err := agent.NewMode(cfg.Mode, cfg.Format, log)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/bridge", backend)
	mux.HandleFunc("/live", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	if cfg.Log.Pprof {
		httpapi.HandlePprof(mux)
	}
	// Transceivers hold one bridge connection per v1 session, or a few v2
	// ones: no cap but the descriptors'.
	return serveHTTP(ctx, cfg.Listen, mux, httpapi.Limits{Name: "bridge", MaxConns: -1}, nil, log)
}

func runCall(ctx context.Context, args []string, stdout io.Writer) error {
	var opts callclient.Options
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: switchboard call URL -audio FILE.wav [flags]\n\nRuns one session against the signaling URL (e.g. http://127.0.0.1:8080/v1/calls),\nsends the file as Opus, and prints a JSON report. The report checks an echo:\ncall an echo backend (switchboard demo -mode echo, switchboard agent -mode echo);\nagainst the parrot, audio_echoed and data_channel_echoed are false.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.StringVar(&opts.AudioPath, "audio", "", "16-bit PCM WAV file to send (required)")
	fs.DurationVar(&opts.Duration, "duration", 0, "how much audio to send (0 = the whole file; longer loops it)")
	fs.DurationVar(&opts.Timeout, "timeout", 0, "bound on the whole call (0 = audio length + 15s)")
	fs.StringVar(&opts.AuthToken, "token", "", "bearer token for signaling")
	fs.BoolVar(&opts.IPv4Only, "ipv4", false, "gather IPv4 candidates only")
	fs.StringVar(&opts.Network, "network", "udp", "candidates to gather: udp, tcp (ICE-TCP only, as from a network that drops UDP) or any")
	fs.DurationVar(&opts.ICERestartAfter, "ice-restart-after", 0, "restart ICE once (PATCH, RFC 9725) this long after connecting; 0 = never")
	headerFlag(fs, &opts.Header, `extra "Name: value" header on the POST and the DELETE (repeatable), e.g. a region header a CDN would set`)
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	switch len(positional) {
	case 0:
	case 1:
		opts.URL = positional[0]
	default:
		return fmt.Errorf("one signaling URL, got %d arguments: %q", len(positional), positional)
	}
	if opts.URL == "" || opts.AudioPath == "" {
		fs.Usage()
		return errors.New("need a signaling URL and -audio FILE.wav")
	}
	report, err := callclient.Run(ctx, opts)
	if errors.Is(err, callclient.ErrOptions) {
		return err // a usage error (say, no such WAV file): no call, no report
	}
	fmt.Fprintln(stdout, report.String())
	return err
}
