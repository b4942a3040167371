package config

import (
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/demo"
	"github.com/switchboard-rtc/switchboard/internal/director"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/playout"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// FlagSets returns a new flag set of each server subcommand, keyed by the
// subcommand's name, bound to a zero config: what `switchboard <name> -h`
// lists, -config included.
func FlagSets() map[string]*flag.FlagSet {
	return map[string]*flag.FlagSet{
		"demo":        new(Demo).Flags(),
		"relay":       new(Relay).Flags(),
		"transceiver": new(Transceiver).Flags(),
		"agent":       new(Agent).Flags(),
		"director":    new(Director).Flags(),
	}
}

// newFlagSet returns an empty flag set of subcommand name that returns
// errors (flag.ContinueOnError).
func newFlagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet(name, flag.ContinueOnError)
}

// describe has fs's usage open with synopsis (after "Usage: switchboard
// "), then about, a paragraph on what the command does, then its flags:
// the shape `switchboard <command> -h` prints for every command. Call it
// before done, whose file-only settings follow the flags.
func describe(fs *flag.FlagSet, synopsis, about string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: switchboard %s\n\n%s\n\nFlags:\n", synopsis, about)
		fs.PrintDefaults()
	}
}

// done adds -config with the file-only settings, and names each flag's
// environment variable in its help.
func done(fs *flag.FlagSet, fileOnly ...FileOnly) *flag.FlagSet {
	AddFileFlag(fs, fileOnly...)
	nameEnv(fs)
	return fs
}

// Demo configures `switchboard demo`.
type Demo struct {
	HTTP  string `yaml:"http"`
	Relay string `yaml:"relay"`
	TCP   bool   `yaml:"tcp"`
	Mode  string `yaml:"mode"`
	Ptime int    `yaml:"ptime"`
	DTLS  string `yaml:"dtls_version"`
	SPED  bool   `yaml:"sped"`
	// The parrot's turn detection (JSON) and reply delay (ParrotOptions).
	TurnDetection string        `yaml:"turn_detection"`
	ReplyDelay    time.Duration `yaml:"reply_delay"`
	Log           Log           `yaml:",inline"`
}

// Flags returns the demo's flag set, bound to c.
func (c *Demo) Flags() *flag.FlagSet {
	fs := newFlagSet("demo")
	fs.StringVar(&c.Mode, "mode", agent.ModeParrot, "agent: parrot (a conversation: it answers with what you said, and stops when you talk over it) or echo")
	fs.StringVar(&c.HTTP, "http", demo.DefaultHTTPAddr, "address of the web page, signaling API and /metrics")
	fs.StringVar(&c.Relay, "relay", demo.DefaultRelayAddr, "relay public UDP address (advertised in answers); the relay's ICE-TCP listener takes the same address, TCP")
	fs.BoolVar(&c.TCP, "tcp", true, "listen for ICE-TCP clients on the -relay address (TCP) and offer it in answers as a passive TCP candidate, for networks that drop UDP")
	fs.IntVar(&c.Ptime, "ptime", demo.DefaultPtime, "ms of audio per RTP packet to and from the browser: 20 or 10 (as the transceiver's -ptime)")
	fs.StringVar(&c.DTLS, "dtls-version", transceiver.DefaultDTLSVersion, "highest DTLS version negotiated: 1.2 or 1.3 (as the transceiver's -dtls-version)")
	fs.BoolVar(&c.SPED, "sped", transceiver.DefaultSPED, "answer offers whose a=ice-options has sped, googspedv1 or goog-sped-v1 with it: DTLS 1.3 in the ICE checks (as the transceiver's -sped)")
	registerParrotFlags(fs, &c.TurnDetection, &c.ReplyDelay)
	c.Log.RegisterFlags(fs, "text", "the -http address")
	describe(fs, "demo [flags]",
		"Runs a relay, a transceiver, the reference agent (-mode) and a web page in\n"+
			"one process, on loopback: open the -http address in a browser and click\n"+
			"Call. Nothing to configure; the flags move its addresses.")
	return done(fs)
}

// Membership sources a relay can fill its table from (-membership).
const (
	MembershipStatic     = "static"
	MembershipKubernetes = "kubernetes"
	MembershipRedis      = "redis"
)

// Membership selects and configures the relay's membership source.
type Membership struct {
	Source     string `yaml:"membership"`
	Kubeconfig string `yaml:"kubeconfig"`
	Namespace  string `yaml:"kube_namespace"`
	Service    string `yaml:"kube_service"`
	PortName   string `yaml:"kube_port"`
	IDOffset   uint   `yaml:"kube_id_offset"`
	Redis      string `yaml:"redis"`
}

// RegisterFlags adds -membership, -kube-* and -redis to fs, writing into m.
func (m *Membership) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&m.Source, "membership", MembershipStatic, "membership source: static (-members), kubernetes (EndpointSlices of -kube-service) or redis (transceivers registered with -redis)")
	fs.StringVar(&m.Kubeconfig, "kubeconfig", "", "kubeconfig file for -membership kubernetes (empty: the in-cluster service account)")
	fs.StringVar(&m.Namespace, "kube-namespace", "", "namespace of -kube-service (empty: the pod's own namespace)")
	fs.StringVar(&m.Service, "kube-service", "", "headless Service of the transceiver StatefulSet, for -membership kubernetes")
	fs.StringVar(&m.PortName, "kube-port", membership.DefaultKubePortName, "name of the internal-hop UDP port in that Service")
	fs.UintVar(&m.IDOffset, "kube-id-offset", 0, "transceiver id = pod ordinal + this offset")
	fs.StringVar(&m.Redis, "redis", "", "Redis host:port of the membership registry, for -membership redis")
}

// Relay configures `switchboard relay`.
type Relay struct {
	Relay     relay.Config  `yaml:",inline"`
	Drain     time.Duration `yaml:"drain_timeout"`
	FlowCache string        `yaml:"flow_cache"`
	Members   []string      `yaml:"members"` // id=ip:port items, for membership.Static
	Source    Membership    `yaml:",inline"`
	Metrics   string        `yaml:"metrics"`
	Keys      Keys          `yaml:",inline"`
	Log       Log           `yaml:",inline"`
}

// Flags returns the relay's flag set, bound to c.
func (c *Relay) Flags() *flag.FlagSet {
	fs := newFlagSet("relay")
	r := &c.Relay
	fs.StringVar(&r.PublicAddr, "public", relay.DefaultPublicAddr, "public UDP address clients send to (the VIP:port)")
	fs.StringVar(&r.InternalAddr, "internal", relay.DefaultInternalAddr, "UDP address of the internal hop to and from transceivers")
	fs.StringVar(&r.TCPAddr, "tcp", "", "TCP address of ICE-TCP clients (RFC 6544), e.g. 0.0.0.0:443, for networks that drop UDP; the transceivers' -advertise-tcp is how clients reach it (empty: no TCP)")
	fs.IntVar(&r.MaxTCPConns, "max-tcp-conns", relay.DefaultMaxTCPConns, "open ICE-TCP connections in all; beyond it new ones are reset and counted")
	fs.IntVar(&r.MaxTCPConnsPerIP, "max-tcp-conns-per-ip", relay.DefaultMaxTCPConnsPerIP, "open ICE-TCP connections of one source IP (IPv6: /64); beyond it new ones are reset and counted")
	fs.DurationVar(&r.TCPFirstFrameTimeout, "tcp-first-frame-timeout", relay.DefaultTCPFirstFrameTimeout, "close an ICE-TCP connection whose first frame (a Binding request with a valid token) has not come this long after it opened")
	fs.DurationVar(&r.TCPIdleTimeout, "tcp-idle-timeout", 0, "close an ICE-TCP connection that sent nothing this long (0 = -idle-timeout)")
	fs.DurationVar(&c.Drain, "drain-timeout", relay.DefaultDrainTimeout, "on SIGTERM with -tcp, how long open ICE-TCP connections may go on (new ones are refused and /ready fails meanwhile); UDP needs no drain")
	clusterVar(fs, &r.Cluster)
	fs.IntVar(&r.Workers, "workers", 0, "public-socket read loops sharing the port with SO_REUSEPORT (0 = one per CPU)")
	fs.DurationVar(&r.PendingTimeout, "pending-timeout", relay.DefaultPendingTimeout, "lifetime of a flow the transceiver has not answered yet")
	fs.DurationVar(&r.IdleTimeout, "idle-timeout", relay.DefaultIdleTimeout, "idle timeout of a confirmed flow (longer than ICE consent, 30s)")
	fs.IntVar(&r.MaxFlows, "max-flows", relay.DefaultMaxFlows, "flow table capacity; new flows beyond it are dropped and counted")
	fs.IntVar(&r.MaxPendingPerIP, "max-pending-per-ip", relay.DefaultMaxPendingPerIP, "pending (unanswered) flows one source IP (IPv6: /64) may hold; beyond it its new flows are dropped and counted")
	fs.IntVar(&r.NewFlowsPerIP, "new-flows-per-ip", relay.DefaultNewFlowsPerIP, "flows per second one source IP (IPv6: /64) may create beyond its burst; a client over it is delayed (given a turn up to 1 s ahead), beyond that refused, both counted")
	fs.IntVar(&r.NewFlowBurstPerIP, "new-flow-burst-per-ip", relay.DefaultNewFlowBurstPerIP, "flows one source IP (IPv6: /64) may create at once before -new-flows-per-ip paces it: as many as a transceiver admits sessions not yet connected per client address (-max-pending-per-client) (0 = -new-flows-per-ip)")
	fs.IntVar(&r.NewFlowsPerSecond, "new-flows-per-second", relay.DefaultNewFlowsPerSecond, "flows all sources together may create per second; beyond it new flows are dropped and counted")
	fs.BoolVar(&r.Relearn, "relearn", true, "rebuild a lost flow (relay restart) from a transceiver's datagram for the client, trusting members to name only their clients")
	fs.BoolVar(&r.Ingress, "ingress", false, "run as a Global Relay: route tokens by cluster; -members then lists cluster id=cluster relay public ip:port")
	listVar(fs, &r.TrustedIngress, "trusted-ingress", "comma-separated CIDR prefixes of Global Relays whose hop-framed datagrams the public socket accepts")
	fs.StringVar(&c.FlowCache, "flow-cache", "", "Redis of the cluster's flow cache, as host:port, redis://[[user]:password@]host[:port][/db], or rediss://… (TLS): confirmed flows are written there, and a client's DTLS/RTP without a flow is held while it is looked up (docs/relay.md); empty: no cache")
	listVar(fs, &c.Members, "members", "static membership: transceiver id=internal ip:port, comma separated, e.g. 1=10.0.0.5:4000,2=10.0.0.6:4000")
	fs.StringVar(&c.Metrics, "metrics", relay.DefaultMetricsAddr, "address serving /metrics, /live and /ready (empty disables)")
	c.Source.RegisterFlags(fs)
	c.Keys.RegisterFlags(fs)
	c.Log.RegisterFlags(fs, "json", "the -metrics address")
	describe(fs, "relay -token-key KEY -members ID=IP:PORT,... [flags]",
		"Forwards clients' UDP from the public address (-public, the VIP:port in\n"+
			"answers) to the transceiver that the routing token in each session's ICE\n"+
			"ufrag names, over the internal hop (-internal), and back (docs/relay.md).\n"+
			"Transceivers come from -membership: a static -members list, a Kubernetes\n"+
			"Service's EndpointSlices, or a Redis registry.")
	return done(fs,
		FileOnly{"batch", fmt.Sprintf("datagrams per recvmmsg/sendmmsg of each read loop, 1 to 1024 (default %d)", relay.DefaultBatch)},
	)
}

// Transceiver configures `switchboard transceiver`.
type Transceiver struct {
	Trx   transceiver.Config `yaml:",inline"`
	HTTP  string             `yaml:"http"`
	Drain time.Duration      `yaml:"drain_timeout"`
	Redis string             `yaml:"redis"`
	HopAd string             `yaml:"hop_advertise"`
	Keys  Keys               `yaml:",inline"`
	Log   Log                `yaml:",inline"`
}

// Flags returns the transceiver's flag set, bound to c.
func (c *Transceiver) Flags() *flag.FlagSet {
	fs := newFlagSet("transceiver")
	t := &c.Trx
	fs.Func("id", "transceiver id carried in tokens; relays map it to -listen (required, 1-4294967295)", func(s string) error {
		var v uint32
		if _, err := fmt.Sscan(s, &v); err != nil || v == 0 {
			return fmt.Errorf("want a number from 1 to 4294967295")
		}
		t.ID = v
		return nil
	})
	clusterVar(fs, &t.Cluster)
	fs.StringVar(&t.ListenAddr, "listen", transceiver.DefaultListenAddr, "UDP address of the internal-hop socket relays send to")
	fs.StringVar(&t.Advertise, "advertise", "", "relay public ip:port put in answers as the one candidate (required unless -direct)")
	fs.StringVar(&t.AdvertiseTCP, "advertise-tcp", "", "relay VIP's ICE-TCP ip:port (the relays' -tcp as clients reach it, e.g. 203.0.113.10:443), put in answers as a passive TCP candidate below the UDP one; a region's ingress gets its own IP at this port (empty: UDP only)")
	listVar(fs, &t.AllowRelays, "allow-relays", "comma-separated CIDR prefixes relays may send from (default: loopback and private ranges)")
	fs.StringVar(&t.BackendURL, "backend", transceiver.DefaultBackendURL, "backend bridge WebSocket URL")
	fs.DurationVar(&t.SetupTimeout, "setup-timeout", transceiver.DefaultSetupTimeout, "end sessions not connected this long after the offer")
	fs.IntVar(&t.MaxSessions, "max-sessions", transceiver.DefaultMaxSessions, "concurrent session cap; offers beyond it get 503")
	fs.DurationVar(&t.DisconnectedTimeout, "disconnected-timeout", transceiver.DefaultDisconnectedTimeout, "tell the backend a client is disconnected after it sent nothing this long")
	fs.DurationVar(&t.ConsentTimeout, "consent-timeout", transceiver.DefaultConsentTimeout, "end a session whose client sent nothing this long (RFC 7675 consent expiry: 30s)")
	fs.IntVar(&t.MaxPendingPerClient, "max-pending-per-client", transceiver.DefaultMaxPendingPerClient, "sessions not yet connected per client address (IPv4, IPv6 /64); offers beyond get 429")
	fs.IntVar(&t.MaxPending, "max-pending", transceiver.DefaultMaxPending, "sessions not yet connected in total; offers beyond get 503")
	fs.DurationVar(&t.CheckTimeout, "check-timeout", transceiver.DefaultCheckTimeout, "end a session whose client sent no authenticated connectivity check this long after the answer")
	listVar(fs, &t.TrustedProxies, "trusted-proxies", "comma-separated CIDR prefixes of proxies (director, load balancer) whose X-Forwarded-For names the client")
	fs.StringVar(&t.DTLSRole, "dtls-role", transceiver.DefaultDTLSRole, "DTLS role in answers to actpass offers: client (active) or server (passive, no HelloVerify)")
	fs.StringVar(&t.DTLSVersion, "dtls-version", transceiver.DefaultDTLSVersion, "highest DTLS version negotiated: 1.2 or 1.3 (a client without 1.3 gets 1.2)")
	fs.BoolVar(&t.SPED, "sped", transceiver.DefaultSPED, "answer offers whose a=ice-options has sped, googspedv1 or goog-sped-v1 (Chromium's WebRTC-IceHandshakeDtls) with it: the DTLS 1.3 handshake rides in the ICE checks, a round trip sooner (the transceiver is then the DTLS server)")
	fs.StringVar(&c.HTTP, "http", transceiver.DefaultHTTPAddr, "address of the signaling API, /metrics, /live and /ready")
	fs.DurationVar(&c.Drain, "drain-timeout", transceiver.DefaultDrainTimeout, "on SIGTERM, how long live sessions may run on before they are ended")
	fs.BoolVar(&t.Direct, "direct", false, "clients send straight to -listen (no relay, no internal hop); -advertise defaults to -listen")
	fs.StringVar(&c.Redis, "redis", "", "Redis host:port to register in (relays with -membership redis find this transceiver there); empty: no registration")
	fs.IntVar(&t.OutputBitrate, "output-bitrate", audio.DefaultBitrate, "Opus bitrate (bit/s) of audio encoded from PCM backends")
	fs.IntVar(&t.OutputComplexity, "output-complexity", audio.DefaultComplexity, "Opus encoder complexity (1-10) of audio encoded from PCM backends: CPU per frame against search effort (libopus's default is 10)")
	fs.IntVar(&t.Ptime, "ptime", transceiver.DefaultPtime, "ms of audio per RTP packet to and from clients: 20, or 10 (answers carry a=ptime:10; a few ms less per reply at twice the packets per session)")
	fs.DurationVar(&t.OutputQueueMax, "output-queue-max", playout.DefaultMaxQueued, "cap on a session's queued output audio; past it backend audio is refused (error output_queue_full)")
	fs.StringVar(&t.EchoDumpDir, "echo-dump-dir", "", "directory where each session with echo cancellation writes its canceller's inputs (the audio played and heard: users' voices) for offline replay (go test ./internal/apm -run TestReplay -apm.replay=DIR); empty: none")
	fs.DurationVar(&t.ReportInterval, "report-interval", transceiver.DefaultReportInterval, "interval of each session's RTCP sender and receiver reports (100ms to 10s)")
	fs.StringVar(&c.HopAd, "hop-advertise", "", "internal-hop ip:port registered for relays (default: -listen, which must then be a concrete IP)")
	RegisterAuthFlags(fs, &t.Auth)
	c.Keys.RegisterFlags(fs)
	c.Log.RegisterFlags(fs, "json", "the -http address")
	describe(fs, "transceiver -id N -advertise IP:PORT -token-key KEY [flags]",
		"Terminates clients' WebRTC sessions (ICE, DTLS-SRTP, data channels) on one\n"+
			"UDP socket (-listen) that relays forward to, answers offers on the\n"+
			"signaling API at -http (POST /v1/calls, docs/signaling.md), and bridges\n"+
			"each session's audio and events to the backend over a WebSocket\n"+
			"(-backend, docs/bridge.md). On SIGTERM it fails /ready and lets live\n"+
			"sessions run on for up to -drain-timeout.")
	return done(fs,
		FileOnly{"ingress_by_region", "region → Global Relay ip:port advertised to that region's clients (docs/director.md)"},
	)
}

// Agent configures `switchboard agent`.
type Agent struct {
	Listen string `yaml:"listen"`
	Mode   string `yaml:"mode"`
	Format string `yaml:"format"`
	// The parrot's turn detection (JSON) and reply delay (ParrotOptions).
	TurnDetection string        `yaml:"turn_detection"`
	ReplyDelay    time.Duration `yaml:"reply_delay"`
	Log           Log           `yaml:",inline"`
}

// Flags returns the agent's flag set, bound to c.
func (c *Agent) Flags() *flag.FlagSet {
	fs := newFlagSet("agent")
	fs.StringVar(&c.Listen, "listen", agent.DefaultListenAddr, "HTTP address serving the bridge (WebSocket) at /v1/bridge, and /live")
	fs.StringVar(&c.Mode, "mode", agent.ModeParrot, "parrot (turn detection at the edge; replies with what the user said) or echo (sends every frame back)")
	fs.StringVar(&c.Format, "format", "", "audio format: parrot pcm16/24000/1 (default) or pcm16/16000/1; echo opus/48000/2 (default), pcm16/24000/1 or pcm16/16000/1")
	registerParrotFlags(fs, &c.TurnDetection, &c.ReplyDelay)
	c.Log.RegisterFlags(fs, "json", "the -listen address")
	describe(fs, "agent [flags]",
		"The reference backend: serves the bridge protocol (docs/bridge.md) at\n"+
			"ws://<-listen>/v1/bridge, the URL of transceivers' -backend. -mode parrot\n"+
			"asks for PCM and turn detection and answers each turn with what the user\n"+
			"said, stopping when talked over; -mode echo sends every audio frame and\n"+
			"data-channel message back.")
	return done(fs)
}

// ParrotOptions returns the parrot's settings from -turn-detection and
// -reply-delay, or an error saying what to fix.
func (c *Agent) ParrotOptions() (agent.ParrotOptions, error) {
	return parrotOptions(c.TurnDetection, c.ReplyDelay)
}

// ParrotOptions returns the demo parrot's settings from -turn-detection
// and -reply-delay, or an error saying what to fix.
func (c *Demo) ParrotOptions() (agent.ParrotOptions, error) {
	return parrotOptions(c.TurnDetection, c.ReplyDelay)
}

// registerParrotFlags adds -turn-detection and -reply-delay, the parrot's
// settings, to fs.
func registerParrotFlags(fs *flag.FlagSet, td *string, delay *time.Duration) {
	fs.StringVar(td, "turn-detection", "", `parrot: the turn_detection it asks the transceiver for, OpenAI's JSON with Switchboard's members (docs/bridge.md 4.8), e.g. {"pause_duration_ms":200,"resume_false_interruption":true,"idle_timeout_ms":8000}; empty: OpenAI's server VAD defaults. echo (agent only, without -reply-delay): the turn_detection its hello asks for as given, input cleaning members included, e.g. {"interrupt_response":false,"echo_cancellation":{}}, while it still sends every frame back; empty: none`)
	fs.DurationVar(delay, "reply-delay", 0, "parrot: answer each turn this long after its event (input.speech_paused with pause_duration_ms, else input.speech_stopped), as a real pipeline's latency")
}

func parrotOptions(td string, delay time.Duration) (agent.ParrotOptions, error) {
	var o agent.ParrotOptions
	if delay < 0 {
		return o, fmt.Errorf("-reply-delay %v: must not be negative", delay)
	}
	o.ReplyDelay = delay
	if td == "" {
		return o, nil
	}
	t := vad.DefaultTurnDetection()
	if err := json.Unmarshal([]byte(td), &t); err != nil {
		return o, fmt.Errorf("-turn-detection: not a turn_detection JSON object (%v), e.g. {\"pause_duration_ms\":200}", err)
	}
	if err := t.Validate(); err != nil {
		return o, fmt.Errorf("-turn-detection: %w", err)
	}
	o.TurnDetection = &t
	return o, nil
}

// Director configures `switchboard director`.
type Director struct {
	Director director.Config `yaml:",inline"`
	Listen   string          `yaml:"listen"`
	Log      Log             `yaml:",inline"`
}

// Flags returns the director's flag set, bound to c.
func (c *Director) Flags() *flag.FlagSet {
	fs := newFlagSet("director")
	fs.StringVar(&c.Listen, "listen", director.DefaultListenAddr, "HTTP address serving the signaling API (/v1/calls), /metrics, /live and /ready")
	fs.StringVar(&c.Director.Mode, "mode", director.DefaultMode, "proxy (forward the offer) or redirect (307 to the transceiver)")
	fs.StringVar(&c.Director.RegionHeader, "region-header", "", "request header a trusted CDN sets to the client's region (empty: ignore)")
	fs.StringVar(&c.Director.DefaultRegion, "default-region", "", "region used when neither header nor client IP decides (required)")
	RegisterAuthFlags(fs, &c.Director.Auth)
	c.Log.RegisterFlags(fs, "json", "the -listen address")
	describe(fs, "director -config director.yaml [flags]",
		"Routes each offer to a transceiver of the cluster serving the client's region.\n"+
			"Regions, their prefixes and clusters come from the YAML file (keys regions,\n"+
			"clusters, trusted_proxies; see docs/director.md).")
	return done(fs,
		FileOnly{"regions", "region name → {cluster, prefixes}: the client IP prefixes that place a client in the region"},
		FileOnly{"clusters", "cluster name → signaling base URLs of its transceivers, picked round-robin"},
		FileOnly{"trusted_proxies", "CIDR prefixes of proxies whose X-Forwarded-For is believed"},
	)
}
