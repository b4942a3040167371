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
// The per-packet handlers only decide (handlePublic, handleInternal); the
// read loops (loops.go, over internal/udpio) do the I/O and count.
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
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/stunpeek"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/trusted"
	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// Default addresses of the relay's sockets, in ip:port form (the flags of
// `switchboard relay` start from them). The public port is STUN's, 3478
// (RFC 8489 §18.1.1), the internal hop's the next one.
const (
	DefaultPublicAddr   = "0.0.0.0:3478"
	DefaultInternalAddr = "0.0.0.0:3479"
	// DefaultMetricsAddr serves /metrics, /live and /ready: loopback only.
	DefaultMetricsAddr = "127.0.0.1:9090"
)

// Defaults filled in by Config.Validate.
const (
	DefaultPendingTimeout = 10 * time.Second
	DefaultIdleTimeout    = 60 * time.Second
	DefaultMaxFlows       = 1 << 20
	// ConsentTimeout is ICE consent freshness (RFC 7675 §5.1): a confirmed
	// flow's IdleTimeout should be longer.
	ConsentTimeout = 30 * time.Second
	// maxWorkers bounds Config.Workers.
	maxWorkers = 256
	// maxDatagram is the largest UDP payload; the unbatched loops' read
	// buffers hold one whole.
	maxDatagram = 64 * 1024
	// DefaultBatch is the default number of datagrams per recvmmsg/sendmmsg.
	DefaultBatch = 64
	// maxBatch bounds Config.Batch.
	maxBatch = 1024
	// batchSlot is the size of one message buffer of the batched loops:
	// hop.MaxHeaderLen of headroom and the datagram. Datagrams the slot
	// truncates are dropped as DropTooBig, and so are (in every loop)
	// client payloads longer than hop.MaxPayload, the path's one limit.
	batchSlot = 2048
	// MaxBatchedPayload is the most a batched loop's slot holds of a client
	// payload; it must stay above hop.MaxPayload, which is what the relay
	// forwards (either direction).
	MaxBatchedPayload = batchSlot - hop.MaxHeaderLen
)

// A batched slot holds any datagram the relay forwards (compile-time check).
const _ = uint(MaxBatchedPayload - hop.MaxPayload)

// Config configures a relay.
type Config struct {
	// PublicAddr is the UDP listen address of the public socket (the VIP:port), e.g. "0.0.0.0:3478".
	PublicAddr string `yaml:"public_addr"`
	// InternalAddr is the UDP listen address of the internal hop to and from
	// transceivers, e.g. "0.0.0.0:3479"; port 0 picks a free port.
	InternalAddr string `yaml:"internal_addr"`
	// Cluster is this relay's cluster id; tokens for another cluster are dropped.
	Cluster uint16 `yaml:"cluster"`
	// Workers is the number of socket pairs sharing the public and internal
	// ports (SO_REUSEPORT), each with its two read loops; 0 means
	// runtime.NumCPU(). Only Linux balances datagrams across sockets: on
	// other OSes it must be 1 (udpio.MaxGroup), and 0 means 1.
	Workers int `yaml:"workers"`
	// PendingTimeout bounds a flow that a Binding request created and its
	// transceiver has not answered yet. Default 10s.
	PendingTimeout time.Duration `yaml:"pending_timeout"`
	// IdleTimeout expires a confirmed flow with no traffic either way.
	// Default 60s; keep it above ICE consent freshness (30s).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxFlows caps the flow table; at the cap new flows are dropped and
	// existing ones are never evicted. Default 1<<20.
	MaxFlows int `yaml:"max_flows"`
	// MaxPendingPerIP caps the pending flows of one source IP (IPv6: one
	// /64); at the cap its new flows are dropped (source_pending_limit).
	// Default DefaultMaxPendingPerIP. See limits.go and docs/security.md.
	MaxPendingPerIP int `yaml:"max_pending_per_ip"`
	// NewFlowsPerIP is the rate, per second, at which one source IP (IPv6:
	// one /64) creates flows beyond its burst: a client over it is given a
	// turn and delayed (source_rate_delayed), up to a second; beyond that,
	// refused (source_rate_limit). Default DefaultNewFlowsPerIP. See
	// limits.go.
	NewFlowsPerIP int `yaml:"new_flows_per_ip"`
	// NewFlowBurstPerIP is how many flows one source IP may create at once,
	// before NewFlowsPerIP paces it (a token bucket's depth). Default
	// DefaultNewFlowBurstPerIP, or NewFlowsPerIP when that is set.
	NewFlowBurstPerIP int `yaml:"new_flow_burst_per_ip"`
	// NewFlowsPerSecond caps the flows all sources together create per
	// second (new_flow_rate_limit). Default DefaultNewFlowsPerSecond.
	NewFlowsPerSecond int `yaml:"new_flows_per_second"`
	// Batch is the number of datagrams each read loop receives per
	// recvmmsg(2) and sends per sendmmsg(2). 1 uses one read and one write
	// syscall per datagram (and forwards datagrams up to 64 KiB; batched
	// loops forward up to MaxBatchedPayload). 0 means DefaultBatch.
	Batch int `yaml:"batch"`
	// Ingress makes this relay a Global Relay (docs/design.md §2.3): it routes a
	// token by its cluster id, and the membership table maps cluster ids
	// to those clusters' relay public addresses, which it forwards to with
	// the client's address in a hop header. Cluster is then ignored.
	Ingress bool `yaml:"ingress"`
	// TrustedIngress lists the prefixes of Global Relays whose hop-framed
	// datagrams this (cluster) relay accepts on its public socket, as if
	// from the client named in the header; replies go back through the
	// Global Relay. Empty: none (hop-framed datagrams are dropped).
	TrustedIngress []string `yaml:"trusted_ingress"`
	// NoThreadLock leaves the read loops unpinned from their OS threads
	// (runtime.LockOSThread is the default). For measurement only.
	NoThreadLock bool `yaml:"no_thread_lock"`
	// Relearn rebuilds a lost flow from the transceiver's side (docs/design.md
	// §5.7): a datagram from a member naming a client with no flow creates
	// a confirmed flow from that client to that member, so a restarted
	// relay forwards replies, and the client's media that follows, at once
	// instead of after the client's next consent check. It trusts members
	// to name only their own clients: a member can then make the relay
	// send to any address. Off in the zero Config; the relay command turns
	// it on by default.
	Relearn bool `yaml:"relearn"`
	// TCPAddr, if set, is the TCP listen address of ICE-TCP (RFC 6544)
	// clients, e.g. "0.0.0.0:443" (tcp.go, docs/relay.md "ICE-TCP"): the
	// relay reads RFC 4571 frames from each connection and forwards their
	// packets like UDP datagrams. Empty: no TCP.
	TCPAddr string `yaml:"tcp_addr"`
	// MaxTCPConns caps the open TCP connections. Default DefaultMaxTCPConns.
	MaxTCPConns int `yaml:"max_tcp_conns"`
	// MaxTCPConnsPerIP caps the open TCP connections of one source IP
	// (IPv6: one /64). Default DefaultMaxTCPConnsPerIP.
	MaxTCPConnsPerIP int `yaml:"max_tcp_conns_per_ip"`
	// TCPFirstFrameTimeout closes a TCP connection whose first frame has
	// not come this long after it was accepted. Default
	// DefaultTCPFirstFrameTimeout.
	TCPFirstFrameTimeout time.Duration `yaml:"tcp_first_frame_timeout"`
	// TCPIdleTimeout closes a TCP connection that sent nothing for this
	// long. Default IdleTimeout.
	TCPIdleTimeout time.Duration `yaml:"tcp_idle_timeout"`
	// FlowStore, if set, turns the flow cache on (flowcache.go,
	// docs/relay.md "Flow cache"): it is the store shared by the cluster's
	// relays (internal/flowstore is the Redis one); confirmed flows are
	// written to it, and DTLS/RTP/RTCP from a client without a flow is held
	// while it is asked, instead of dropped. Nil (the default): no cache.
	// Not for a Global Relay (Ingress). The relay command builds it from
	// -flow-cache.
	FlowStore FlowStore `yaml:"-"`

	trustedIngress trusted.Prefixes // parsed TrustedIngress
	cacheParams    *cacheParams     // tests: flow cache tunables; nil: defaultCacheParams
	readErrorLimit time.Duration    // tests: how long read errors last before a loop stops (loops.go); 0: default
	misconfigEvery time.Duration    // tests: MisconfigLogInterval's stand-in (misconfig.go); 0: default
}

// Validate checks c and fills in defaults.
func (c *Config) Validate() error {
	var errs []error
	for _, a := range []struct{ name, v string }{{"PublicAddr", c.PublicAddr}, {"InternalAddr", c.InternalAddr}} {
		if a.v == "" {
			errs = append(errs, fmt.Errorf("relay: %s is empty; set a UDP listen address such as \"0.0.0.0:3478\"", a.name))
			continue
		}
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			errs = append(errs, fmt.Errorf("relay: %s %q is not host:port: %w", a.name, a.v, err))
		}
	}
	switch {
	case c.Workers < 0:
		errs = append(errs, fmt.Errorf("relay: Workers is %d; use 0 for one per CPU or a positive count", c.Workers))
	case c.Workers > min(maxWorkers, udpio.MaxGroup):
		errs = append(errs, fmt.Errorf("relay: Workers is %d; at most %d on this OS", c.Workers, min(maxWorkers, udpio.MaxGroup)))
	case c.Workers == 0:
		c.Workers = min(runtime.NumCPU(), maxWorkers, udpio.MaxGroup)
	}
	if c.readErrorLimit <= 0 {
		c.readErrorLimit = defaultReadErrorLimit
	}
	switch {
	case c.PendingTimeout < 0:
		errs = append(errs, fmt.Errorf("relay: PendingTimeout is %v; use 0 for the default %v or a positive duration", c.PendingTimeout, DefaultPendingTimeout))
	case c.PendingTimeout == 0:
		c.PendingTimeout = DefaultPendingTimeout
	}
	switch {
	case c.IdleTimeout < 0:
		errs = append(errs, fmt.Errorf("relay: IdleTimeout is %v; use 0 for the default %v or a positive duration", c.IdleTimeout, DefaultIdleTimeout))
	case c.IdleTimeout == 0:
		c.IdleTimeout = DefaultIdleTimeout
	}
	switch {
	case c.MaxFlows < 0:
		errs = append(errs, fmt.Errorf("relay: MaxFlows is %d; use 0 for the default %d or a positive cap", c.MaxFlows, DefaultMaxFlows))
	case c.MaxFlows == 0:
		c.MaxFlows = DefaultMaxFlows
	}
	rateSet := c.NewFlowsPerIP != 0
	for _, l := range []struct {
		name string
		v    *int
		def  int
		max  int
	}{
		{"MaxPendingPerIP", &c.MaxPendingPerIP, DefaultMaxPendingPerIP, maxLimit},
		{"NewFlowsPerIP", &c.NewFlowsPerIP, DefaultNewFlowsPerIP, maxLimit},
		{"NewFlowsPerSecond", &c.NewFlowsPerSecond, DefaultNewFlowsPerSecond, 1<<32 - 1},
	} {
		switch {
		case *l.v < 0 || *l.v > l.max:
			errs = append(errs, fmt.Errorf("relay: %s is %d; use 0 for the default %d, or 1 to %d", l.name, *l.v, l.def, l.max))
		case *l.v == 0:
			*l.v = l.def
		}
	}
	switch {
	case c.NewFlowBurstPerIP < 0 || c.NewFlowBurstPerIP > maxLimit:
		errs = append(errs, fmt.Errorf("relay: NewFlowBurstPerIP is %d; use 0 for NewFlowsPerIP, or 1 to %d", c.NewFlowBurstPerIP, maxLimit))
	case c.NewFlowBurstPerIP == 0 && rateSet:
		c.NewFlowBurstPerIP = c.NewFlowsPerIP
	case c.NewFlowBurstPerIP == 0:
		c.NewFlowBurstPerIP = DefaultNewFlowBurstPerIP
	}
	if c.TCPAddr != "" {
		if _, _, err := net.SplitHostPort(c.TCPAddr); err != nil {
			errs = append(errs, fmt.Errorf("relay: TCPAddr %q is not host:port such as \"0.0.0.0:443\": %w", c.TCPAddr, err))
		}
	}
	for _, l := range []struct {
		name string
		v    *int
		def  int
	}{{"MaxTCPConns", &c.MaxTCPConns, DefaultMaxTCPConns}, {"MaxTCPConnsPerIP", &c.MaxTCPConnsPerIP, DefaultMaxTCPConnsPerIP}} {
		switch {
		case *l.v < 0:
			errs = append(errs, fmt.Errorf("relay: %s is %d; use 0 for the default %d or a positive cap", l.name, *l.v, l.def))
		case *l.v == 0:
			*l.v = l.def
		}
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"TCPFirstFrameTimeout", &c.TCPFirstFrameTimeout, DefaultTCPFirstFrameTimeout}, {"TCPIdleTimeout", &c.TCPIdleTimeout, c.IdleTimeout}} {
		switch {
		case *d.v < 0:
			errs = append(errs, fmt.Errorf("relay: %s is %v; use 0 for the default %v or a positive duration", d.name, *d.v, d.def))
		case *d.v == 0:
			*d.v = d.def
		}
	}
	switch {
	case c.Batch < 0 || c.Batch > maxBatch:
		errs = append(errs, fmt.Errorf("relay: Batch is %d; use 0 for the default %d, or 1 to %d", c.Batch, DefaultBatch, maxBatch))
	case c.Batch == 0:
		c.Batch = DefaultBatch
	}
	if c.Ingress && c.FlowStore != nil {
		errs = append(errs, errors.New("relay: FlowStore is for cluster relays; a Global Relay (Ingress) keeps no cache"))
	}
	var err error
	if c.trustedIngress, err = trusted.Parse(c.TrustedIngress); err != nil {
		errs = append(errs, fmt.Errorf("relay: TrustedIngress %w", err))
	}
	return errors.Join(errs...)
}

// direction indexes the packet and byte counters.
type direction uint8

const (
	toTransceiver direction = iota // client → transceiver
	toClient                       // transceiver → client
	numDirections
)

var directionNames = [numDirections]string{"to_transceiver", "to_client"}

// counters are one worker's hot counters: each is written by one read loop
// (uncontended atomic adds) and read by Stats and the metrics collector.
type counters struct {
	drops   [NumDropReasons]atomic.Uint64
	packets [numDirections]atomic.Uint64 // forwarded datagrams
	bytes   [numDirections]atomic.Uint64 // forwarded payload bytes, hop header excluded
	_       [64]byte
}

// Relay is a running relay. Its methods are safe for concurrent use.
type Relay struct {
	// Set once by New, never mutated.
	cfg        Config
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

// newRelay builds a relay without sockets: what the handler tests use.
func newRelay(cfg Config, keys *token.Keyring, members *membership.Table, log *slog.Logger) (*Relay, error) {
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
		keys:    keys,
		members: members,
		log:     log,
		epoch:   time.Now(),
		flows:   newFlowTable(cfg.MaxFlows),
	}
	r.misconfig.every = cfg.misconfigEvery
	r.flows.lim = newLimiter(cfg.MaxPendingPerIP, cfg.NewFlowsPerIP, cfg.NewFlowBurstPerIP, cfg.NewFlowsPerSecond)
	r.wait = newWaitRoom(r)
	if cfg.FlowStore != nil {
		p := defaultCacheParams
		if cfg.cacheParams != nil {
			p = *cfg.cacheParams
		}
		r.fc = newFlowCache(r, cfg.FlowStore, p)
		r.flows.onConfirm = r.fc.onConfirm
	}
	r.collector = newCollector(r)
	return r, nil
}

// New binds the public and internal sockets (cfg.Workers of each, sharing
// one port through SO_REUSEPORT), registers the relay's metrics on reg
// (which may be nil) and starts the read loops and the flow sweeper.
func New(cfg Config, keys *token.Keyring, members *membership.Table, reg prometheus.Registerer, log *slog.Logger) (*Relay, error) {
	r, err := newRelay(cfg, keys, members, log)
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
		if cfg.Batch > 1 {
			go r.publicBatchLoop(w)
			go r.internalBatchLoop(w)
		} else {
			go r.publicLoop(w)
			go r.internalLoop(w)
		}
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

// handlePublic decides what to do with a datagram from client from on the
// public socket. buf holds hop.MaxHeaderLen bytes of headroom followed by the
// datagram; on forward, the header is written into the headroom in front of
// the payload (no copy) and out is the header plus payload, to be sent from
// the internal socket to to. from must be canonical (unmapped).
func (r *Relay) handlePublic(from netip.AddrPort, buf []byte, now time.Time) (to netip.AddrPort, out []byte, drop DropReason) {
	if pkt := buf[hop.MaxHeaderLen:]; len(pkt) > 0 && pkt[0] == hop.Magic && len(r.cfg.trustedIngress) > 0 {
		return r.handleFromIngress(from, pkt, now)
	}
	return r.fromClient(from, netip.AddrPort{}, buf, hop.MaxHeaderLen, now)
}

// fromClient forwards client datagram buf[off:] from client, which arrived
// directly (via invalid) or through the Global Relay via. On forward the
// hop header for client is written just before off, which must leave room
// for it, and out is the header plus payload.
func (r *Relay) fromClient(client, via netip.AddrPort, buf []byte, off int, now time.Time) (to netip.AddrPort, out []byte, drop DropReason) {
	pkt := buf[off:]
	if len(pkt) > hop.MaxPayload {
		return to, nil, DropTooBig
	}
	kind := stunpeek.Classify(pkt)
	if kind == stunpeek.KindOther {
		return to, nil, DropUnknownFirstByte
	}
	t := r.mono(now)
	to, hit := r.flows.touch(client, t)
	switch {
	case !hit && kind != stunpeek.KindSTUN:
		if r.fc == nil || hop.IsTCP(client) {
			// A TCP client's flow lives as long as its connection,
			// which begins with a check: there is nothing to look up.
			return to, nil, DropNotSTUNOnMiss
		}
		// Hold it and ask the flow cache (flowcache.go).
		if to, drop = r.fc.hold(client, via, pkt, t); drop != dropNone {
			return netip.AddrPort{}, nil, drop
		}
		if !to.IsValid() {
			return to, nil, dropNone // held: the third outcome
		}
		// The cache restored the flow meanwhile: ride it.
		if !r.members.Contains(to) {
			return netip.AddrPort{}, nil, DropTransceiverGone
		}
	case !hit:
		if to, drop = r.admit(client, via, pkt, now, t); drop != dropNone {
			return to, nil, drop
		}
		if !to.IsValid() {
			return to, nil, dropNone // held until a cap lets it through (wait.go)
		}
	case kind == stunpeek.KindSTUN:
		to = r.restart(client, via, pkt, to, now, t)
		fallthrough
	default:
		if !r.members.Contains(to) {
			return netip.AddrPort{}, nil, DropTransceiverGone
		}
	}
	start := off - hop.HeaderLen(client.Addr())
	hop.PutHeader(buf[start:], hop.TypeFor(client), client)
	return to, buf[start:], dropNone
}

// admit is the first-packet path for STUN from a client without a flow:
// peek the Binding request's USERNAME, open the token in its server ufrag,
// check cluster and membership, and create a pending flow. A request a
// per-source cap turns away for the moment is held instead (wait.go): then
// the destination is invalid and the drop none.
func (r *Relay) admit(from, via netip.AddrPort, pkt []byte, now time.Time, t int64) (netip.AddrPort, DropReason) {
	user, res := stunpeek.PeekBindingRequest(pkt)
	switch res {
	case stunpeek.OK:
	case stunpeek.NotBindingRequest:
		return netip.AddrPort{}, DropSTUNNotBindingRequest
	case stunpeek.NoUsername:
		return netip.AddrPort{}, DropNoUsername
	case stunpeek.UsernameTooLong:
		return netip.AddrPort{}, DropUsernameMalformed
	default:
		return netip.AddrPort{}, DropSTUNMalformed
	}
	ufrag, ok := stunpeek.ServerUfrag(user)
	if !ok {
		return netip.AddrPort{}, DropUsernameMalformed
	}
	dst, tr, drop := r.route(ufrag, now)
	if drop != dropNone {
		return netip.AddrPort{}, drop
	}
	if drop := r.flows.upsertVia(from, dst, via, tr, ufrag, t); drop != dropNone {
		if holdable(drop) && r.wait.hold(from, via, dst, tr, ufrag, pkt, drop, t) {
			return netip.AddrPort{}, dropNone // held: delayed, not refused (wait.go)
		}
		return netip.AddrPort{}, drop
	}
	return dst, dropNone
}

// restart handles STUN from a client that has a flow towards dst. A Binding
// request whose server ufrag differs from the one that created the flow and
// is a valid token for a member is an ICE restart: for the same transceiver
// it re-points the flow at once; for another one it becomes the flow's
// candidate, which the request goes to and which takes the flow over when
// its transceiver answers (restart.go). Anything else
// (consent checks with the same ufrag, malformed STUN, an invalid new token)
// rides the existing flow unchanged: an invalid token never changes a flow.
func (r *Relay) restart(from, via netip.AddrPort, pkt []byte, dst netip.AddrPort, now time.Time, t int64) netip.AddrPort {
	user, ok := stunpeek.BindingRequestUsername(pkt)
	if !ok {
		return dst
	}
	ufrag, ok := stunpeek.ServerUfrag(user)
	if !ok {
		return dst
	}
	switch m, cand := r.flows.matchUfrag(from, ufrag); m {
	case ufragCurrent:
		// The client's path may have moved to another Global Relay (or
		// from one to none): replies follow its consent checks.
		r.flows.setVia(from, via)
		return dst
	case ufragCandidate:
		return cand
	}
	ndst, tr, drop := r.route(ufrag, now)
	switch {
	case drop != dropNone:
		return dst
	case ndst == dst:
		// Same transceiver: nothing moves, so no confirmation is needed.
		if r.flows.upsertVia(from, ndst, via, tr, ufrag, t) != dropNone {
			return dst
		}
	case !r.flows.propose(from, ndst, via, tr, ufrag, t):
		// Another transceiver: only a candidate until it answers (restart.go).
		return dst
	}
	return ndst
}

// route opens a routing token and resolves its transceiver.
func (r *Relay) route(ufrag []byte, now time.Time) (netip.AddrPort, uint32, DropReason) {
	c, err := r.keys.Open(ufrag, now)
	switch err {
	case nil:
	case token.ErrForged:
		return netip.AddrPort{}, 0, DropTokenForged
	case token.ErrUnknownKey:
		return netip.AddrPort{}, 0, DropTokenUnknownKey
	case token.ErrExpired:
		return netip.AddrPort{}, 0, DropTokenExpired
	default:
		return netip.AddrPort{}, 0, DropTokenMalformed
	}
	if r.cfg.Ingress {
		// A Global Relay: the table maps cluster ids to cluster relays.
		dst, ok := r.members.Lookup(uint32(c.Cluster))
		if !ok {
			return netip.AddrPort{}, 0, DropUnknownCluster
		}
		return dst, uint32(c.Cluster), dropNone
	}
	if c.Cluster != r.cfg.Cluster {
		r.noteDrop(DropWrongCluster, uint32(c.Cluster))
		return netip.AddrPort{}, 0, DropWrongCluster
	}
	dst, ok := r.members.Lookup(c.Transceiver)
	if !ok {
		r.noteDrop(DropUnknownTransceiver, c.Transceiver)
		return netip.AddrPort{}, 0, DropUnknownTransceiver
	}
	return dst, c.Transceiver, dropNone
}

// handleInternal decides what to do with datagram b from transceiver from
// on the internal socket: out is the client payload (aliasing b, unchanged)
// to send from the public socket to the client to. from must be canonical.
func (r *Relay) handleInternal(from netip.AddrPort, b []byte, now time.Time) (to netip.AddrPort, out []byte, drop DropReason) {
	if !r.members.Contains(from) {
		return to, nil, DropInternalUnknownPeer
	}
	typ, client, payload, err := hop.ParseHeader(b)
	if err != nil {
		return to, nil, DropInternalBadHeader
	}
	if len(payload) == 0 {
		return to, nil, DropInternalEmptyPayload
	}
	if len(payload) > hop.MaxPayload {
		return to, nil, DropTooBig
	}
	client = hop.ClientOf(typ, client)
	t := r.mono(now)
	via, drop := r.flows.reply(client, from, t)
	// A TCP client is never relearned: its flow went with its
	// connection, and a new connection begins with a check.
	if drop == DropInternalNoFlow && r.cfg.Relearn && typ == hop.TypeData {
		// The flow records from's real id (Contains above said it has one).
		id, _ := r.members.ID(from)
		if drop = r.flows.relearn(client, from, id, t); drop == dropNone {
			return client, payload, dropNone
		}
	}
	if drop != dropNone {
		return to, nil, drop
	}
	if via.IsValid() {
		// The client is behind a Global Relay: send it the datagram as
		// it came, header naming the client and all.
		return via, b, dropNone
	}
	if typ == hop.TypeDataTCP {
		// Taken: copied into the client's connection queue, whose writer
		// sends it (tcp.go); a full queue drops its oldest audio.
		return netip.AddrPort{}, nil, r.tcp.deliver(client, payload)
	}
	return client, payload, dropNone
}

// sweepInterval is how often the sweeper runs: a quarter of the shorter
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

// Stats is a snapshot of the relay's counters.
type Stats struct {
	Flows        int // flows in the table, pending and confirmed
	PendingFlows int // flows whose transceiver has not answered yet
	FlowsCreated uint64
	// FlowsRelearned counts flows rebuilt from a member's traffic (Config.Relearn).
	FlowsRelearned uint64
	// FlowsRestored counts flows recreated from the flow cache (Config.FlowStore).
	FlowsRestored uint64
	// FlowsExpired counts flows removed by the sweeper, by the state they were in.
	FlowsExpiredPending, FlowsExpiredConfirmed uint64

	// Forwarded datagrams and their payload bytes (hop header excluded).
	ToTransceiverPackets, ToTransceiverBytes uint64
	ToClientPackets, ToClientBytes           uint64

	// Drops counts dropped datagrams by reason; Drops[0] is unused.
	Drops [NumDropReasons]uint64
	// PublicSocketDrops and InternalSocketDrops count datagrams the
	// kernel dropped at the public and the internal sockets, all workers
	// together, because their receive buffers were full (udpio.Drops;
	// 0 where the OS does not tell): the relay never read them, so they
	// are in no Drops reason.
	PublicSocketDrops, InternalSocketDrops uint64

	// FlowCache is zero without the flow cache (Config.FlowStore).
	FlowCache FlowCacheStats
	// TCP is zero without ICE-TCP (Config.TCPAddr). Frames it dropped are
	// in Drops too.
	TCP TCPStats
	// Waiting are the first packets a per-source cap delayed (wait.go):
	// held now, and counted by what became of them. Those it forwarded
	// are in ToTransceiverPackets, those it dropped in Drops.
	Waiting  int
	Held     uint64 // requests held (a client's retransmission replacing its held one counts again)
	Admitted uint64 // held requests forwarded once a cap let them through
	Expired  uint64 // held requests dropped after waitHold (2 s)
	NotHeld  uint64 // requests the waiting room had no room for (dropped)
}

// TCPStats are the ICE-TCP side's counters (tcp.go).
type TCPStats struct {
	// Open is the number of open connections, Established those whose
	// first frame was admitted.
	Open, Established int
	// Accepted counts connections accepted (refused ones included).
	Accepted uint64
	// Closed counts connections closed or refused, by reason.
	Closed [NumTCPCloseReasons]uint64
	// Frames forwarded and their packets' bytes (framing and hop header
	// excluded): client → transceiver, and transceiver → client as
	// written to the connections.
	ToTransceiverFrames, ToTransceiverBytes uint64
	ToClientFrames, ToClientBytes           uint64
}

// FlowCacheStats are the flow cache's counters (flowcache.go). Held
// datagrams the cache forwards are in ToTransceiverPackets too, and those
// it drops in Drops.
type FlowCacheStats struct {
	Up bool // the last call to the cache worked (or none failed yet)
	// Held counts datagrams held for a lookup.
	Held uint64
	// Forwarded counts held datagrams sent to a transceiver.
	Forwarded uint64
	// Lookups are clients looked up, by result.
	Hits, Misses, Stale, Errors, Refused uint64
	// Writes are flows written (OK), in a failed write (Failed), or not
	// written because the cache was backing off or the queue was full (Skipped).
	WritesOK, WritesFailed, WritesSkipped uint64
}

// Dropped returns the total of all drops.
func (s Stats) Dropped() uint64 {
	var n uint64
	for _, d := range s.Drops {
		n += d
	}
	return n
}

// Stats returns a snapshot of the counters. Counters are read one by one,
// so a snapshot taken under load is not exactly consistent across fields.
func (r *Relay) Stats() Stats {
	var s Stats
	s.Flows = int(r.flows.n.Load())
	s.PendingFlows = int(r.flows.pending.Load())
	s.FlowsCreated = r.flows.created.Load()
	s.FlowsRelearned = r.flows.relearned.Load()
	s.FlowsRestored = r.flows.restored.Load()
	s.FlowsExpiredPending = r.flows.expired[0].Load()
	s.FlowsExpiredConfirmed = r.flows.expired[1].Load()
	cs := make([]*counters, 0, len(r.workers)+1)
	for _, w := range r.workers {
		cs = append(cs, &w.c)
		for i, c := range [2]*net.UDPConn{w.public, w.internal} {
			if d, err := udpio.Drops(c); err == nil { // a closed socket keeps its last count
				w.sockDrops[i].Store(d)
			}
		}
		s.PublicSocketDrops += w.sockDrops[0].Load()
		s.InternalSocketDrops += w.sockDrops[1].Load()
	}
	if fc := r.fc; fc != nil {
		cs = append(cs, &fc.c)
		s.FlowCache = FlowCacheStats{
			Up:            fc.up.Load(),
			Held:          fc.held.Load(),
			Forwarded:     fc.c.packets[toTransceiver].Load(),
			Hits:          fc.lookedUp[lookupHit].Load(),
			Misses:        fc.lookedUp[lookupMiss].Load(),
			Stale:         fc.lookedUp[lookupStale].Load(),
			Errors:        fc.lookedUp[lookupError].Load(),
			Refused:       fc.lookedUp[lookupRefused].Load(),
			WritesOK:      fc.writes[writeOK].Load(),
			WritesFailed:  fc.writes[writeError].Load(),
			WritesSkipped: fc.writes[writeSkipped].Load(),
		}
	}
	if w := r.wait; w != nil {
		cs = append(cs, &w.c)
		s.Waiting = int(w.held.Load())
		s.Held, s.Admitted = w.results[waitHeld].Load(), w.results[waitAdmitted].Load()
		s.Expired, s.NotHeld = w.results[waitExpired].Load(), w.results[waitFull].Load()
	}
	if t := r.tcp; t != nil {
		s.TCP = TCPStats{
			Open:                int(t.open.Load()),
			Established:         int(t.established.Load()),
			Accepted:            t.accepted.Load(),
			ToTransceiverFrames: t.frames[toTransceiver].Load(),
			ToTransceiverBytes:  t.bytes[toTransceiver].Load(),
			ToClientFrames:      t.frames[toClient].Load(),
			ToClientBytes:       t.bytes[toClient].Load(),
		}
		for i := range s.TCP.Closed {
			s.TCP.Closed[i] = t.closes[i].Load()
		}
		for i := range s.Drops {
			s.Drops[i] += t.drops[i].Load()
		}
	}
	for _, c := range cs {
		for i := range s.Drops {
			s.Drops[i] += c.drops[i].Load()
		}
		s.ToTransceiverPackets += c.packets[toTransceiver].Load()
		s.ToTransceiverBytes += c.bytes[toTransceiver].Load()
		s.ToClientPackets += c.packets[toClient].Load()
		s.ToClientBytes += c.bytes[toClient].Load()
	}
	return s
}
