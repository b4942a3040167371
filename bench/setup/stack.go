package setupbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/bridgetest"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/coturn"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/impair"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
	"github.com/switchboard-rtc/switchboard/internal/web"
)

// cluster is the cluster id of every stack.
const cluster = 6

// env holds what the stacks share: token keys, the backend, the client
// audio, the TURN server, and everything to close.
type env struct {
	opts      Options
	log       *slog.Logger // stacks' logs: warn and above
	clientLog *slog.Logger
	keys      *token.Keyring
	backend   *backend
	backendHS *httptest.Server
	audio     *callclient.WAV
	turn      *coturn.Server // started on first use
	turnPass  string         // the TURN user's password, random per run
	turnErr   error
	browsers  map[string]*browser // by client: "chromium", "chromium-sped"
	firefox   *firefoxDriver
	// host is the address the client of the stack being built reaches
	// its proxies on: 127.0.0.1, or for Firefox fxHost, the host end of
	// its network namespace (newStack sets it).
	host    string
	fxHost  string
	nextID  uint32
	closers []func() // run in reverse order
}

func newEnv(opts Options) (*env, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	keys, err := token.NewKeyring(token.Key{ID: 1, Secret: secret})
	if err != nil {
		return nil, err
	}
	e := &env{
		opts:      opts,
		log:       slog.New(minLevel{opts.Logger.Handler(), slog.LevelWarn}),
		clientLog: opts.Logger.With("component", "client"),
		keys:      keys,
		backend:   newBackend(),
		audio:     tone(300 * time.Millisecond),
		host:      "127.0.0.1",
		browsers:  map[string]*browser{},
	}
	e.backendHS = httptest.NewServer(e.backend)
	e.closers = append(e.closers, func() {
		e.backendHS.Close()
		e.backend.wait()
	})
	return e, nil
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}

func (e *env) defer_(f func()) { e.closers = append(e.closers, f) }

// stack is one path with one DTLS role and version, for one client,
// ready for calls.
type stack struct {
	kind       string // the client (Options.Clients)
	url        string // signaling URL, through the TCP proxy
	page       string // the demo page, same origin as url (no CORS preflight)
	iceServers []webrtc.ICEServer
	relayOnly  bool
	tcp        bool // the client gathers ICE-TCP candidates only (PathTCP)
}

// newStack builds a path. It returns a nil stack and a note when the path
// cannot run here.
func (e *env) newStack(path, role, version, kind string) (*stack, string, error) {
	e.host = "127.0.0.1" // a browser's page there is a secure context
	if kind == ClientFirefox {
		e.host = e.fxHost
	}
	half := e.opts.RTT / 2
	delay := impair.Config{Delay: half, Loss: e.opts.Loss}
	if e.opts.DropFlight != "" {
		delay.Drop = dropFirstDTLS(e.opts.DropFlight == DropToServer)
	}
	e.nextID++
	id := e.nextID
	cfg := transceiver.Config{
		ID:         id,
		Cluster:    cluster,
		BackendURL: "ws" + strings.TrimPrefix(e.backendHS.URL, "http") + "/v1/bridge",
		DTLSRole:   role,
		// As in production: an offer with SPED's option gets it, the
		// others are not affected.
		DTLSVersion: version,
		SPED:        true,
	}
	st := &stack{kind: kind}
	var note string
	switch path {
	case PathGlobal:
		st, err := e.behindRelay(cfg, id, delay, true)
		return st, "Global Relay in front of the cluster relay", err

	case PathDirect:
		// The transceiver advertises the proxy, and the proxy targets the
		// transceiver's socket: bind the proxy's socket first, start the
		// proxy on it once the transceiver has bound its own.
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(e.host)})
		if err != nil {
			return nil, "", err
		}
		cfg.Direct = true
		cfg.ListenAddr = "127.0.0.1:0"
		cfg.Advertise = conn.LocalAddr().String()
		trx, err := e.newTransceiver(cfg)
		if err != nil {
			_ = conn.Close()
			return nil, "", err
		}
		px := impair.NewUDPConn(conn, trx.HopAddr().(*net.UDPAddr).AddrPort(), delay, 1)
		e.defer_(func() { _ = px.Close() })
		st.url, st.page, err = e.signaling(trx)
		return st, "", err

	case PathRelay:
		st, err := e.behindRelay(cfg, id, delay, false)
		return st, "", err

	case PathTCP:
		if kind == ClientChromium || isSPED(kind) {
			// Chromium here has UDP, which it prefers: its TCP calls are
			// measured where UDP is dropped (internal/testsupport/e2e TestBrowsersOverTCP).
			return nil, "skipped for chromium: it selects UDP where UDP works; see internal/testsupport/e2e TestBrowsersOverTCP", nil
		}
		st, err := e.behindRelayTCP(cfg, id, delay)
		return st, "client gathers TCP only; the proxy does not delay the TCP handshake (see the package comment)", err

	case PathTURN:
		if kind == ClientFirefox {
			// Its calls timed out with no ICE connected (cause not
			// looked into): coturn listens and relays on 127.0.0.1 here,
			// and Firefox, in its namespace, uses no loopback address.
			return nil, "skipped: Firefox, in its network namespace, did not connect through the loopback coturn here", nil
		}
		if e.turn == nil && e.turnErr == nil {
			var pw [12]byte
			_, _ = rand.Read(pw[:])
			e.turnPass = hex.EncodeToString(pw[:])
			e.turn, e.turnErr = coturn.Start(coturn.Config{User: turnUser, Password: e.turnPass, Realm: "switchboard.bench"})
			if e.turn != nil {
				e.log.Debug("coturn started", "addr", e.turn.Addr, "pid", e.turn.PID())
				e.defer_(e.turn.Stop)
			}
		}
		if e.turnErr != nil {
			if errors.Is(e.turnErr, coturn.ErrNotInstalled) && os.Getenv("CI") == "" {
				return nil, "skipped: turnserver (Debian package coturn) is not installed; scripts/deps.sh test installs it", nil
			}
			return nil, "", e.turnErr
		}
		px, err := impair.NewUDP(net.JoinHostPort(e.host, "0"), e.turn.Addr, delay, 1)
		if err != nil {
			return nil, "", err
		}
		e.defer_(func() { _ = px.Close() })
		cfg.Direct = true
		cfg.ListenAddr = "127.0.0.1:0" // advertised as is; only coturn sends to it
		st.iceServers = []webrtc.ICEServer{{
			URLs:       []string{fmt.Sprintf("turn:%s?transport=udp", px.Addr())},
			Username:   turnUser,
			Credential: e.turnPass,
		}}
		st.relayOnly = true
		note = "coturn " + e.turn.Version + " next to the transceiver; client relay-only"
	}
	trx, err := e.newTransceiver(cfg)
	if err != nil {
		return nil, "", err
	}
	st.url, st.page, err = e.signaling(trx)
	return st, note, err
}

// behindRelay builds a relay with transceiver cfg (id) behind it, and with
// global a Global Relay in front of the relay; the client reaches the first
// of them through a delaying proxy.
func (e *env) behindRelay(cfg transceiver.Config, id uint32, delay impair.Config, global bool) (*stack, error) {
	members, clusters := &membership.Table{}, &membership.Table{}
	rcfg := relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: cluster, Workers: 1}
	var ingress *relay.Relay
	if global {
		var err error
		ingress, err = relay.New(relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Ingress: true, Workers: 1}, e.keys, clusters, nil, e.log)
		if err != nil {
			return nil, err
		}
		e.defer_(func() { _ = ingress.Close() })
		rcfg.TrustedIngress = []string{netip.PrefixFrom(ingress.InternalAddr().Addr(), 32).String()}
	}
	rly, err := relay.New(rcfg, e.keys, members, nil, e.log)
	if err != nil {
		return nil, err
	}
	e.defer_(func() { _ = rly.Close() })
	entry := rly.PublicAddr()
	if ingress != nil {
		if err := clusters.Set(map[uint32]netip.AddrPort{uint32(cluster): rly.PublicAddr()}); err != nil {
			return nil, err
		}
		entry = ingress.PublicAddr()
	}
	px, err := impair.NewUDP(net.JoinHostPort(e.host, "0"), entry, delay, 1)
	if err != nil {
		return nil, err
	}
	e.defer_(func() { _ = px.Close() })
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.Advertise = px.Addr().String()
	cfg.AllowRelays = []string{netip.PrefixFrom(rly.InternalAddr().Addr(), 32).String()}
	trx, err := e.newTransceiver(cfg)
	if err != nil {
		return nil, err
	}
	if err := members.Set(map[uint32]netip.AddrPort{id: trx.HopAddr().(*net.UDPAddr).AddrPort()}); err != nil {
		return nil, err
	}
	url, page, err := e.signaling(trx)
	return &stack{url: url, page: page}, err
}

// behindRelayTCP builds a relay with its ICE-TCP listener on and
// transceiver cfg (id) behind it; the client reaches the relay's TCP port
// through a delaying TCP proxy, which the answer's passive TCP candidate
// names (its UDP candidate names a UDP proxy the client does not use).
func (e *env) behindRelayTCP(cfg transceiver.Config, id uint32, delay impair.Config) (*stack, error) {
	members := &membership.Table{}
	rly, err := relay.New(relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", TCPAddr: "127.0.0.1:0", Cluster: cluster, Workers: 1}, e.keys, members, nil, e.log)
	if err != nil {
		return nil, err
	}
	e.defer_(func() { _ = rly.Close() })
	px, err := impair.NewUDP("127.0.0.1:0", rly.PublicAddr(), delay, 1)
	if err != nil {
		return nil, err
	}
	e.defer_(func() { _ = px.Close() })
	tpx, err := impair.NewTCP("127.0.0.1:0", rly.TCPAddr().String(), delay.Delay)
	if err != nil {
		return nil, err
	}
	e.defer_(func() { _ = tpx.Close() })
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.Advertise = px.Addr().String()
	cfg.AdvertiseTCP = tpx.Addr()
	cfg.AllowRelays = []string{netip.PrefixFrom(rly.InternalAddr().Addr(), 32).String()}
	trx, err := e.newTransceiver(cfg)
	if err != nil {
		return nil, err
	}
	if err := members.Set(map[uint32]netip.AddrPort{id: trx.HopAddr().(*net.UDPAddr).AddrPort()}); err != nil {
		return nil, err
	}
	url, page, err := e.signaling(trx)
	return &stack{url: url, page: page, tcp: true}, err
}

func (e *env) newTransceiver(cfg transceiver.Config) (*transceiver.Server, error) {
	trx, err := transceiver.New(cfg, e.keys, nil, e.log)
	if err != nil {
		return nil, err
	}
	e.defer_(func() { _ = trx.Close() })
	return trx, nil
}

// signaling serves trx's signaling API, and the demo page at "/" for the
// browser, behind a delaying TCP proxy and returns the offer URL and the
// page URL.
func (e *env) signaling(trx *transceiver.Server) (offer, page string, err error) {
	api, demo := trx.Handler(), web.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/":
			demo.ServeHTTP(w, r)
		case callPagePath:
			serveCallPage(w, demo) // firefox.go
		default:
			api.ServeHTTP(w, r)
		}
	}))
	e.defer_(hs.Close)
	px, err := impair.NewTCP(net.JoinHostPort(e.host, "0"), hs.Listener.Addr().String(), e.opts.RTT/2)
	if err != nil {
		return "", "", err
	}
	e.defer_(func() { _ = px.Close() })
	return "http://" + px.Addr() + "/v1/calls", "http://" + px.Addr() + "/", nil
}

// clientEngine is the client's SettingEngine: loopback host candidates
// only (one pair, through the proxy), UDP or, with tcp, ICE-TCP only, no
// mDNS, SCTP SNAP offered, and the check tick of the package comment.
func (e *env) clientEngine(tcp bool) *webrtc.SettingEngine {
	se := &webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	if tcp {
		se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeTCP4})
	}
	se.SetIPFilter(func(ip net.IP) bool { return ip.IsLoopback() })
	se.EnableSctpSnap(true)
	if tick := e.opts.ClientICETick; tick < pionCheckInterval {
		se.SetICETimeouts(tick, 30*time.Second, 2*time.Second)
	}
	// Pion waits 2 s before nominating a relay pair (ICE
	// RelayAcceptanceMinWait), in case a better pair succeeds; with the
	// relay policy there is no other pair, so the wait is pure delay.
	se.SetRelayAcceptanceMinWait(0)
	if e.opts.ClientSkipHelloVerify {
		se.SetDTLSInsecureSkipHelloVerify(true)
	}
	return se
}

// dropFirstDTLS returns an impair.Config.Drop that drops each client's
// first DTLS datagram (RFC 7983: first byte 20–63) in one direction:
// toward the server if toServer, else toward the client.
func dropFirstDTLS(toServer bool) func(netip.AddrPort, []byte, bool) bool {
	var mu sync.Mutex
	dropped := map[netip.AddrPort]bool{}
	return func(client netip.AddrPort, b []byte, toTarget bool) bool {
		if toTarget != toServer || len(b) == 0 || b[0] < 20 || b[0] > 63 {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if dropped[client] {
			return false
		}
		dropped[client] = true
		return true
	}
}

// turnUser is the one long-term-credential user of the TURN path's coturn.
const turnUser = "bench"

// tone is d of a 440 Hz sine, 48 kHz mono.
func tone(d time.Duration) *callclient.WAV {
	const rate = 48000
	n := int(d.Seconds() * rate)
	w := &callclient.WAV{SampleRate: rate, Channels: 1, Samples: make([]int16, n)}
	for i := range w.Samples {
		w.Samples[i] = int16(8000 * math.Sin(2*math.Pi*440*float64(i)/rate))
	}
	return w
}

// backend is the bridge endpoint: it echoes audio and events like the echo
// agent and records when each session's first audio frame arrived.
type backend struct {
	wg     sync.WaitGroup
	mu     sync.Mutex
	first  map[string]time.Time // session id → first audio frame; guarded by mu
	closed bool                 // guarded by mu
}

func newBackend() *backend { return &backend{first: map[string]time.Time{}} }

func (b *backend) firstAudio(id string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.first[id]
	return t, ok
}

// wait waits for every session handler; call after the transceivers closed.
func (b *backend) wait() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		http.Error(w, "closed", http.StatusServiceUnavailable)
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	defer b.wg.Done()
	sc, err := bridge.Accept(w, r, bridge.AcceptOptions{})
	if err != nil {
		return
	}
	defer sc.Close()
	id := sc.Session().SessionID
	seen := false
	// The context is not the request's: the connection is hijacked.
	bridgetest.Echo(context.Background(), sc, func(*bridge.AudioFrame) {
		if !seen {
			seen = true
			now := time.Now()
			b.mu.Lock()
			b.first[id] = now
			b.mu.Unlock()
		}
	})
}

// minLevel drops records below a level.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.min}
}

func (h minLevel) WithGroup(n string) slog.Handler { return minLevel{h.Handler.WithGroup(n), h.min} }
