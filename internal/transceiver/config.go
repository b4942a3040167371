package transceiver

import (
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/playout"
	"github.com/switchboard-rtc/switchboard/internal/rtcpreport"
	"github.com/switchboard-rtc/switchboard/internal/trusted"
)

// DefaultAllowRelays are the prefixes internal-hop datagrams may come from
// when Config.AllowRelays is empty: loopback, RFC 1918, RFC 6598 shared
// address space (some Kubernetes networks), and IPv6 unique-local.
var DefaultAllowRelays = []string{"127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "::1/128", "fc00::/7"}

// Defaults of Config's sockets and session limits; Validate fills the
// zero values of ListenAddr, DTLSRole, SetupTimeout and MaxSessions with
// them. The flags of `switchboard transceiver` start from these and from
// the other Default… constants.
const (
	// DefaultListenAddr is the internal-hop UDP socket, ip:port.
	DefaultListenAddr = "127.0.0.1:4000"
	// DefaultBackendURL is the bridge of a `switchboard agent` on the
	// same host (docs/bridge.md).
	DefaultBackendURL = "ws://127.0.0.1:8081/v1/bridge"
	// DefaultDTLSRole is the role taken in answers to actpass offers:
	// "client" (a=setup:active, RFC 8842 §5.3).
	DefaultDTLSRole = "client"
	// DefaultSPED is Config.SPED's default, which the flag -sped starts
	// from. (A Config built in code sets SPED itself: false is off.)
	DefaultSPED = true
	// DefaultDTLSVersion is Config.DTLSVersion's default: DTLS 1.3, which
	// Chromium and Firefox take (a round trip sooner than 1.2 in role
	// server, as soon or sooner in role client) and the other clients
	// answer with 1.2 (docs/benchmarks.md, "Call setup"; docs/interop.md).
	DefaultDTLSVersion  = "1.3"
	DefaultSetupTimeout = 30 * time.Second
	DefaultMaxSessions  = 10000
	// DefaultHTTPAddr serves the signaling API, /metrics, /live and
	// /ready, ip:port.
	DefaultHTTPAddr = "127.0.0.1:8080"
	// DefaultDrainTimeout is how long live sessions may run on after
	// SIGTERM before they are ended (Server.Drain).
	DefaultDrainTimeout = 30 * time.Second
	// DefaultReportInterval is Config.ReportInterval's default.
	DefaultReportInterval = rtcpreport.DefaultInterval
	// DefaultPtime is Config.Ptime's default, ms: Opus's usual 20 ms
	// packets, which answers do not name.
	DefaultPtime = 20
)

// Defaults for a client that goes silent (consent.go).
const (
	// DefaultDisconnectedTimeout is Config.DisconnectedTimeout's default.
	DefaultDisconnectedTimeout = 5 * time.Second
	// DefaultConsentTimeout is Config.ConsentTimeout's default: RFC 7675
	// §5.1's consent expiry.
	DefaultConsentTimeout = 30 * time.Second
)

// Defaults for sessions not yet connected (pending.go).
const (
	DefaultMaxPendingPerClient = 64
	DefaultMaxPending          = 1000
	DefaultCheckTimeout        = 10 * time.Second
)

// Config configures a transceiver. Validate fills defaults.
type Config struct {
	// ID is this transceiver's id, carried in every token it mints; relays
	// resolve it through their membership table. Required, non-zero.
	ID uint32 `yaml:"id"`
	// Cluster is the cluster id carried in tokens. Default 1.
	Cluster uint16 `yaml:"cluster"`
	// ListenAddr is the UDP address of the internal-hop socket that relays
	// send to. Default "127.0.0.1:4000".
	ListenAddr string `yaml:"listen"`
	// Advertise is the ingress put in every answer as the one candidate: the
	// relay VIP:port clients send to. Required.
	Advertise string `yaml:"advertise"`
	// AdvertiseTCP, if set, is the relay VIP's ICE-TCP ip:port (the relay's
	// TCPAddr as clients reach it, 443 in production): every answer then
	// carries a passive TCP host candidate there besides the UDP one, at a
	// lower priority, for clients whose network drops UDP (RFC 6544). For a
	// region's ingress (IngressByRegion) the TCP candidate is that
	// ingress's IP at this port. Empty: UDP only.
	AdvertiseTCP string `yaml:"advertise_tcp"`
	// AllowRelays lists CIDR prefixes that internal-hop datagrams may come
	// from. Empty means DefaultAllowRelays: loopback and private ranges,
	// never the internet, since a hop datagram names a client and so
	// steers that client's return path.
	AllowRelays []string `yaml:"allow_relays"`
	// BackendURL is the WebSocket URL of the backend bridge (ws:// or wss://). Required.
	BackendURL string `yaml:"backend_url"`
	// SetupTimeout ends a session that is not connected (ICE and DTLS) this
	// long after its offer. Default 30s.
	SetupTimeout time.Duration `yaml:"setup_timeout"`
	// MaxSessions caps concurrent sessions; beyond it offers get 503. Default 10000.
	MaxSessions int `yaml:"max_sessions"`
	// DisconnectedTimeout is how long a connected client may send nothing
	// (no media, RTCP or consent check) before the backend is told it is
	// disconnected (bridge message "connection", docs/bridge.md §4.7), so
	// that a model can stop generating for a client that vanished. Traffic
	// that resumes is reported too. Default 5s; the report comes within
	// about a second after it (consent.go).
	DisconnectedTimeout time.Duration `yaml:"disconnected_timeout"`
	// ConsentTimeout ends a session whose client has sent nothing for this
	// long (reason ice_failed). Default 30s: the consent expiry of RFC 7675
	// §5.1, after which a client must stop sending, so a session is never
	// ended while its client may still rightly use it. Shorter values end
	// silent sessions sooner at the risk of cutting a client that is
	// switching networks. Must exceed DisconnectedTimeout.
	ConsentTimeout time.Duration `yaml:"consent_timeout"`
	// MaxPendingPerClient caps the sessions answered but not yet connected
	// (ICE and DTLS) per client address (an IPv4 address or an IPv6 /64);
	// beyond it offers get 429 (pending.go). Default 64: an office or a
	// carrier-grade NAT starting many calls at once stays under it, since a
	// session is pending for well under a second.
	MaxPendingPerClient int `yaml:"max_pending_per_client"`
	// MaxPending caps the sessions not yet connected in total; beyond it
	// offers get 503. Default 1000.
	MaxPending int `yaml:"max_pending"`
	// CheckTimeout ends a session whose client has sent no authenticated
	// connectivity check this long after the answer (reason no_check),
	// releasing its backend session. Default 10s; at most SetupTimeout.
	CheckTimeout time.Duration `yaml:"check_timeout"`
	// TrustedProxies are CIDR prefixes of proxies (a director, a load
	// balancer) whose X-Forwarded-For names the client: the client address
	// of a request from them is that header's last entry. Empty trusts none.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// IngressByRegion maps a region name to the ingress (a Global Relay's
	// public ip:port) advertised to clients of that region instead of
	// Advertise. The region comes from the RegionHeader of the offer
	// request, set by the director or a CDN.
	IngressByRegion map[string]string `yaml:"ingress_by_region"`
	// Direct makes the UDP socket face clients directly, with no relay and
	// no internal hop: for a single host, and as the latency baseline the
	// relay path is measured against. Advertise then defaults to ListenAddr.
	Direct bool `yaml:"direct"`
	// ReportInterval is how often each session sends its RTCP sender and
	// receiver reports (RFC 3550 §6.4), which give the client loss,
	// jitter and round-trip figures and give us the round trip to the
	// client (rtcpreport, reports.go). Default 1s, as Pion's report
	// interceptors; 100ms to 10s.
	ReportInterval time.Duration `yaml:"report_interval"`
	// DTLSRole is the DTLS role the transceiver takes in answers to offers
	// that leave it to the answerer (a=setup:actpass, or none): "client"
	// (default; a=setup:active, the transceiver sends the ClientHello the
	// moment ICE connects) or "server" (a=setup:passive; the client's
	// ClientHello is answered without a HelloVerifyRequest round trip). An
	// offer with a=setup:active or passive gets the complementary role
	// (offer.go).
	DTLSRole string `yaml:"dtls_role"`
	// DTLSVersion is the highest DTLS version the transceiver negotiates:
	// "1.2" (RFC 6347) or "1.3" (RFC 9147; a client without it gets 1.2).
	// Default DefaultDTLSVersion (docs/benchmarks.md, "Call setup",
	// measures both with every client).
	DTLSVersion string `yaml:"dtls_version"`
	// SPED answers an offer whose a=ice-options lists sped, googspedv1 or
	// goog-sped-v1 (Chromium with its WebRTC-IceHandshakeDtls field
	// trial; peer.Offer.SPED) with the same options when DTLSVersion is
	// 1.3 (SPED runs only with it): the transceiver is then the DTLS
	// server, and
	// the handshake rides in the ICE checks and their responses
	// (internal/peer sped.go), a round trip sooner when the client's
	// ClientHello fits in one datagram (docs/interop.md, "DTLS in the ICE
	// checks"). Default true (DefaultSPED).
	SPED bool `yaml:"sped"`
	// Auth turns on signaling authentication (internal/auth, docs/design.md §6):
	// offers need a client token minted at POST /v1/client_tokens with an
	// API key; PATCH and DELETE need the session's token or an API key.
	// The zero value leaves signaling open (the demo).
	Auth auth.Config `yaml:"auth"`
	// OutputBitrate is the Opus bitrate, in bits per second, of audio the
	// transceiver encodes from a PCM backend (docs/bridge.md §5.1).
	// Default 32000 (audio.DefaultBitrate); 6000 to 128000.
	OutputBitrate int `yaml:"output_bitrate"`
	// OutputComplexity is the libopus encoder complexity (1 to 10) of that
	// audio: CPU per frame against search effort. Default 5
	// (audio.DefaultComplexity; docs/benchmarks.md "Opus encoder
	// complexity" measures it against 10, libopus's own default).
	OutputComplexity int `yaml:"output_complexity"`
	// OutputQueueMax caps the audio waiting in a session's output queue
	// for paced playout (docs/bridge.md §6.1); audio past it is refused
	// with an output_queue_full error. Default 60s (playout.DefaultMaxQueued).
	OutputQueueMax time.Duration `yaml:"output_queue_max"`
	// Ptime is the audio in each RTP packet to and from clients, ms: 20
	// (DefaultPtime) or 10. At 10 the answer carries a=ptime:10 (RFC 4566
	// §6), which WebRTC clients such as Chromium follow in the frame size
	// of their Opus encoder; the transceiver encodes audio from PCM
	// backends in 10 ms packets and paces every session on a 10 ms clock
	// (an Opus backend's packets keep their own length). A reply's first
	// packet then waits half a 10 ms tick, not half a 20 ms one: about
	// 5 ms sooner (docs/benchmarks.md, turn-taking), for twice the
	// packets per session, both ways.
	// Frames to and from PCM backends stay 20 ms (docs/bridge.md §5); an
	// Opus backend gets the client's packets as they come.
	Ptime int `yaml:"ptime"`
	// EchoDumpDir, if set, is a directory where every session with echo
	// cancellation on writes its cleaner's inputs (the audio played to
	// the client and the client's decoded input, with their times) to
	// <session id>-<n>.apmdump (internal/apm dump.go), for replaying a
	// call offline through the canceller, as WebRTC's aecdump is used. It
	// holds users' voices: for diagnosis only, never by default. About
	// 2 MB per minute at 24 kHz.
	EchoDumpDir string `yaml:"echo_dump_dir"`

	advertise netip.AddrPort
	// dtlsVersion is DTLSVersion parsed.
	dtlsVersion peer.DTLSVersion
	// advertiseTCP is AdvertiseTCP parsed; invalid: none.
	advertiseTCP netip.AddrPort
	allow        trusted.Prefixes
	trusted      trusted.Prefixes
	ingress      map[string]netip.AddrPort
}

// CheckPtime says what to fix in a Config.Ptime, in ms: 0 (DefaultPtime),
// 10 or 20 are taken; anything else is an error naming the choices.
func CheckPtime(ms int) error {
	switch ms {
	case 0, 10, 20:
		return nil
	}
	return fmt.Errorf("transceiver: ptime %d must be 10 or 20 (ms of audio per RTP packet to and from clients; 20 is the default, 10 halves the packetization delay at twice the packet rate)", ms)
}

// Validate checks the config, fills defaults, and says what to fix.
func (c *Config) Validate() error {
	if c.ID == 0 {
		return fmt.Errorf("transceiver: id must be set to a non-zero value that relays know in their membership table")
	}
	if c.Cluster == 0 {
		c.Cluster = 1
	}
	if c.ListenAddr == "" {
		c.ListenAddr = DefaultListenAddr
	}
	if c.EchoDumpDir != "" {
		if fi, err := os.Stat(c.EchoDumpDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("transceiver: echo_dump_dir %q must be an existing directory the transceiver can write (or empty for no dumps)", c.EchoDumpDir)
		}
	}
	switch {
	case c.Advertise == "" && c.Direct:
		// New advertises the socket's bound address.
	case c.Advertise == "":
		return fmt.Errorf("transceiver: advertise must be set to the relay's public ip:port (the VIP clients send media to)")
	default:
		ap, err := netip.ParseAddrPort(c.Advertise)
		if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() {
			return fmt.Errorf("transceiver: advertise %q must be a concrete ip:port such as 203.0.113.10:3478", c.Advertise)
		}
		c.advertise = ap
	}
	c.advertiseTCP = netip.AddrPort{}
	if c.AdvertiseTCP != "" {
		ap, err := netip.ParseAddrPort(c.AdvertiseTCP)
		if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() || ap.Addr().Zone() != "" {
			return fmt.Errorf("transceiver: advertise_tcp %q must be a concrete ip:port such as 203.0.113.10:443 (the relay VIP's ICE-TCP address), or empty for UDP only", c.AdvertiseTCP)
		}
		c.advertiseTCP = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	var err error
	allow := c.AllowRelays
	if len(allow) == 0 {
		allow = DefaultAllowRelays
	}
	if c.allow, err = trusted.Parse(allow); err != nil {
		return fmt.Errorf("transceiver: allow_relays %w", err)
	}
	u, err := url.Parse(c.BackendURL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return fmt.Errorf("transceiver: backend_url %q must be a ws:// or wss:// URL such as ws://127.0.0.1:8081/v1/bridge", c.BackendURL)
	}
	c.ingress = make(map[string]netip.AddrPort, len(c.IngressByRegion))
	for region, addr := range c.IngressByRegion {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() || region == "" {
			return fmt.Errorf("transceiver: ingress_by_region entry %q: %q must map a region name to a concrete ip:port", region, addr)
		}
		c.ingress[region] = ap
	}
	switch c.DTLSRole {
	case "":
		c.DTLSRole = DefaultDTLSRole
	case "client", "server":
	default:
		return fmt.Errorf("transceiver: dtls_role %q must be client or server", c.DTLSRole)
	}
	if c.DTLSVersion == "" {
		c.DTLSVersion = DefaultDTLSVersion
	}
	if c.dtlsVersion, err = peer.ParseDTLSVersion(c.DTLSVersion); err != nil {
		return fmt.Errorf("transceiver: dtls_version %q must be 1.2 or 1.3 (the highest DTLS version negotiated; a client without 1.3 gets 1.2 either way)", c.DTLSVersion)
	}
	if c.SetupTimeout <= 0 {
		c.SetupTimeout = DefaultSetupTimeout
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	switch {
	case c.OutputBitrate == 0:
		c.OutputBitrate = audio.DefaultBitrate
	case c.OutputBitrate < 6000 || c.OutputBitrate > 128000:
		return fmt.Errorf("transceiver: output_bitrate %d must be 6000 to 128000 bits per second (32000 suits speech)", c.OutputBitrate)
	}
	switch {
	case c.OutputComplexity == 0:
		c.OutputComplexity = audio.DefaultComplexity
	case c.OutputComplexity < 1 || c.OutputComplexity > 10:
		return fmt.Errorf("transceiver: output_complexity %d must be 1 to 10 (5 suits speech; 10 is libopus's default)", c.OutputComplexity)
	}
	switch {
	case c.OutputQueueMax == 0:
		c.OutputQueueMax = playout.DefaultMaxQueued
	case c.OutputQueueMax < playout.Tick || c.OutputQueueMax > 10*time.Minute:
		return fmt.Errorf("transceiver: output_queue_max %v must be 20ms to 10m (a whole reply should fit: 60s is the default)", c.OutputQueueMax)
	}
	if err := CheckPtime(c.Ptime); err != nil {
		return err
	}
	if c.Ptime == 0 {
		c.Ptime = DefaultPtime
	}
	switch {
	case c.ReportInterval == 0:
		c.ReportInterval = DefaultReportInterval
	case c.ReportInterval < 100*time.Millisecond || c.ReportInterval > 10*time.Second:
		return fmt.Errorf("transceiver: report_interval %v must be 100ms to 10s (1s is the default)", c.ReportInterval)
	}
	if c.DisconnectedTimeout <= 0 {
		c.DisconnectedTimeout = DefaultDisconnectedTimeout
	}
	if c.ConsentTimeout <= 0 {
		c.ConsentTimeout = DefaultConsentTimeout
	}
	if c.MaxPendingPerClient <= 0 {
		c.MaxPendingPerClient = DefaultMaxPendingPerClient
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = min(DefaultCheckTimeout, c.SetupTimeout)
	}
	if c.CheckTimeout > c.SetupTimeout {
		return fmt.Errorf("transceiver: check_timeout %v must not exceed setup_timeout %v", c.CheckTimeout, c.SetupTimeout)
	}
	if c.trusted, err = trusted.Parse(c.TrustedProxies); err != nil {
		return fmt.Errorf("transceiver: trusted_proxies %w", err)
	}
	if c.ConsentTimeout <= c.DisconnectedTimeout {
		return fmt.Errorf("transceiver: consent_timeout %v must exceed disconnected_timeout %v (defaults 30s and 5s)", c.ConsentTimeout, c.DisconnectedTimeout)
	}
	return nil
}
