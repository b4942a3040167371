package callclient

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/interceptor"
	"github.com/pion/transport/v5"
	"github.com/pion/webrtc/v4"
)

// Load runs many sessions at once against one or more signaling URLs, as
// an operator sizing a deployment would (`switchboard load`), and sums
// them up. Each session is a real Pion peer connection: the offer of Run
// (one sendrecv Opus m-line, the "oai-events" data channel, a complete
// offer with no trickle), RTCP sender and receiver reports (RFC 3550 §6.4)
// as a browser sends them, and one RTP packet every 20 ms for
// LoadOptions.Duration.
//
// Audio is either LoadOptions.Audio, encoded to Opus once and shared by
// every session, or, without it, a 60-byte counter payload: a TOC byte
// announcing one 20 ms Opus frame (loadTOC), then the packet's index (8
// bytes, big endian), then filler. It is the size of 20 ms of speech at
// about 24 kbit/s, costs nothing to encode, and parses as 20 ms of Opus,
// so a transceiver paces its echo at the rate it was sent; its frame is
// not speech (a PCM session decodes it to noise), and an echo backend
// returns it untouched.
//
// Echoes are counted, not matched: a packet coming back is told apart by
// its RTP sequence number, extended past 16 bits by counting wraps. The
// transceiver's paced playout numbers the packets it sends itself, and a
// PCM session re-encodes the audio, so what is counted is the distinct
// packets of audio that came back, whatever their payload; the loss is
// 1 − received ÷ sent. Against a backend that does not echo, loss and gaps
// describe the backend's own audio, not the round trip.
//
// After streaming, a session whose data channel has opened (the stream
// starts once it has, or after 10 s without it) sends a ping on it
// ({"type":"ping","id":"load-<i>-<random>"}), waits up to 15 s
// (closingPingWait) for the same message to come back (an echo backend
// returns it; against another backend, or when the channel never opened,
// the session reports FailDataChannel), lets echoes in flight arrive for
// LoadTail, sends the DELETE and closes the peer connection.
//
// With LoadOptions.Vanish, a session instead stands for a client that
// loses its network: it connects, waits a random while and closes its
// sockets with nothing said to the server (see Vanish).
type Load struct {
	opts LoadOptions
	api  *webrtc.API

	targets []*url.URL // parsed LoadOptions.URLs
	frames  [][]byte   // Opus frames of Options.Audio; nil for the counter payload

	mark atomic.Int64 // unix ns of Mark; 0 before

	// Progress counters.
	started, connected, live, ended, failed atomic.Int64
	sent, received                          atomic.Int64

	mu      sync.Mutex
	results []SessionResult
}

// LoadOptions configures a Load.
type LoadOptions struct {
	// URLs are signaling endpoints (as Options.URL); session i goes to
	// URLs[i % len(URLs)]. At least one is required.
	URLs []string
	// Sessions is the number of sessions, all live at once once ramped
	// up. Required, positive.
	Sessions int
	// Duration is how long each session streams audio after it connects.
	// Required, positive.
	Duration time.Duration
	// Ramp is the delay between two session starts: N sessions take
	// (N-1)×Ramp to start. 0 starts them all at once.
	Ramp time.Duration
	// Audio, if set, is the speech every session sends (looped), encoded
	// to Opus once; nil sends the counter payload described on Load.
	Audio *WAV
	// AuthToken, if set, is sent as "Authorization: Bearer <AuthToken>" on
	// the POST and the DELETE.
	AuthToken string
	// Header holds extra headers for the POST and the DELETE.
	Header http.Header
	// SettingEngine, if set, is used for every session (tests bind it to
	// loopback; a chaos test gives it its own transport.Net). If nil,
	// Load includes loopback candidates, disables mDNS and gathers on
	// udp4 only (Network): one candidate per session keeps the offer small.
	SettingEngine *webrtc.SettingEngine
	// Network is what the default SettingEngine gathers on, as
	// Options.Network, IPv4 only: "udp" (also ""), "tcp" (ICE-TCP only)
	// or "any".
	Network string
	// Vanish, if positive, makes every session a client that loses its
	// network instead of one that streams audio: once ICE connects, it
	// waits a uniform random 0 to Vanish, then closes its UDP sockets with
	// no DELETE, no DTLS close_notify and no SCTP ABORT, as a phone that
	// drops off its network does, so that the server must notice by
	// itself (ICE consent freshness, RFC 7675). The moment is
	// SessionResult.VanishedNS; Duration is not used. A vanished session
	// has no Failure: only signaling and connecting can fail.
	Vanish time.Duration
	// NoEcho is for a backend that does not echo (a real agent): no
	// closing ping is sent or required, and the summary's loss is left
	// out (the gaps are then those of the backend's own audio).
	NoEcho bool
	// ConnectTimeout bounds signaling plus ICE and DTLS; 0 means 30 s.
	ConnectTimeout time.Duration
	// HTTPClient is used for signaling; nil uses one with a 10 s timeout.
	HTTPClient *http.Client
	// OnConnected, if set, is called as each session connects (from its
	// own goroutine).
	OnConnected func(SessionResult)
	// OnSession, if set, is called with each session's result as it ends
	// (from its own goroutine).
	OnSession func(SessionResult)
}

// Failure reasons of a session, the keys of LoadSummary.Failures.
const (
	// FailSignaling: the POST failed or was answered with an error (the
	// session's Error names the status, e.g. 503 at capacity).
	FailSignaling = "signaling"
	// FailConnect: the peer connection failed or the server closed DTLS
	// before it connected.
	FailConnect = "connect_failed"
	// FailConnectTimeout: not connected within ConnectTimeout.
	FailConnectTimeout = "connect_timeout"
	// FailDropped: the connection failed, or the server closed it, while
	// audio streamed.
	FailDropped = "dropped"
	// FailDataChannel: connected, but the data channel did not open or the
	// ping was not answered.
	FailDataChannel = "data_channel"
	// FailClient: the client could not build its peer connection.
	FailClient = "client"
)

// LoadTail is how long a session waits after its last packet for echoes
// still in flight before it hangs up.
const LoadTail = 300 * time.Millisecond

// closingPingWait bounds the wait for the echo of a session's closing
// data channel ping. SCTP retransmits a lost message on its T3-rtx timer,
// at least 1 s and doubled on each expiry (RFC 4960 §6.3.3), so on a lossy
// path a ping and its echo can need several seconds each; 5 s lost about
// 1 session in 100 of the chaos suite's 5%-loss run.
const closingPingWait = 15 * time.Second

// loadPayloadSize is the counter payload's size in bytes.
const loadPayloadSize = 60

// loadTOC is the counter payload's first byte, an Opus TOC byte (RFC 6716
// §3.1): configuration 15 (Hybrid fullband, 20 ms frames, the mode libopus
// picks for speech at this bitrate) in the top 5 bits, then s = 0 (mono)
// and frame count code 0 (one frame). A payload starting with 0x00 would
// announce a 10 ms SILK frame, and a transceiver pacing its echo would
// play 20 ms of packets in 10 ms.
const loadTOC = 15 << 3

// SessionResult is one session's outcome. Times are unix nanoseconds on
// the load generator's clock, 0 when the event did not happen.
type SessionResult struct {
	I        int    `json:"i"`                 // index, in start order
	URLIndex int    `json:"url_index"`         // index into LoadOptions.URLs
	Session  string `json:"session,omitempty"` // the session's URL (Location)

	PostedNS       int64   `json:"posted_ns"`
	ConnectedNS    int64   `json:"connected_ns,omitempty"`
	DisconnectedNS int64   `json:"disconnected_ns,omitempty"` // first ICE "disconnected"
	FailedNS       int64   `json:"failed_ns,omitempty"`       // peer connection "failed"
	ClosedNS       int64   `json:"closed_ns,omitempty"`       // DTLS closed by the server (close_notify)
	ICEFailed      bool    `json:"ice_failed"`
	SetupMS        float64 `json:"setup_ms"` // POST to peer connection "connected"; 0 when it never connected

	Sent       int `json:"sent"`
	Received   int `json:"received"`   // distinct packets echoed back
	Duplicates int `json:"duplicates"` // packets delivered more than once
	Reordered  int `json:"reordered"`  // arrived after a later-sent packet

	MaxGapMS     float64 `json:"max_gap_ms"`      // largest inter-arrival gap while streaming
	MarkGapMS    float64 `json:"mark_gap_ms"`     // largest gap ending within 30 s after Mark
	PreMarkGapMS float64 `json:"pre_mark_gap_ms"` // largest gap in the 5 s before Mark
	LastRxNS     int64   `json:"last_rx_ns,omitempty"`
	StreamEndNS  int64   `json:"stream_end_ns,omitempty"`

	DCOpen    bool `json:"dc_open"`
	DCEchoEnd bool `json:"dc_echo_end"` // the closing ping was answered

	// VanishedNS is when the session closed its sockets unannounced
	// (LoadOptions.Vanish); ConnectedNS before it means DTLS was up, and
	// DCOpen then says whether the data channel was open.
	VanishedNS int64 `json:"vanished_ns,omitempty"`

	// Failure is one of the Fail* reasons; "" for a session that went
	// through.
	Failure string `json:"failure,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Windows around Mark for SessionResult.MarkGapMS and PreMarkGapMS.
const (
	markWindow    = 30 * time.Second
	preMarkWindow = 5 * time.Second
)

// LoadProgress is a snapshot of a running Load.
type LoadProgress struct {
	Elapsed   time.Duration
	Started   int // sessions whose offer was sent
	Connected int // sessions that connected
	Live      int // connected and not yet ended
	Ended     int // sessions over, whatever the outcome
	Failed    int // sessions with a Failure
	Sent      int64
	Received  int64
}

// String formats the snapshot as one progress line.
func (p LoadProgress) String() string {
	loss := 0.0
	if p.Sent > 0 {
		loss = max(0, 1-float64(p.Received)/float64(p.Sent))
	}
	return fmt.Sprintf("%6.1fs  started %d  connected %d  live %d  ended %d  failed %d  packets %d sent %d back (%.2f%% not back yet)",
		p.Elapsed.Seconds(), p.Started, p.Connected, p.Live, p.Ended, p.Failed, p.Sent, p.Received, 100*loss)
}

// NewLoad checks opts and prepares the sessions' shared parts (the Pion
// API, the encoded audio). Errors wrap ErrOptions.
func NewLoad(opts LoadOptions) (*Load, error) {
	if len(opts.URLs) == 0 {
		return nil, fmt.Errorf("%w: no signaling URL", ErrOptions)
	}
	var targets []*url.URL
	for _, u := range opts.URLs {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") {
			return nil, fmt.Errorf("%w: URL %q is not an http(s) URL", ErrOptions, u)
		}
		targets = append(targets, p)
	}
	if opts.Sessions <= 0 {
		return nil, fmt.Errorf("%w: sessions must be positive, got %d", ErrOptions, opts.Sessions)
	}
	if opts.Duration <= 0 && opts.Vanish <= 0 {
		return nil, fmt.Errorf("%w: duration must be positive, got %v", ErrOptions, opts.Duration)
	}
	if opts.Vanish < 0 {
		return nil, fmt.Errorf("%w: vanish must not be negative, got %v", ErrOptions, opts.Vanish)
	}
	if opts.Ramp < 0 {
		return nil, fmt.Errorf("%w: ramp must not be negative, got %v", ErrOptions, opts.Ramp)
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 30 * time.Second
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	l := &Load{opts: opts, targets: targets}
	if opts.Audio != nil {
		// One pass of the file, looped by the sender: the frames are
		// shared, read-only, by every session.
		frames, err := encodeOpus(opts.Audio, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrOptions, err)
		}
		l.frames = frames
	}
	var err error
	if l.api, err = newLoadAPI(opts.SettingEngine, nil, opts.Network); err != nil {
		return nil, err
	}
	return l, nil
}

// newLoadAPI builds the API every session shares: Opus only, RTCP reports
// (so that the server sees receiver reports with LSR/DLSR, as from a
// browser), no NACK, TWCC or other interceptors. With n set, the sessions
// open their sockets on n.
func newLoadAPI(se *webrtc.SettingEngine, n transport.Net, network string) (*webrtc.API, error) {
	var me webrtc.MediaEngine
	codec := webrtc.RTPCodecParameters{
		RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2, SDPFmtpLine: opusFmtp},
		PayloadType:        OpusPayloadType,
	}
	if err := me.RegisterCodec(codec, webrtc.RTPCodecTypeAudio); err != nil {
		return nil, err
	}
	var ir interceptor.Registry
	if err := webrtc.ConfigureRTCPReports(&ir); err != nil {
		return nil, err
	}
	if se == nil {
		se = &webrtc.SettingEngine{}
		se.SetIncludeLoopbackCandidate(true)
		se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
		se.SetNetworkTypes(networkTypes(network, true))
	}
	if n != nil {
		own := *se
		own.SetNet(n)
		se = &own
	}
	return webrtc.NewAPI(webrtc.WithMediaEngine(&me), webrtc.WithInterceptorRegistry(&ir), webrtc.WithSettingEngine(*se)), nil
}

// Mark records now as the moment of a fault: each session then reports
// the largest audio gap ending within 30 s after it (MarkGapMS) and the
// largest in the 5 s before (PreMarkGapMS), and the summary their
// distribution (LoadSummary.MarkGapMS). The first call counts; it may be
// made from any goroutine.
func (l *Load) Mark() time.Time {
	now := time.Now()
	l.mark.CompareAndSwap(0, now.UnixNano())
	return now
}

// Progress returns a snapshot of the counters.
func (l *Load) Progress(start time.Time) LoadProgress {
	c, e := l.connected.Load(), l.ended.Load()
	return LoadProgress{
		Elapsed: time.Since(start), Started: int(l.started.Load()), Connected: int(c),
		Live: int(l.live.Load()), Ended: int(e), Failed: int(l.failed.Load()),
		Sent: l.sent.Load(), Received: l.received.Load(),
	}
}

// Run starts the sessions Ramp apart, waits for all of them to end and
// returns the summary; progress, if not nil, gets a progress line every
// interval (0 means 2 s). Cancelling ctx stops starting sessions and ends
// the live ones early (they still hang up); the summary covers those that
// started.
func (l *Load) Run(ctx context.Context, progress io.Writer, interval time.Duration) LoadSummary {
	start := time.Now()
	if interval <= 0 {
		interval = 2 * time.Second
	}
	stopProgress := make(chan struct{})
	var progressDone sync.WaitGroup
	if progress != nil {
		progressDone.Go(func() {
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					fmt.Fprintln(progress, l.Progress(start))
				case <-stopProgress:
					return
				}
			}
		})
	}
	var wg sync.WaitGroup
	var ramp <-chan time.Time // nil (no wait) when Ramp is 0
	if l.opts.Ramp > 0 {
		t := time.NewTicker(l.opts.Ramp)
		defer t.Stop()
		ramp = t.C
	}
starting:
	for i := range l.opts.Sessions {
		if i > 0 && ramp != nil {
			select {
			case <-ramp:
			case <-ctx.Done():
				break starting
			}
		} else if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			r := l.session(ctx, i)
			l.mu.Lock()
			l.results = append(l.results, r)
			l.mu.Unlock()
			if l.opts.OnSession != nil {
				l.opts.OnSession(r)
			}
		})
	}
	wg.Wait()
	close(stopProgress)
	progressDone.Wait()
	if progress != nil {
		fmt.Fprintln(progress, l.Progress(start))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.SortFunc(l.results, func(a, b SessionResult) int { return a.I - b.I })
	sum := Summarize(l.opts, l.results, time.Since(start))
	if mark := l.mark.Load(); mark != 0 {
		// Sessions live at the mark: connected before it, streaming after.
		var gapsMS []float64
		for _, r := range l.results {
			if r.ConnectedNS != 0 && r.ConnectedNS < mark && r.StreamEndNS > mark {
				gapsMS = append(gapsMS, r.MarkGapMS)
			}
		}
		d := distribution(gapsMS)
		sum.MarkGapMS = &d
	}
	return sum
}

// Results returns every ended session's result, in start order once Run
// has returned.
func (l *Load) Results() []SessionResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.results)
}

// Summarize sums up results, the sessions of a load run that took
// elapsed.
func Summarize(opts LoadOptions, results []SessionResult, elapsed time.Duration) LoadSummary {
	sum := LoadSummary{
		URLs: opts.URLs, Sessions: len(results), DurationS: opts.Duration.Seconds(),
		RampMS: float64(opts.Ramp.Microseconds()) / 1000, ElapsedS: elapsed.Seconds(), Failures: map[string]int{},
	}
	var setup, gapsMS []float64
	firstError := map[string]SessionResult{}
	for _, r := range results {
		if r.Failure != "" {
			sum.Failures[r.Failure]++
			if first, ok := firstError[r.Failure]; !ok || r.I < first.I {
				firstError[r.Failure] = r
			}
		} else {
			sum.OK++
		}
		if r.VanishedNS != 0 {
			sum.Vanished++
		}
		if r.ConnectedNS == 0 {
			continue
		}
		sum.Connected++
		setup = append(setup, r.SetupMS)
		sum.PacketsSent += r.Sent
		sum.PacketsReceived += r.Received
		switch {
		case r.Sent > 0 && r.Received == 0:
			sum.NoAudio++ // no gap to measure: not a perfect one
		case r.Sent > 0:
			gapsMS = append(gapsMS, r.MaxGapMS)
		}
	}
	for reason, r := range firstError {
		if sum.Errors == nil {
			sum.Errors = map[string]string{}
		}
		sum.Errors[reason] = r.Error
	}
	sum.SetupMS = distribution(setup)
	sum.MaxGapMS = distribution(gapsMS)
	if sum.PacketsSent > 0 && !opts.NoEcho {
		sum.Loss = max(0, 1-float64(sum.PacketsReceived)/float64(sum.PacketsSent))
	}
	return sum
}

// LoadSummary is the outcome of a load run, printed as JSON by
// `switchboard load`.
type LoadSummary struct {
	URLs      []string `json:"urls"`
	Sessions  int      `json:"sessions"`  // sessions started
	Connected int      `json:"connected"` // sessions whose peer connection connected
	// OK counts sessions with no failure: connected and streamed to the
	// end, or, with LoadOptions.Vanish, connected ICE and vanished.
	OK int `json:"ok"`
	// Vanished counts sessions that vanished (LoadOptions.Vanish).
	Vanished int `json:"vanished,omitempty"`
	// Failures counts sessions by failure reason (the Fail* constants).
	Failures map[string]int `json:"failures"`
	// Errors holds, for each failure reason, the error of the first
	// session (in start order) that failed for it; absent without failures.
	Errors    map[string]string `json:"errors,omitempty"`
	DurationS float64           `json:"duration_s"` // audio per session, seconds
	RampMS    float64           `json:"ramp_ms"`
	ElapsedS  float64           `json:"elapsed_s"` // the whole run
	// SetupMS is the time from the POST to the peer connection's
	// "connected" state, over connected sessions. With LoadOptions.Vanish
	// that is the sessions whose DTLS handshake finished before they
	// vanished; those that vanished earlier (a random wait near 0) have
	// no setup time and are left out.
	SetupMS Distribution `json:"setup_ms"`
	// PacketsSent and PacketsReceived are summed over connected sessions;
	// Loss is 1 - received/sent (0 with LoadOptions.NoEcho).
	PacketsSent     int     `json:"packets_sent"`
	PacketsReceived int     `json:"packets_received"`
	Loss            float64 `json:"loss"`
	// NoAudio counts connected sessions that sent audio and received
	// none back (a backend that never answered, or an echo that lost
	// everything); they are left out of MaxGapMS.
	NoAudio int `json:"no_audio"`
	// MaxGapMS is the distribution, over sessions that received audio, of
	// each session's largest gap between two received audio packets
	// (20 ms on a clean path).
	MaxGapMS Distribution `json:"max_gap_ms"`
	// MarkGapMS, present after Load.Mark (SIGUSR1 to `switchboard load`),
	// is the distribution, over the sessions live at the mark, of each
	// one's largest audio gap ending within 30 s after it: how long the
	// audio stopped across the fault the mark stands for.
	MarkGapMS *Distribution `json:"mark_gap_ms,omitempty"`
}

// Distribution summarizes a sample: nearest-rank percentiles.
type Distribution struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func distribution(xs []float64) Distribution {
	if len(xs) == 0 {
		return Distribution{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := func(p float64) float64 { return s[max(0, int(math.Ceil(p*float64(len(s))))-1)] }
	return Distribution{N: len(s), P50: rank(0.50), P99: rank(0.99), Max: s[len(s)-1]}
}

// gaps fills the gap figures from the arrival times: intervals between
// consecutive arrivals up to the end of streaming, and the trailing one
// from the last arrival to the end if it came earlier.
func gaps(r *SessionResult, arrivals []int64, end, markNS int64) {
	points := slices.DeleteFunc(slices.Clone(arrivals), func(t int64) bool { return t > end })
	if len(points) == 0 {
		return
	}
	points = append(points, end)
	for i := 1; i < len(points); i++ {
		g := float64(points[i]-points[i-1]) / 1e6
		r.MaxGapMS = max(r.MaxGapMS, g)
		if markNS == 0 {
			continue
		}
		if points[i] >= markNS && points[i] <= markNS+int64(markWindow) {
			r.MarkGapMS = max(r.MarkGapMS, g)
		}
		if points[i] < markNS && points[i] >= markNS-int64(preMarkWindow) {
			r.PreMarkGapMS = max(r.PreMarkGapMS, g)
		}
	}
}
