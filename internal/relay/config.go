package relay

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
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
	// DefaultBatch is the default number of datagrams per recvmmsg/sendmmsg.
	DefaultBatch = 64
	// maxBatch bounds Config.Batch.
	maxBatch = 1024
	// batchSlot is the size of one message buffer of the read loops:
	// hop.MaxHeaderLen of headroom and the datagram. Datagrams the slot
	// truncates are dropped as DropTooBig, and so are client payloads
	// longer than hop.MaxPayload, the path's one limit.
	batchSlot = 2048
	// MaxBatchedPayload is the most a read loop's slot holds of a client
	// payload; it must stay above hop.MaxPayload, which is what the relay
	// forwards (either direction).
	MaxBatchedPayload = batchSlot - hop.MaxHeaderLen
)

// A slot holds any datagram the relay forwards (compile-time check).
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
	// recvmmsg(2) and sends per sendmmsg(2), from 1 to 1024. 0 means
	// DefaultBatch.
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
