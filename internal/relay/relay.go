// Package relay is Switchboard's relay data plane: a thin UDP forwarder
// between clients on one public VIP:port and the transceivers that own their
// sessions (docs/design.md §2.2, §4; docs/relay.md).
//
// The relay terminates no protocol and rewrites no payload. Per datagram on
// the public socket it looks up a flow by client address; on a miss only a
// STUN Binding request (RFC 8489) whose USERNAME carries a valid routing
// token (internal/token) for this cluster, naming a transceiver in the
// membership table, creates a flow. Datagrams go to the transceiver behind
// an internal-hop header (internal/hop) naming the client; the transceiver's
// answers come back with the same header, and the relay strips it and sends
// the payload from the public socket, but only to a client that has a flow
// pointing at that transceiver.
//
// The per-packet handlers only decide (handlePublic, handleInternal,
// handle.go); the read loops (loops.go, over internal/udpio) do the I/O
// and count. The configuration is in config.go, the counters and Stats in
// stats.go, and the Relay's lifecycle in this file.
// A handler's decision is one of three: forward (out, to), drop (a
// DropReason; every one has a counter created up front), or hold (out nil,
// no drop): the flow cache took the datagram and will forward it, or count
// its drop, itself (flowcache.go).
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// Relay is a running relay. Its methods are safe for concurrent use.
type Relay struct {
	// Set once by New, never mutated.
	cfg        Config
	tune       tuning
	keys       *token.Keyring
	members    *membership.Table
	log        *slog.Logger
	reg        prometheus.Registerer
	collector  *collector
	epoch      time.Time // monotonic origin of the flow timestamps
	publicAddr netip.AddrPort
	intAddr    netip.AddrPort
	workers    []*worker
	flows      *flowTable
	fc         *flowCache // nil without Config.FlowStore
	tcp        *tcpServer // nil without Config.TCPAddr
	wait       *waitRoom  // first packets a cap delays (wait.go)
	cancel     context.CancelFunc
	done       <-chan struct{} // closed by Close, before the sockets
	wg         sync.WaitGroup

	// failed is the error of the first read loop that stopped for good
	// (loops.go); nil while every loop runs.
	failed atomic.Pointer[error]
	// draining is set by Drain (tcp.go): Ready fails.
	draining atomic.Bool

	// misconfig logs the drops that say the fleet is set up wrong
	// (misconfig.go): the handlers write its samples, the sweeper the rest.
	misconfig misconfigLog

	closeOnce sync.Once
	closeErr  error
}

// tuning is what a relay runs with beyond its Config: values that are
// constants in production (defaultTuning) and that tests shorten.
type tuning struct {
	cache          cacheParams   // the flow cache's (flowcache.go)
	readErrorLimit time.Duration // how long read errors last before a loop stops (loops.go)
	misconfigEvery time.Duration // the least time between two log lines of one misconfiguration (misconfig.go)
}

var defaultTuning = tuning{cache: defaultCacheParams, readErrorLimit: defaultReadErrorLimit, misconfigEvery: MisconfigLogInterval}

// newRelay builds a relay without sockets: what the handler tests use.
func newRelay(cfg Config, keys *token.Keyring, members *membership.Table, log *slog.Logger, tune tuning) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if keys == nil {
		return nil, errors.New("relay: nil keyring")
	}
	if members == nil {
		return nil, errors.New("relay: nil membership table")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Relay{
		cfg:     cfg,
		tune:    tune,
		keys:    keys,
		members: members,
		log:     log,
		epoch:   time.Now(),
		flows:   newFlowTable(cfg.MaxFlows),
	}
	r.flows.lim = newLimiter(cfg.MaxPendingPerIP, cfg.NewFlowsPerIP, cfg.NewFlowBurstPerIP, cfg.NewFlowsPerSecond)
	r.wait = newWaitRoom(r)
	if cfg.FlowStore != nil {
		r.fc = newFlowCache(r, cfg.FlowStore, tune.cache)
		r.flows.onConfirm = r.fc.onConfirm
	}
	r.collector = newCollector(r)
	return r, nil
}

// New binds the public and internal sockets (cfg.Workers of each, sharing
// one port through SO_REUSEPORT), registers the relay's metrics on reg
// (which may be nil) and starts the read loops and the flow sweeper.
func New(cfg Config, keys *token.Keyring, members *membership.Table, reg prometheus.Registerer, log *slog.Logger) (*Relay, error) {
	return start(cfg, keys, members, reg, log, defaultTuning)
}

// start is New with the tuning given (tests shorten it).
func start(cfg Config, keys *token.Keyring, members *membership.Table, reg prometheus.Registerer, log *slog.Logger, tune tuning) (*Relay, error) {
	r, err := newRelay(cfg, keys, members, log, tune)
	if err != nil {
		return nil, err
	}
	cfg = r.cfg
	if cfg.IdleTimeout <= ConsentTimeout {
		r.log.Warn("relay: IdleTimeout is not above ICE consent freshness; idle but live sessions may lose their flow",
			"idle_timeout", cfg.IdleTimeout, "consent", ConsentTimeout)
	}
	pub, err := udpio.ListenGroup(cfg.PublicAddr, cfg.Workers)
	if err != nil {
		return nil, fmt.Errorf("relay: public socket: %w", err)
	}
	internal, err := udpio.ListenGroup(cfg.InternalAddr, cfg.Workers)
	if err != nil {
		closeAll(pub)
		return nil, fmt.Errorf("relay: internal socket: %w", err)
	}
	r.publicAddr = canonical(pub[0].LocalAddr().(*net.UDPAddr).AddrPort())
	r.intAddr = canonical(internal[0].LocalAddr().(*net.UDPAddr).AddrPort())
	r.workers = make([]*worker, cfg.Workers)
	for i := range r.workers {
		if r.workers[i], err = newWorker(i, pub[i], internal[i], cfg.Batch); err != nil {
			closeAll(pub)
			closeAll(internal)
			return nil, err
		}
	}
	if cfg.TCPAddr != "" {
		if r.tcp, err = newTCPServer(r, cfg.TCPAddr); err != nil {
			closeAll(pub)
			closeAll(internal)
			return nil, fmt.Errorf("relay: TCP listener: %w", err)
		}
	}
	if reg != nil {
		if err := reg.Register(r.collector); err != nil {
			closeAll(pub)
			closeAll(internal)
			if r.tcp != nil {
				_ = r.tcp.ln.Close()
			}
			return nil, fmt.Errorf("relay: register metrics: %w", err)
		}
		r.reg = reg
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, ctx.Done()
	for _, w := range r.workers {
		r.wg.Add(2)
		go r.publicBatchLoop(w)
		go r.internalBatchLoop(w)
	}
	r.wg.Add(2)
	go r.sweepLoop(ctx)
	r.wait.sock = r.workers[0].internal
	go r.wait.loop(ctx)
	if r.tcp != nil {
		r.wg.Add(1)
		go r.tcp.acceptLoop()
	}
	if r.fc != nil {
		r.fc.sock = r.workers[0].internal
		r.wg.Add(2)
		go r.fc.resolveLoop(ctx)
		go r.fc.writeLoop(ctx)
	}
	r.log.Info("relay: listening", "public", r.publicAddr, "internal", r.intAddr, "tcp", r.TCPAddr(),
		"cluster", cfg.Cluster, "workers", cfg.Workers, "batch", cfg.Batch,
		"flow_cache", r.fc != nil)
	return r, nil
}

func canonical(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// Ready returns nil while every read loop runs, and otherwise the error
// that stopped the first one to stop for good (a socket whose reads kept
// failing): a relay that is not ready should be taken out of its load
// balancer and restarted. While it drains (Drain) it returns ErrDraining.
// The relay command serves it as /ready.
func (r *Relay) Ready() error {
	if err := r.failed.Load(); err != nil {
		return *err
	}
	if r.draining.Load() {
		return ErrDraining
	}
	return nil
}

func closeAll(conns []*net.UDPConn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// PublicAddr returns the bound public address (with the real port if the config asked for port 0).
func (r *Relay) PublicAddr() netip.AddrPort { return r.publicAddr }

// InternalAddr returns the bound internal-hop address.
func (r *Relay) InternalAddr() netip.AddrPort { return r.intAddr }

// TCPAddr returns the bound ICE-TCP address; invalid without Config.TCPAddr.
func (r *Relay) TCPAddr() netip.AddrPort {
	if r.tcp == nil {
		return netip.AddrPort{}
	}
	return r.tcp.addr
}

// Close stops the loops, closes the sockets, unregisters the metrics and
// waits for every goroutine. It is idempotent.
func (r *Relay) Close() error {
	r.closeOnce.Do(func() {
		if r.cancel != nil {
			r.cancel()
		}
		var errs []error
		if r.tcp != nil {
			// Before the UDP sockets, which TCP connections send from.
			errs = append(errs, r.tcp.shutdown())
		}
		for _, w := range r.workers {
			errs = append(errs, w.public.Close(), w.internal.Close())
		}
		r.wg.Wait()
		if r.reg != nil {
			r.reg.Unregister(r.collector)
		}
		r.closeErr = errors.Join(errs...)
		r.log.Info("relay: closed", "public", r.publicAddr)
	})
	return r.closeErr
}

// mono converts now to the relay's monotonic nanoseconds (immune to wall-clock steps).
func (r *Relay) mono(now time.Time) int64 { return int64(now.Sub(r.epoch)) }

// timeout, between 5ms and 1s.
func (r *Relay) sweepInterval() time.Duration {
	d := min(r.cfg.PendingTimeout, r.cfg.IdleTimeout) / 4
	return max(5*time.Millisecond, min(d, time.Second))
}

func (r *Relay) sweepLoop(ctx context.Context) {
	defer r.wg.Done()
	tick := time.NewTicker(r.sweepInterval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			r.sweep(now)
		}
	}
}

func (r *Relay) sweep(now time.Time) {
	r.flows.lim.expire(r.mono(now))
	r.flows.sweep(r.mono(now), int64(r.cfg.PendingTimeout), int64(r.cfg.IdleTimeout), r.members.Contains)
	r.watchDrops(now)
}
