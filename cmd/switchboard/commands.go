package main

import (
	"context"
	"encoding/json"
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
	"syscall"

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
	"github.com/switchboard-rtc/switchboard/internal/trusted"
	"github.com/switchboard-rtc/switchboard/internal/web"
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
	parrot, err := cfg.ParrotOptions()
	if err != nil {
		return err
	}
	d, err := demo.Start(demo.Config{HTTPAddr: cfg.HTTP, RelayAddr: cfg.Relay, NoTCP: !cfg.TCP, Logger: log, Pprof: cfg.Log.Pprof, Agent: cfg.Mode, Ptime: cfg.Ptime,
		DTLSVersion: cfg.DTLS, NoSPED: !cfg.SPED, Parrot: parrot})
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

// serveHTTP serves h on addr, the value of flag (listenTCP), within lim
// until ctx ends, then shuts down gracefully (httpapi.Server.Run). reg, if
// not nil, gets the server's connection metrics.
func serveHTTP(ctx context.Context, flag, addr string, h http.Handler, lim httpapi.Limits, reg prometheus.Registerer, log *slog.Logger) error {
	ln, err := listenTCP(flag, addr)
	if err != nil {
		return err
	}
	return serveListener(ctx, ln, h, lim, reg, log)
}

// socketFlag names the flag of a socket the error err of a server's
// constructor is about: pairs are the start of the constructor's message
// for a socket and its flag ("relay: public socket", "-public"). Other
// errors come back as they are.
func socketFlag(err error, pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if msg := err.Error(); strings.HasPrefix(msg, pairs[i]) {
			pkg, _, _ := strings.Cut(pairs[i], ": ")
			return &reworded{pairs[i+1] + ": " + strings.TrimPrefix(msg, pkg+": "), err}
		}
	}
	return err
}

// withFlag names the flag beside a config key that opens a package's
// error ("transceiver: max_sessions -1 must ..." becomes "transceiver:
// max_sessions (-max-sessions) -1 must ..."), as internal/auth words its
// own, so an operator who set it by flag finds it. The flag is the key
// with '-' for '_', or renamed[key]; a key with no such flag in fs, or an
// error not opening with prefix, is returned as is.
func withFlag(err error, fs *flag.FlagSet, prefix string, renamed map[string]string) error {
	msg := err.Error()
	rest, ok := strings.CutPrefix(msg, prefix)
	if !ok {
		return err
	}
	key, after, ok := strings.Cut(rest, " ")
	if !ok || strings.HasPrefix(after, "(-") {
		return err
	}
	name := renamed[key]
	if name == "" {
		name = strings.ReplaceAll(key, "_", "-")
	}
	if fs.Lookup(name) == nil {
		return err
	}
	return &reworded{prefix + key + " (-" + name + ") " + after, err}
}

// reworded is an error with a message of its own that still unwraps to
// the error it words.
type reworded struct {
	msg string
	err error
}

func (e *reworded) Error() string { return e.msg }
func (e *reworded) Unwrap() error { return e.err }

// listenTCP listens on addr, the value of flag ("-http"); its error names
// the flag, and for an address in use, what to do.
func listenTCP(flag, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("%s: %w (another process has it: stop that one, or give %s another address)", flag, err, flag)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return ln, nil
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
func signalingLimits(proxies []string) httpapi.Limits {
	lim := httpapi.Limits{Name: "signaling", PerSource: httpapi.DefaultMaxConnsPerSource, Exempt: httpapi.Loopback()}
	if ps, err := trusted.Parse(proxies); err == nil {
		lim.Exempt = append(lim.Exempt, ps...)
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
	members, stopMembers, err := relayMembership(ctx, cfg.Source, strings.Join(cfg.Members, ","), cfg.Relay.Cluster, reg, log)
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
		return socketFlag(err, "relay: public socket", "-public", "relay: internal socket", "-internal", "relay: TCP listener", "-tcp")
	}
	defer r.Close()
	var ops net.Listener
	if cfg.Metrics != "" {
		if ops, err = listenTCP("-metrics", cfg.Metrics); err != nil {
			return err
		}
	}
	tcp := "off"
	if r.TCPAddr().IsValid() {
		tcp = r.TCPAddr().String()
	}
	log.Info("relay running", "public", r.PublicAddr().String(), "internal", r.InternalAddr().String(), "tcp", tcp, "members", members.Len())
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
	fs := cfg.Flags()
	if err := config.Parse(fs, args, &cfg); err != nil {
		return err
	}
	log, keys, reg, err := serverSetup(cfg.Log, cfg.Keys)
	if err != nil {
		return err
	}
	t, err := transceiver.New(cfg.Trx, keys, reg, log)
	if err != nil {
		return withFlag(socketFlag(err, "transceiver: listen", "-listen"), fs, "transceiver: ", map[string]string{"backend_url": "backend"})
	}
	defer t.Close()
	ln, err := listenTCP("-http", cfg.HTTP)
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
	api := t.Handler()
	mux.Handle("/v1/", api)
	mux.Handle("/live", api)
	mux.Handle("/ready", api)
	// The demo page at "/", so that a browser can call a transceiver run
	// on its own. It holds nothing secret; its calls need what any
	// client's need (a client token when auth is on, which it says).
	mux.Handle("/", web.NewHandler(web.Page{Auth: cfg.Trx.Auth.Enabled()}))
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
	opts, err := cfg.ParrotOptions()
	if err != nil {
		return err
	}
	var backend http.Handler
	if cfg.Mode == agent.ModeEcho && opts.TurnDetection != nil && opts.ReplyDelay == 0 {
		// The echo takes no turns, but its hello may ask for turn
		// detection and input cleaning as given (their members
		// included, docs/bridge.md §4.8) while it sends every frame
		// back: switchboard-bench transceiver measures their cost so.
		backend, err = agent.NewEchoConfig(agent.EchoConfig{Logger: log, Format: cfg.Format, TurnDetection: json.RawMessage(cfg.TurnDetection)})
	} else {
		backend, err = agent.NewMode(cfg.Mode, cfg.Format, log, opts)
	}
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
	return serveHTTP(ctx, "-listen", cfg.Listen, mux, httpapi.Limits{Name: "bridge", MaxConns: -1}, nil, log)
}

func runCall(ctx context.Context, args []string, stdout io.Writer) error {
	var opts callclient.Options
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `Usage: switchboard call URL -audio FILE.wav [flags]

Runs one session against the signaling URL (e.g. http://127.0.0.1:8080/v1/calls),
sends the file as Opus, and prints a JSON report. It checks an echo: call an
echo backend (switchboard demo -mode echo, switchboard agent -mode echo), and
it exits 1 unless the audio and the data-channel ping came back. Against the
parrot or a real agent, which answer instead of echoing, give -echo=false: it
then exits 0 once the session connected and streamed.

Flags:`)
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
	echo := fs.Bool("echo", true, "the backend echoes (switchboard agent -mode echo): fail unless the audio and the data-channel ping came back; false for the parrot or a real agent")
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
		return errors.New("need a signaling URL and -audio FILE.wav, e.g. switchboard call http://127.0.0.1:8080/v1/calls -audio testdata/speech.wav; run 'switchboard call -h' for the flags")
	}
	report, err := callclient.Run(ctx, opts)
	if errors.Is(err, callclient.ErrOptions) {
		return err // a usage error (say, no such WAV file): no call, no report
	}
	fmt.Fprintln(stdout, report.String())
	if err != nil || !*echo {
		return err
	}
	return echoError(report)
}

// echoError is the error of a call that connected but whose echo did not
// come back (switchboard call with -echo, the default), or nil.
func echoError(r callclient.Report) error {
	var missing []string
	switch {
	case r.AudioEchoed:
	case r.PacketsReceived*10 >= r.PacketsSent*9 && r.PayloadMismatches > 0:
		// As many packets as sent, other payloads: the transceiver
		// decoded and encoded them again for a PCM echo.
		return fmt.Errorf("connected, and %d of %d packets came back, but re-encoded: a PCM echo (switchboard agent -mode echo -format pcm16/…) "+
			"sends the audio back through the transceiver's encoder; give -echo=false for it", r.PacketsReceived, r.PacketsSent)
	case r.PacketsReceived == 0:
		missing = append(missing, fmt.Sprintf("audio: none of %d packets back", r.PacketsSent))
	default:
		missing = append(missing, fmt.Sprintf("audio: %d packets back for %d sent, %d of them not ones sent", r.PacketsReceived, r.PacketsSent, r.PayloadMismatches))
	}
	if !r.DataChannelEchoed {
		missing = append(missing, "data-channel ping: no echo")
	}
	if missing == nil {
		return nil
	}
	return fmt.Errorf("connected, but the echo did not come back (%s): is the backend an echo (switchboard demo -mode echo, switchboard agent -mode echo)? "+
		"The parrot and real agents answer instead of echoing: give -echo=false for them", strings.Join(missing, "; "))
}
