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
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/demo"
	"github.com/switchboard-rtc/switchboard/internal/flowstore"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

func runDemo(ctx context.Context, args []string, _ io.Writer) error {
	var cfg struct {
		HTTP  string    `yaml:"http"`
		Relay string    `yaml:"relay"`
		Log   LogConfig `yaml:",inline"`
	}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.StringVar(&cfg.HTTP, "http", "127.0.0.1:8080", "address of the web page, signaling API and /metrics")
	fs.StringVar(&cfg.Relay, "relay", "127.0.0.1:3478", "relay public UDP address (advertised in answers)")
	cfg.Log.register(fs, "text")
	if err := parseConfig(fs, args, &cfg); err != nil {
		return err
	}
	log, err := newLogger(cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		return err
	}
	d, err := demo.Start(demo.Config{HTTPAddr: cfg.HTTP, RelayAddr: cfg.Relay, Logger: log, Pprof: cfg.Log.Pprof})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "\n  Switchboard demo: open %s in a browser and click Call.\n  Relay UDP %s. Ctrl-C to stop.\n\n", d.URL(), d.RelayAddr())
	werr := d.Wait(ctx)
	if cerr := d.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

// serverSetup builds what every server holding the fleet key needs: its
// logger, token keyring and metrics registry.
func serverSetup(l LogConfig, k KeyConfig) (*slog.Logger, *token.Keyring, *prometheus.Registry, error) {
	log, err := newLogger(l.Format, l.Level)
	if err != nil {
		return nil, nil, nil, err
	}
	keys, err := k.keyring()
	if err != nil {
		return nil, nil, nil, err
	}
	return log, keys, newRegistry(), nil
}

// newRegistry returns a registry with the Go and process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveHTTP serves h on addr until ctx ends, then shuts down gracefully.
func serveHTTP(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return serveListener(ctx, ln, h, log)
}

// serveListener is serveHTTP on a listener the caller bound already (so
// that a busy port fails the command before it logs that it runs). It
// closes ln.
func serveListener(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("http listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func runRelay(ctx context.Context, args []string, _ io.Writer) error {
	var cfg struct {
		Relay     relay.Config     `yaml:",inline"`
		FlowCache string           `yaml:"flow_cache"`
		Members   string           `yaml:"members"`
		Source    MembershipConfig `yaml:",inline"`
		Metrics   string           `yaml:"metrics"`
		Keys      KeyConfig        `yaml:",inline"`
		Log       LogConfig        `yaml:",inline"`
	}
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.StringVar(&cfg.Relay.PublicAddr, "public", "0.0.0.0:3478", "public UDP address clients send to (the VIP:port)")
	fs.StringVar(&cfg.Relay.InternalAddr, "internal", "0.0.0.0:3479", "UDP address of the internal hop to and from transceivers")
	clusterFlag(fs, &cfg.Relay.Cluster)
	fs.IntVar(&cfg.Relay.Workers, "workers", 0, "public-socket read loops sharing the port with SO_REUSEPORT (0 = one per CPU)")
	fs.DurationVar(&cfg.Relay.PendingTimeout, "pending-timeout", relay.DefaultPendingTimeout, "lifetime of a flow the transceiver has not answered yet")
	fs.DurationVar(&cfg.Relay.IdleTimeout, "idle-timeout", relay.DefaultIdleTimeout, "idle timeout of a confirmed flow (longer than ICE consent, 30s)")
	fs.IntVar(&cfg.Relay.MaxFlows, "max-flows", relay.DefaultMaxFlows, "flow table capacity; new flows beyond it are dropped and counted")
	fs.IntVar(&cfg.Relay.MaxPendingPerIP, "max-pending-per-ip", relay.DefaultMaxPendingPerIP, "pending (unanswered) flows one source IP (IPv6: /64) may hold; beyond it its new flows are dropped and counted")
	fs.IntVar(&cfg.Relay.NewFlowsPerIP, "new-flows-per-ip", relay.DefaultNewFlowsPerIP, "flows per second one source IP (IPv6: /64) may create beyond its burst; a client over it is delayed (given a turn up to 1 s ahead), beyond that refused, both counted")
	fs.IntVar(&cfg.Relay.NewFlowBurstPerIP, "new-flow-burst-per-ip", 0, "flows one source IP (IPv6: /64) may create at once before -new-flows-per-ip paces it (0 = -new-flows-per-ip)")
	fs.IntVar(&cfg.Relay.NewFlowsPerSecond, "new-flows-per-second", relay.DefaultNewFlowsPerSecond, "flows all sources together may create per second; beyond it new flows are dropped and counted")
	fs.BoolVar(&cfg.Relay.Relearn, "relearn", true, "rebuild a lost flow (relay restart) from a transceiver's datagram for the client, trusting members to name only their clients")
	fs.BoolVar(&cfg.Relay.Ingress, "ingress", false, "run as a Global Relay: route tokens by cluster; -members then lists cluster id=cluster relay public ip:port")
	fs.Func("trusted-ingress", "comma-separated CIDR prefixes of Global Relays whose hop-framed datagrams the public socket accepts", func(v string) error {
		cfg.Relay.TrustedIngress = strings.Split(v, ",")
		return nil
	})
	fs.StringVar(&cfg.FlowCache, "flow-cache", "", "Redis of the cluster's flow cache, as host:port, redis://[[user]:password@]host[:port][/db], or rediss://… (TLS): confirmed flows are written there, and a client's DTLS/RTP without a flow is held while it is looked up (docs/relay.md); empty: no cache")
	fs.StringVar(&cfg.Members, "members", "", "static membership: transceiver id=internal ip:port, comma separated, e.g. 1=10.0.0.5:4000,2=10.0.0.6:4000")
	fs.StringVar(&cfg.Metrics, "metrics", "127.0.0.1:9090", "address serving /metrics, /live and /ready (empty disables)")
	cfg.Source.register(fs)
	cfg.Keys.register(fs)
	cfg.Log.register(fs, "json")
	if err := parseConfig(fs, args, &cfg,
		yamlOnly{"batch", fmt.Sprintf("datagrams per recvmmsg/sendmmsg of each read loop; 1: one per system call, 64 KiB datagrams (default %d)", relay.DefaultBatch)},
		yamlOnly{"no_thread_lock", "leave the read loops unpinned from their OS threads; for measurement only (default false)"},
	); err != nil {
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
	log.Info("relay running", "public", r.PublicAddr().String(), "internal", r.InternalAddr().String(), "members", members.Len())
	return serveOps(ctx, ops, reg, cfg.Log.Pprof, r.Ready, log)
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
	return serveListener(ctx, ln, mux, log)
}

func clusterFlag(fs *flag.FlagSet, dst *uint16) {
	*dst = 1
	fs.Func("cluster", "cluster id carried in tokens (1-65535, default 1)", func(s string) error {
		var v uint
		if _, err := fmt.Sscan(s, &v); err != nil || v == 0 || v > 65535 {
			return fmt.Errorf("want a number from 1 to 65535")
		}
		*dst = uint16(v)
		return nil
	})
}

func runTransceiver(ctx context.Context, args []string, _ io.Writer) error {
	var cfg struct {
		Trx   transceiver.Config `yaml:",inline"`
		HTTP  string             `yaml:"http"`
		Drain time.Duration      `yaml:"drain_timeout"`
		Allow string             `yaml:"-"`
		Proxy string             `yaml:"-"`
		Redis string             `yaml:"redis"`
		HopAd string             `yaml:"hop_advertise"`
		Keys  KeyConfig          `yaml:",inline"`
		Log   LogConfig          `yaml:",inline"`
	}
	fs := flag.NewFlagSet("transceiver", flag.ContinueOnError)
	fs.Func("id", "transceiver id carried in tokens; relays map it to -listen (required, 1-4294967295)", func(s string) error {
		var v uint32
		if _, err := fmt.Sscan(s, &v); err != nil || v == 0 {
			return fmt.Errorf("want a number from 1 to 4294967295")
		}
		cfg.Trx.ID = v
		return nil
	})
	clusterFlag(fs, &cfg.Trx.Cluster)
	fs.StringVar(&cfg.Trx.ListenAddr, "listen", "127.0.0.1:4000", "UDP address of the internal-hop socket relays send to")
	fs.StringVar(&cfg.Trx.Advertise, "advertise", "", "relay public ip:port put in answers as the one candidate (required unless -direct)")
	fs.StringVar(&cfg.Allow, "allow-relays", "", "comma-separated CIDR prefixes relays may send from (default: loopback and private ranges)")
	fs.StringVar(&cfg.Trx.BackendURL, "backend", "ws://127.0.0.1:8081/v1/bridge", "backend bridge WebSocket URL")
	fs.DurationVar(&cfg.Trx.SetupTimeout, "setup-timeout", 30*time.Second, "end sessions not connected this long after the offer")
	fs.IntVar(&cfg.Trx.MaxSessions, "max-sessions", 10000, "concurrent session cap; offers beyond it get 503")
	fs.DurationVar(&cfg.Trx.DisconnectedTimeout, "disconnected-timeout", transceiver.DefaultDisconnectedTimeout, "tell the backend a client is disconnected after it sent nothing this long")
	fs.DurationVar(&cfg.Trx.ConsentTimeout, "consent-timeout", transceiver.DefaultConsentTimeout, "end a session whose client sent nothing this long (RFC 7675 consent expiry: 30s)")
	fs.IntVar(&cfg.Trx.MaxPendingPerClient, "max-pending-per-client", transceiver.DefaultMaxPendingPerClient, "sessions not yet connected per client address (IPv4, IPv6 /64); offers beyond get 429")
	fs.IntVar(&cfg.Trx.MaxPending, "max-pending", transceiver.DefaultMaxPending, "sessions not yet connected in total; offers beyond get 503")
	fs.DurationVar(&cfg.Trx.CheckTimeout, "check-timeout", transceiver.DefaultCheckTimeout, "end a session whose client sent no authenticated connectivity check this long after the answer")
	fs.StringVar(&cfg.Proxy, "trusted-proxies", "", "comma-separated CIDR prefixes of proxies (director, load balancer) whose X-Forwarded-For names the client")
	fs.StringVar(&cfg.Trx.DTLSRole, "dtls-role", "client", "DTLS role in answers to actpass offers: client (active) or server (passive, no HelloVerify)")
	fs.StringVar(&cfg.HTTP, "http", "127.0.0.1:8080", "address of the signaling API, /metrics, /live and /ready")
	fs.DurationVar(&cfg.Drain, "drain-timeout", 30*time.Second, "on SIGTERM, how long live sessions may run on before they are ended")
	fs.BoolVar(&cfg.Trx.Direct, "direct", false, "clients send straight to -listen (no relay, no internal hop); -advertise defaults to -listen")
	fs.StringVar(&cfg.Redis, "redis", "", "Redis host:port to register in (relays with -membership redis find this transceiver there); empty: no registration")
	fs.IntVar(&cfg.Trx.OutputBitrate, "output-bitrate", 32000, "Opus bitrate (bit/s) of audio encoded from PCM backends")
	fs.DurationVar(&cfg.Trx.OutputQueueMax, "output-queue-max", 60*time.Second, "cap on a session's queued output audio; past it backend audio is refused (error output_queue_full)")
	fs.StringVar(&cfg.HopAd, "hop-advertise", "", "internal-hop ip:port registered for relays (default: -listen, which must then be a concrete IP)")
	registerAuth(fs, &cfg.Trx.Auth)
	cfg.Keys.register(fs)
	cfg.Log.register(fs, "json")
	if err := parseConfig(fs, args, &cfg,
		yamlOnly{"ingress_by_region", "region → Global Relay ip:port advertised to that region's clients (docs/director.md)"},
	); err != nil {
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
	go func() { httpErr <- serveListener(httpCtx, ln, mux, log) }()
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
	var cfg struct {
		Listen string    `yaml:"listen"`
		Format string    `yaml:"format"`
		Log    LogConfig `yaml:",inline"`
	}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8081", "address serving the bridge at /v1/bridge")
	fs.StringVar(&cfg.Format, "format", bridge.FormatOpus, "audio format to echo in: opus/48000/2, pcm16/24000/1 or pcm16/16000/1")
	cfg.Log.register(fs, "json")
	if err := parseConfig(fs, args, &cfg); err != nil {
		return err
	}
	log, err := newLogger(cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		return err
	}
	echo, err := agent.NewEchoConfig(agent.EchoConfig{Logger: log, Format: cfg.Format})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/bridge", echo)
	mux.HandleFunc("/live", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	return serveHTTP(ctx, cfg.Listen, mux, log)
}

func runCall(ctx context.Context, args []string, stdout io.Writer) error {
	var opts callclient.Options
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: switchboard call URL -audio FILE.wav [flags]\n\nRuns one session against the signaling URL (e.g. http://127.0.0.1:8080/v1/calls),\nsends the file as Opus, and prints a JSON report.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.StringVar(&opts.AudioPath, "audio", "", "16-bit PCM WAV file to send (required)")
	fs.DurationVar(&opts.Duration, "duration", 0, "how much audio to send (0 = the whole file; longer loops it)")
	fs.DurationVar(&opts.Timeout, "timeout", 0, "bound on the whole call (0 = audio length + 15s)")
	fs.StringVar(&opts.AuthToken, "token", "", "bearer token for signaling")
	fs.BoolVar(&opts.IPv4Only, "ipv4", false, "gather IPv4 candidates only")
	fs.DurationVar(&opts.ICERestartAfter, "ice-restart-after", 0, "restart ICE once (PATCH, RFC 9725) this long after connecting; 0 = never")
	fs.Func("header", `extra "Name: value" header on the POST and the DELETE (repeatable), e.g. a region header a CDN would set`, func(v string) error {
		name, value, ok := strings.Cut(v, ":")
		if name = strings.TrimSpace(name); !ok || name == "" {
			return errors.New(`want "Name: value"`)
		}
		if opts.Header == nil {
			opts.Header = http.Header{}
		}
		opts.Header.Add(name, strings.TrimSpace(value))
		return nil
	})
	// Accept the URL anywhere among the flags: the flag package stops at
	// the first non-flag argument, so parse on after it.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
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
