// Package demo runs a whole Switchboard in one process on loopback: a
// relay, a transceiver behind it, the echo agent, and a web page to call it
// from a browser. It needs no configuration and no external service: the
// fleet token key is random per run, and membership is a static table.
package demo

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/httpapi"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
	"github.com/switchboard-rtc/switchboard/internal/web"
)

// Default addresses of `switchboard demo`, ip:port.
const (
	// DefaultHTTPAddr serves the web page, the signaling API and /metrics.
	DefaultHTTPAddr = "127.0.0.1:8080"
	// DefaultRelayAddr is the relay's public UDP address, STUN's port.
	DefaultRelayAddr = "127.0.0.1:3478"
	// DefaultPtime is `switchboard demo -ptime`'s default, ms: the
	// transceiver's own default, 20 (see docs/benchmarks.md, turn-taking,
	// for what 10 ms packets change in a conversation).
	DefaultPtime = transceiver.DefaultPtime
)

// Config configures the demo. Zero values take the defaults.
type Config struct {
	// HTTPAddr serves the page, signaling and /metrics. Default
	// "127.0.0.1:8080". The agent's bridge has a loopback port of its own.
	HTTPAddr string
	// RelayAddr is the relay's public UDP address. Default "127.0.0.1:3478".
	// The relay's ICE-TCP listener takes the same address (TCP), and the
	// answers offer it as a passive TCP candidate, unless NoTCP.
	RelayAddr string
	// NoTCP turns the relay's ICE-TCP listener and the answers' TCP
	// candidate off.
	NoTCP bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Agent is the reference agent serving the bridge: agent.ModeParrot
	// (the default: a conversation) or agent.ModeEcho. The page is told
	// which (web.Page), as it pings on the data channel only with the echo.
	Agent string
	// Backend, if set, serves the bridge (at /v1/bridge on its loopback
	// port) instead of Agent
	// (tests plug in their own backends).
	Backend http.Handler
	// Pprof serves Go's profiles (net/http/pprof) at /debug/pprof/ on
	// HTTPAddr. Off by default: keep it off public networks.
	Pprof bool
	// Parrot is the parrot agent's turn detection and reply delay
	// (agent.ParrotOptions); the echo takes none.
	Parrot agent.ParrotOptions
	// Ptime is the transceiver's packet length to and from the browser,
	// ms (transceiver.Config.Ptime: 20 or 10; 0: the transceiver's
	// default, 20). A bad value fails Start with the transceiver's error.
	Ptime int
	// DTLSVersion is the transceiver's highest DTLS version
	// (transceiver.Config.DTLSVersion: "1.2" or "1.3"; "": its default).
	DTLSVersion string
	// NoSPED answers offers with SPED's a=ice-options (sped, googspedv1) without them
	// (transceiver.Config.SPED off): a plain DTLS handshake after ICE.
	NoSPED bool
}

// Demo is a running demo.
type Demo struct {
	// Set once (relay: but for FailOverRelay).
	relay *relay.Relay
	trx   *transceiver.Server
	// What the relay was made with, for FailOverRelay (fortest.go).
	keys    *token.Keyring
	members *membership.Table
	rcfg    relay.Config
	log     *slog.Logger
	srv     *httpapi.Server // the page, signaling, /metrics
	bridge  *httpapi.Server // the agent's bridge, on loopback
	url     string
	serveCh chan error
}

// TransceiverID is the demo transceiver's id in tokens and membership.
const TransceiverID = 1

// Start starts every part and returns once all are listening.
func Start(cfg Config) (*Demo, error) {
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = DefaultHTTPAddr
	}
	if cfg.RelayAddr == "" {
		cfg.RelayAddr = DefaultRelayAddr
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	keys, err := token.NewKeyring(token.Key{ID: 0, Secret: secret})
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Settings first: a bad ptime or mode is refused before anything listens.
	if err := transceiver.CheckPtime(cfg.Ptime); err != nil {
		return nil, fmt.Errorf("demo: -ptime: %w", err)
	}
	backend, page := cfg.Backend, web.Page{}
	if backend == nil {
		if backend, err = agent.NewMode(cfg.Agent, "", log.With("component", "agent"), cfg.Parrot); err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		page.Agent = cmp.Or(cfg.Agent, agent.ModeParrot)
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("demo: the page's address (-http): %w%s", err, inUse(err, "-http"))
	}
	// The bridge on a port of its own, as a separate agent would be: a
	// flood of the page's port does not take the transceiver's way to its
	// backend, and the page's per-source cap does not count the bridge.
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("demo: the agent's bridge: %w", err)
	}
	bmux := http.NewServeMux()
	bmux.Handle("/v1/bridge", backend)
	bridgeSrv, err := httpapi.NewServer(bln, bmux, httpapi.Limits{Name: "bridge", MaxConns: -1}, reg, log)
	if err != nil {
		_ = ln.Close()
		_ = bln.Close()
		return nil, err
	}
	members := &membership.Table{}
	rcfg := relay.Config{PublicAddr: cfg.RelayAddr, InternalAddr: "127.0.0.1:0", Cluster: 1, Relearn: true}
	if !cfg.NoTCP {
		rcfg.TCPAddr = cfg.RelayAddr
	}
	rly, err := relay.New(rcfg, keys, members, reg, log.With("component", "relay"))
	if err != nil {
		_ = ln.Close()
		_ = bln.Close()
		return nil, fmt.Errorf("demo: the relay's address (-relay): %w%s", err, inUse(err, "-relay"))
	}
	internal := rly.InternalAddr()
	var advertiseTCP string
	if a := rly.TCPAddr(); a.IsValid() {
		advertiseTCP = a.String()
	}
	trx, err := transceiver.New(transceiver.Config{
		ID:           TransceiverID,
		Cluster:      1,
		ListenAddr:   "127.0.0.1:0",
		Advertise:    rly.PublicAddr().String(),
		AdvertiseTCP: advertiseTCP,
		AllowRelays:  []string{netip.PrefixFrom(internal.Addr(), internal.Addr().BitLen()).String()},
		BackendURL:   "ws://" + bln.Addr().String() + "/v1/bridge",
		Ptime:        cfg.Ptime,
		DTLSVersion:  cfg.DTLSVersion,
		SPED:         !cfg.NoSPED,
	}, keys, reg, log.With("component", "transceiver"))
	if err != nil {
		_ = rly.Close()
		_ = ln.Close()
		_ = bln.Close()
		return nil, err
	}
	if err := members.Set(map[uint32]netip.AddrPort{TransceiverID: trx.HopAddr().(*net.UDPAddr).AddrPort()}); err != nil {
		_ = trx.Close()
		_ = rly.Close()
		_ = ln.Close()
		_ = bln.Close()
		return nil, err
	}

	signaling := trx.Handler()
	mux := http.NewServeMux()
	mux.Handle("/v1/", signaling)
	mux.Handle("/live", signaling)
	mux.Handle("/ready", signaling)

	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", web.NewHandler(page))
	if cfg.Pprof {
		httpapi.HandlePprof(mux)
	}
	// Clients on loopback share one source: only the server's cap holds
	// for them; from other addresses (-http on a LAN address), each has
	// the signaling's per-source cap.
	srv, err := httpapi.NewServer(ln, mux, httpapi.Limits{Name: "signaling", PerSource: httpapi.DefaultMaxConnsPerSource, Exempt: httpapi.Loopback()}, reg, log)
	if err != nil {
		_ = trx.Close()
		_ = rly.Close()
		_ = ln.Close()
		_ = bln.Close()
		return nil, err
	}

	d := &Demo{
		relay:   rly,
		trx:     trx,
		keys:    keys,
		members: members,
		rcfg:    rcfg,
		log:     log,
		srv:     srv,
		bridge:  bridgeSrv,
		url:     "http://" + ln.Addr().String(),
		serveCh: make(chan error, 2),
	}
	go func() { d.serveCh <- d.bridge.Serve() }()
	go func() { d.serveCh <- d.srv.Serve() }()
	log.Info("switchboard demo running", "web", d.url, "relay", rly.PublicAddr().String(), "transceiver_hop", trx.HopAddr().String())
	return d, nil
}

// URL returns the base URL of the page and API, e.g. "http://127.0.0.1:8080".
func (d *Demo) URL() string { return d.url }

// RelayAddr returns the relay's public UDP address.
func (d *Demo) RelayAddr() netip.AddrPort { return d.relay.PublicAddr() }

// RelayTCPAddr returns the relay's ICE-TCP address; invalid with NoTCP.
func (d *Demo) RelayTCPAddr() netip.AddrPort { return d.relay.TCPAddr() }

// Relay returns the relay, for tests and stats.
func (d *Demo) Relay() *relay.Relay { return d.relay }

// Transceiver returns the transceiver, for tests and stats.
func (d *Demo) Transceiver() *transceiver.Server { return d.trx }

// Wait blocks until the web server fails or ctx ends.
func (d *Demo) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-d.serveCh:
		return err
	}
}

// Close ends every session and stops every part.
func (d *Demo) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := d.trx.Close()
	if serr := d.srv.Shutdown(ctx); serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	// After the transceiver: its sessions ended their bridges.
	if serr := d.bridge.Shutdown(ctx); serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if rerr := d.relay.Close(); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// inUse says what to do about err when it is an address in use (a demo
// left running in another terminal, most often): "" for other errors.
func inUse(err error, flag string) string {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return ""
	}
	return " (is a demo already running, in another terminal? Stop it, or give " + flag + " another address)"
}
