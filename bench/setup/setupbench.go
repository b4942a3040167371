package setupbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path"
	"slices"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/chromium"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// Path names.
const (
	PathDirect = "direct"
	PathRelay  = "relay"
	PathTURN   = "turn"
	PathGlobal = "global" // Global Relay, then the cluster relay
	PathTCP    = "tcp"    // the relay's ICE-TCP port (RFC 6544): a client whose network drops UDP
)

// DTLS roles of the transceiver (transceiver.Config.DTLSRole).
const (
	RoleClient = "client"
	RoleServer = "server"
)

// Defaults of Options.
const (
	DefaultRTT           = 50 * time.Millisecond
	DefaultRuns          = 10
	DefaultClientICETick = 5 * time.Millisecond
	// pionCheckInterval is Pion's ICE connecting-phase task interval.
	pionCheckInterval = 200 * time.Millisecond
)

// ErrOptions wraps invalid options.
var ErrOptions = errors.New("setupbench: invalid options")

// Options configures Run.
type Options struct {
	// RTT is the round-trip time added between client and server, split
	// evenly each way, on signaling and on media. Default 50 ms.
	RTT time.Duration
	// Runs is the number of recorded calls per path and DTLS role (after
	// one warm-up call). Default 10.
	Runs int
	// Paths to measure, in order; default "direct", "relay", "global",
	// "tcp", "turn".
	Paths []string
	// Logger receives progress at info, per-call detail at debug and
	// failures at warn; nil discards. The stacks' own logs go to it at
	// warn level and above.
	Logger *slog.Logger
	// DTLSRoles are the transceiver DTLS roles measured on every path;
	// default "client" and "server".
	DTLSRoles []string
	// ClientICETick is how often the client's ICE agent runs its checks
	// while connecting (see the package comment); default 5 ms. 200 ms or
	// more leaves Pion's default (200 ms) untouched.
	ClientICETick time.Duration
	// ClientSkipHelloVerify makes the client, when it is the DTLS server
	// (transceiver role "client"), answer ClientHello without a
	// HelloVerifyRequest, as the transceiver does. Off by default: Pion's
	// default sends one.
	ClientSkipHelloVerify bool
	// CallTimeout bounds one call; default 15 s + 20 RTT.
	CallTimeout time.Duration
	// Client is "pion" (default: callclient in this process),
	// "chromium" (headless Chromium running the demo page, internal/web;
	// see chromium.go), "chromium-sped" (the same with its field trial
	// WebRTC-IceHandshakeDtls: DTLS 1.3 in the ICE checks, internal/peer
	// sped.go) or "firefox" (headless Firefox ESR running it, in a network
	// namespace: firefox.go). ClientICETick and ClientSkipHelloVerify apply
	// to Pion only. Clients, if set, replaces it.
	Client string
	// Clients are several of Client's values, measured in one run, their
	// calls interleaved with the paths', roles' and versions'. Firefox's
	// stacks listen on the host end of its network namespace, the others'
	// on 127.0.0.1.
	Clients []string
	// DTLSVersions are the transceiver's -dtls-version settings measured
	// on every path and role ("1.2", "1.3"); default the transceiver's
	// default. "chromium-sped" runs once per path whatever the roles and
	// versions: SPED makes the transceiver the DTLS server with DTLS 1.3.
	DTLSVersions []string
	// Loss is the probability (0–1) that the media proxy in front of the
	// path drops a datagram, each way independently (signaling is not
	// impaired). Default 0.
	Loss float64
	// Audio is how much audio the Pion client sends per call (the tone
	// loops), from its DTLS connected; default 300 ms. Under loss make it
	// longer than the transceiver's handshake can take to complete after
	// the client's, or a call whose audio all came before the
	// transceiver's keys (and past the few kept for them) counts as
	// failed without first audio at the backend.
	Audio time.Duration
	// DropFlight drops one DTLS flight per call at the media proxy: the
	// call's first DTLS datagram toward the client (DropToClient: the
	// transceiver's ClientHello in role client, its ServerHello flight in
	// role server) or toward the server (DropToServer: the client's
	// first flight). Not on the turn path, where DTLS travels inside TURN
	// framing. Default "": none.
	DropFlight string
}

// Values of Options.DropFlight.
const (
	DropToClient = "to_client"
	DropToServer = "to_server"
)

func (o Options) withDefaults() (Options, error) {
	if o.RTT == 0 {
		o.RTT = DefaultRTT
	}
	if o.RTT < 0 {
		return o, fmt.Errorf("%w: RTT %v is negative", ErrOptions, o.RTT)
	}
	if o.Runs == 0 {
		o.Runs = DefaultRuns
	}
	if o.Runs < 0 {
		return o, fmt.Errorf("%w: Runs %d is negative", ErrOptions, o.Runs)
	}
	if len(o.Paths) == 0 {
		o.Paths = []string{PathDirect, PathRelay, PathGlobal, PathTCP, PathTURN}
	}
	for _, p := range o.Paths {
		if !slices.Contains([]string{PathDirect, PathRelay, PathTURN, PathGlobal, PathTCP}, p) {
			return o, fmt.Errorf("%w: path %q is not one of direct, relay, global, tcp, turn", ErrOptions, p)
		}
	}
	if len(o.DTLSRoles) == 0 {
		o.DTLSRoles = []string{RoleClient, RoleServer}
	}
	for _, r := range o.DTLSRoles {
		if r != RoleClient && r != RoleServer {
			return o, fmt.Errorf("%w: DTLS role %q is not client or server", ErrOptions, r)
		}
	}
	if o.ClientICETick == 0 {
		o.ClientICETick = DefaultClientICETick
	}
	if o.ClientICETick < 0 {
		return o, fmt.Errorf("%w: ClientICETick %v is negative", ErrOptions, o.ClientICETick)
	}
	if o.Client == "" {
		o.Client = ClientPion
	}
	if len(o.Clients) == 0 {
		o.Clients = []string{o.Client}
	}
	for _, c := range o.Clients {
		if !slices.Contains([]string{ClientPion, ClientChromium, ClientChromiumSPED, ClientChromiumSPEDNoPQ, ClientFirefox}, c) {
			return o, fmt.Errorf("%w: client %q is not pion, chromium, chromium-sped, chromium-sped-nopq or firefox", ErrOptions, c)
		}
	}
	o.Client = o.Clients[0]
	if len(o.DTLSVersions) == 0 {
		o.DTLSVersions = []string{transceiver.DefaultDTLSVersion}
	}
	for _, v := range o.DTLSVersions {
		if v != "1.2" && v != "1.3" {
			return o, fmt.Errorf("%w: DTLS version %q is not 1.2 or 1.3", ErrOptions, v)
		}
	}
	if o.Audio == 0 {
		o.Audio = 300 * time.Millisecond
	}
	if o.Audio < 0 {
		return o, fmt.Errorf("%w: Audio %v is negative", ErrOptions, o.Audio)
	}
	if o.Loss < 0 || o.Loss >= 1 {
		return o, fmt.Errorf("%w: Loss %v is not in [0, 1)", ErrOptions, o.Loss)
	}
	switch o.DropFlight {
	case "", DropToClient, DropToServer:
	default:
		return o, fmt.Errorf("%w: DropFlight %q is not %s or %s", ErrOptions, o.DropFlight, DropToClient, DropToServer)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 15*time.Second + 20*o.RTT
	}
	return o, nil
}

// Stats summarizes one phase over the successful runs, in milliseconds.
type Stats struct {
	Median, P90, Min, Max float64
}

// RTTs returns the median as a number of round trips of rtt.
func (s Stats) RTTs(rtt time.Duration) float64 {
	if rtt <= 0 {
		return 0
	}
	return s.Median / ms(rtt)
}

func newStats(v []float64) Stats {
	if len(v) == 0 {
		return Stats{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var med float64
	if n := len(s); n%2 == 1 {
		med = s[n/2]
	} else {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	// Nearest rank.
	p90 := s[int(math.Ceil(0.9*float64(len(s))))-1]
	return Stats{Median: med, P90: p90, Min: s[0], Max: s[len(s)-1]}
}

// Expected is the round-trip count the protocols allow for each phase,
// from the start of the POST (Gathering: before it), as explained in the
// package comment.
type Expected struct {
	Gathering, Signaling, ICE, DTLS, FirstAudioBackend, FirstAudioClient float64
}

// expected returns the model for a path and transceiver DTLS role.
func expected(path, role string, clientHelloVerify bool) Expected {
	e := Expected{Signaling: 1, ICE: 3}
	if path == PathTURN {
		e.Gathering = 2 // Allocate → 401, authenticated Allocate
		e.ICE++         // CreatePermission before the first check
	}
	e.DTLS = e.ICE + 2
	if role == RoleClient && !clientHelloVerify {
		e.DTLS = e.ICE + 1
	}
	e.FirstAudioBackend = e.DTLS + 0.5
	e.FirstAudioClient = e.FirstAudioBackend + 0.5
	return e
}

// expectedChromium is the model for headless Chromium (chromium.go), as
// seen on the wire: ICE "connected" when its first check succeeds (the
// pair is writable), at 2 RTT; the USE-CANDIDATE check follows on the
// pair's next scheduled check, which nothing waits for. Role client: the
// transceiver's ClientHello leaves with the answer to that first check,
// Chromium keeps it and answers it as the pair becomes writable (its DTLS
// server sends no HelloVerifyRequest), so DTLS connects 1 RTT after ICE.
// Role server: Chromium's ClientHello leaves on the writable pair, and the
// full handshake takes 2 RTT after ICE. Through TURN it sends
// CreatePermission and the first check (in a Send indication) back to
// back: no extra round trip.
func expectedChromium(path, role string) Expected {
	e := Expected{Signaling: 1, ICE: 2}
	if path == PathTURN {
		e.Gathering = 2
	}
	e.DTLS = e.ICE + 2
	if role == RoleClient {
		e.DTLS = e.ICE + 1
	}
	e.FirstAudioBackend = e.DTLS + 0.5
	e.FirstAudioClient = e.FirstAudioBackend + 0.5
	return e
}

// expectedSPED is the model for headless Chromium with
// WebRTC-IceHandshakeDtls against a transceiver that answers SPED
// (internal/peer sped.go): its ClientHello rides its first check, the
// transceiver's DTLS 1.3 ServerHello…Finished flight the Binding response
// to it, and Chromium, the DTLS 1.3 client, is connected as it takes that
// response, when its ICE is writable too: ICE and DTLS at 2 RTT, the first
// audio at the backend half a round trip later. Through TURN as without
// SPED (the check and its response ride the relay).
func expectedSPED(path string) Expected {
	e := Expected{Signaling: 1, ICE: 2, DTLS: 2}
	if path == PathTURN {
		e.Gathering = 2
	}
	e.FirstAudioBackend = e.DTLS + 0.5
	e.FirstAudioClient = e.FirstAudioBackend + 0.5
	return e
}

// isSPED reports whether a client offers SPED.
func isSPED(client string) bool {
	return client == ClientChromiumSPED || client == ClientChromiumSPEDNoPQ
}

// expectedFor is the model of a client, path, transceiver role and
// DTLS version setting. With DTLS 1.3 a browser's handshake is a round
// trip shorter in role server (the DTLS 1.3 client is done once it takes
// the server's first flight) and as long in role client (the browser, as
// server, waits for the transceiver's Finished either way); Pion has no
// DTLS 1.3.
func expectedFor(client, path, role, version string, clientHelloVerify bool) Expected {
	switch client {
	case ClientChromiumSPED:
		// Chromium 156's ClientHello carries a post-quantum key share and
		// spans two datagrams: the first rides its first check, the
		// second leaves once that check's response made its ICE
		// writable, so the ServerHello flight comes a round trip later.
		e := expectedSPED(path)
		e.DTLS++
		e.FirstAudioBackend++
		e.FirstAudioClient++
		return e
	case ClientChromiumSPEDNoPQ:
		return expectedSPED(path)
	case ClientChromium, ClientFirefox:
		e := expectedChromium(path, role)
		if version == "1.3" && role == RoleServer {
			e.DTLS = e.ICE + 1
			e.FirstAudioBackend = e.DTLS + 0.5
			e.FirstAudioClient = e.FirstAudioBackend + 0.5
		}
		return e
	}
	return expected(path, role, clientHelloVerify)
}

// expectedFirefox is the model for headless Firefox ESR (firefox.go):
// every check carries USE-CANDIDATE, so its ICE connects on its first
// check's answer, at 2 RTT; the rest is Chromium's model (its DTLS server
// sends no HelloVerifyRequest). Firefox drops DTLS that reaches it before
// its ICE layer has taken that answer: a ClientHello that is dropped is
// sent again on the transceiver's retransmission timer.
func expectedFirefox(path, role string) Expected { return expectedChromium(path, role) }

// Result is one path and DTLS role, over Runs calls.
type Result struct {
	Path     string
	DTLSRole string
	// DTLSVersion is the transceiver's -dtls-version setting ("1.3" for
	// chromium-sped, which SPED implies).
	DTLSVersion string
	// Kind is the Options client that ran the calls ("pion", "chromium",
	// "chromium-sped", "firefox"); Client names it for a reader.
	Kind string
	// Runs is the number of calls attempted (warm-up excluded); Failures
	// how many of them failed or missed a phase. Stats cover the others.
	Runs, Failures int
	// Phases, in ms from the start of the POST: answer received, ICE
	// connected, DTLS connected (at the client), first audio frame at the
	// backend, first echoed audio frame back at the client.
	SignalingMS, ICEMS, DTLSMS, FirstAudioClientMS, FirstAudioBackendMS Stats
	// DataChannelMS is when "oai-events" opened at the client (not on the
	// audio path).
	DataChannelMS Stats
	// GatheringMS is ICE gathering before the POST (TURN allocation).
	GatheringMS Stats
	// The same phases from the answer's arrival (each call's phase minus
	// its SignalingMS), in ms.
	ICEFromAnswerMS, DTLSFromAnswerMS, FirstAudioBackendFromAnswerMS, FirstAudioClientFromAnswerMS Stats
	// RTTs is the median FirstAudioBackendMS in round trips.
	RTTs float64
	// Expected is the round-trip model for this path and role.
	Expected Expected
	// Client is the client that ran the calls: "pion", or "Chromium" and
	// its version.
	Client string
	// Note says why a path was skipped, or what to know about it.
	Note string
	// Errors holds up to a few failure messages.
	Errors []string
}

// sample is one call's phases in ms.
type sample struct {
	signaling, ice, dtls, dc, backend, client, gathering float64
}

// Run measures the paths, each with each DTLS role and version, with each
// client, and returns one Result per client, path, role and version in the
// order of opts.Clients, opts.Paths, opts.DTLSRoles then opts.DTLSVersions
// (chromium-sped: one per path). A path
// that cannot run (turn without turnserver outside CI, global) yields a
// Result with a Note and no runs. It returns an error for invalid options,
// a stack that cannot be built, or a cancelled ctx.
func Run(ctx context.Context, opts Options) ([]Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	env, err := newEnv(opts)
	if err != nil {
		return nil, err
	}
	defer env.close()

	type config struct {
		res     *Result
		st      *stack
		samples []sample
	}
	var configs []*config
	var results []Result
	for _, cl := range opts.Clients {
		for _, p := range opts.Paths {
			if isSPED(cl) {
				results = append(results, Result{Path: p, DTLSRole: RoleServer, DTLSVersion: "1.3", Kind: cl, Client: cl, Expected: expectedFor(cl, p, RoleServer, "1.3", false)})
				continue
			}
			for _, role := range opts.DTLSRoles {
				for _, v := range opts.DTLSVersions {
					exp := expectedFor(cl, p, role, v, !opts.ClientSkipHelloVerify)
					results = append(results, Result{Path: p, DTLSRole: role, DTLSVersion: v, Kind: cl, Client: cl, Expected: exp})
				}
			}
		}
	}
	skip := func(kind, note string) {
		for i := range results {
			if results[i].Kind == kind {
				results[i].Note = note
			}
		}
	}
	name := func(kind, version string) {
		for i := range results {
			if results[i].Kind == kind {
				results[i].Client = version
			}
		}
	}
	for _, kind := range []string{ClientChromium, ClientChromiumSPED, ClientChromiumSPEDNoPQ} {
		if !slices.Contains(opts.Clients, kind) {
			continue
		}
		var extra []chromedp.ExecAllocatorOption
		suffix := ""
		switch kind {
		case ClientChromiumSPED:
			extra, suffix = []chromedp.ExecAllocatorOption{chromium.FieldTrials(chromium.SPEDFieldTrial)}, " with WebRTC-IceHandshakeDtls"
		case ClientChromiumSPEDNoPQ:
			extra = []chromedp.ExecAllocatorOption{chromium.FieldTrials(chromium.SPEDFieldTrial), chromium.NoPQDTLS()}
			suffix = " with WebRTC-IceHandshakeDtls, without WebRtcPqcForDtls"
		}
		b, err := startBrowser(log, env.audio, extra...)
		if errors.Is(err, errNoChromium) && os.Getenv("CI") == "" {
			skip(kind, "skipped: chromium is not installed (Debian: apt-get install chromium)")
			log.Warn("chromium is not installed; its paths skipped")
			continue
		}
		if err != nil {
			return nil, err
		}
		env.browsers[kind] = b
		env.defer_(b.close)
		name(kind, b.version+suffix)
	}
	if slices.Contains(opts.Clients, ClientFirefox) {
		d, err := startFirefox(log)
		if note := firefoxSkip(err); note != "" {
			skip(ClientFirefox, note)
			log.Warn("firefox cannot run here; its paths skipped", "err", err)
		} else if err != nil {
			return nil, err
		} else {
			env.firefox, env.fxHost = d, d.ns.HostIP
			env.defer_(d.close)
			name(ClientFirefox, d.version)
		}
	}
	for i := range results {
		r := &results[i]
		if r.Note != "" {
			continue // its client cannot run here
		}
		st, note, err := env.newStack(r.Path, r.DTLSRole, r.DTLSVersion, r.Kind)
		if err != nil {
			return nil, fmt.Errorf("setupbench: %s client, %s path, DTLS role %s, version %s: %w", r.Kind, r.Path, r.DTLSRole, r.DTLSVersion, err)
		}
		if st != nil {
			st.kind = r.Kind
		}
		if st == nil {
			r.Note = note
			log.Warn("path skipped", "path", r.Path, "note", note)
			continue
		}
		r.Note = note
		configs = append(configs, &config{res: r, st: st})
	}

	for _, c := range configs {
		log.Info("warm-up call", "client", c.res.Kind, "path", c.res.Path, "dtls_role", c.res.DTLSRole, "dtls_version", c.res.DTLSVersion)
		if _, err := env.call(ctx, c.st); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			log.Warn("warm-up call failed", "client", c.res.Kind, "path", c.res.Path, "dtls_role", c.res.DTLSRole, "dtls_version", c.res.DTLSVersion, "err", err)
		}
	}
	for i := range opts.Runs {
		for _, c := range configs {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			c.res.Runs++
			s, err := env.call(ctx, c.st)
			if err != nil {
				c.res.Failures++
				if len(c.res.Errors) < 3 {
					c.res.Errors = append(c.res.Errors, err.Error())
				}
				log.Warn("call failed", "client", c.res.Kind, "path", c.res.Path, "dtls_role", c.res.DTLSRole, "dtls_version", c.res.DTLSVersion, "run", i+1, "err", err)
				continue
			}
			log.Debug("call", "client", c.res.Kind, "path", c.res.Path, "dtls_role", c.res.DTLSRole, "dtls_version", c.res.DTLSVersion, "run", i+1,
				"signaling_ms", s.signaling, "ice_ms", s.ice, "dtls_ms", s.dtls,
				"backend_ms", s.backend, "client_ms", s.client, "gathering_ms", s.gathering)
			c.samples = append(c.samples, s)
		}
		log.Info("round done", "run", i+1, "of", opts.Runs)
	}
	for _, c := range configs {
		pick := func(f func(sample) float64) Stats {
			v := make([]float64, len(c.samples))
			for i, s := range c.samples {
				v[i] = f(s)
			}
			return newStats(v)
		}
		r := c.res
		r.SignalingMS = pick(func(s sample) float64 { return s.signaling })
		r.ICEMS = pick(func(s sample) float64 { return s.ice })
		r.DTLSMS = pick(func(s sample) float64 { return s.dtls })
		r.DataChannelMS = pick(func(s sample) float64 { return s.dc })
		r.FirstAudioBackendMS = pick(func(s sample) float64 { return s.backend })
		r.FirstAudioClientMS = pick(func(s sample) float64 { return s.client })
		r.GatheringMS = pick(func(s sample) float64 { return s.gathering })
		r.ICEFromAnswerMS = pick(func(s sample) float64 { return s.ice - s.signaling })
		r.DTLSFromAnswerMS = pick(func(s sample) float64 { return s.dtls - s.signaling })
		r.FirstAudioBackendFromAnswerMS = pick(func(s sample) float64 { return s.backend - s.signaling })
		r.FirstAudioClientFromAnswerMS = pick(func(s sample) float64 { return s.client - s.signaling })
		r.RTTs = r.FirstAudioBackendMS.RTTs(opts.RTT)
	}
	return results, nil
}

// call runs one call on st, with st's client, and returns its phases.
func (e *env) call(ctx context.Context, st *stack) (sample, error) {
	switch st.kind {
	case ClientChromium, ClientChromiumSPED, ClientChromiumSPEDNoPQ:
		return e.callChromium(ctx, st, e.browsers[st.kind])
	case ClientFirefox:
		return e.callFirefox(ctx, st)
	}
	rep, err := callclient.Run(ctx, callclient.Options{
		URL:           st.url,
		Audio:         e.audio,
		Duration:      e.opts.Audio,
		Timeout:       e.opts.CallTimeout,
		Logger:        e.clientLog,
		SettingEngine: e.clientEngine(st.tcp),
		ICEServers:    st.iceServers,
		RelayOnly:     st.relayOnly,
	})
	if err != nil {
		return sample{}, err
	}
	s := sample{
		signaling: rep.Setup.SignalingMS,
		ice:       rep.Setup.ICEConnectedMS,
		dtls:      rep.Setup.DTLSConnectedMS,
		dc:        rep.Setup.DataChannelOpenMS,
		client:    rep.Setup.FirstAudioMS,
		gathering: rep.GatheringMS,
	}
	id := path.Base(rep.SessionURL)
	if at, ok := e.backend.firstAudio(id); ok && !rep.Started.IsZero() {
		s.backend = ms(at.Sub(rep.Started))
	}
	missing := []string{}
	for _, f := range []struct {
		name string
		v    float64
	}{{"answer", s.signaling}, {"ICE connected", s.ice}, {"DTLS connected", s.dtls}, {"first audio at backend", s.backend}, {"first audio at client", s.client}} {
		if f.v <= 0 {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return s, fmt.Errorf("session %s: no %v (packets sent %d, received %d)", id, missing, rep.PacketsSent, rep.PacketsReceived)
	}
	return s, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
