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

	"github.com/switchboard-rtc/switchboard/internal/callclient"
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
	// Client is "pion" (default: callclient in this process) or
	// "chromium" (headless Chromium running the demo page, internal/web;
	// see chromium.go). ClientICETick and ClientSkipHelloVerify apply to
	// Pion only.
	Client string
}

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
	if o.Client != ClientPion && o.Client != ClientChromium {
		return o, fmt.Errorf("%w: client %q is not pion or chromium", ErrOptions, o.Client)
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
	Median, P90, Min float64
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
	return Stats{Median: med, P90: p90, Min: s[0]}
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
// pair is writable); the USE-CANDIDATE check follows on the pair's next
// scheduled check; its DTLS starts on the writable pair and its DTLS
// server sends no HelloVerifyRequest, so either role connects 2 RTT after
// ICE. Through TURN it sends CreatePermission and the first check (in a
// Send indication) back to back: no extra round trip.
func expectedChromium(path string) Expected {
	e := Expected{Signaling: 1, ICE: 2}
	if path == PathTURN {
		e.Gathering = 2
	}
	e.DTLS = e.ICE + 2
	e.FirstAudioBackend = e.DTLS + 0.5
	e.FirstAudioClient = e.FirstAudioBackend + 0.5
	return e
}

// Result is one path and DTLS role, over Runs calls.
type Result struct {
	Path     string
	DTLSRole string
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

// Run measures the paths, each with each DTLS role, and returns one Result
// per path and role in the order of opts.Paths then opts.DTLSRoles. A path
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
	results := make([]Result, 0, len(opts.Paths)*len(opts.DTLSRoles))
	for _, p := range opts.Paths {
		for _, role := range opts.DTLSRoles {
			exp := expected(p, role, !opts.ClientSkipHelloVerify)
			if opts.Client == ClientChromium {
				exp = expectedChromium(p)
			}
			results = append(results, Result{Path: p, DTLSRole: role, Client: opts.Client, Expected: exp})
		}
	}
	if opts.Client == ClientChromium {
		b, err := startBrowser(log, env.audio)
		if errors.Is(err, errNoChromium) && os.Getenv("CI") == "" {
			for i := range results {
				results[i].Note = "skipped: chromium is not installed (Debian: apt-get install chromium)"
			}
			log.Warn("chromium is not installed; every path skipped")
			return results, nil
		}
		if err != nil {
			return nil, err
		}
		env.browser = b
		env.defer_(b.close)
		for i := range results {
			results[i].Client = b.version
		}
	}
	for i := range results {
		r := &results[i]
		st, note, err := env.newStack(r.Path, r.DTLSRole)
		if err != nil {
			return nil, fmt.Errorf("setupbench: %s path, DTLS role %s: %w", r.Path, r.DTLSRole, err)
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
		log.Info("warm-up call", "path", c.res.Path, "dtls_role", c.res.DTLSRole)
		if _, err := env.call(ctx, c.st); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			log.Warn("warm-up call failed", "path", c.res.Path, "dtls_role", c.res.DTLSRole, "err", err)
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
				log.Warn("call failed", "path", c.res.Path, "dtls_role", c.res.DTLSRole, "run", i+1, "err", err)
				continue
			}
			log.Debug("call", "path", c.res.Path, "dtls_role", c.res.DTLSRole, "run", i+1,
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
		r.RTTs = r.FirstAudioBackendMS.RTTs(opts.RTT)
	}
	return results, nil
}

// call runs one call on st and returns its phases.
func (e *env) call(ctx context.Context, st *stack) (sample, error) {
	if e.browser != nil {
		return e.callChromium(ctx, st)
	}
	rep, err := callclient.Run(ctx, callclient.Options{
		URL:           st.url,
		Audio:         e.audio,
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
