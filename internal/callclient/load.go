package callclient

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/interceptor"
	"github.com/pion/rtp"
	"github.com/pion/transport/v5"
	"github.com/pion/transport/v5/stdnet"
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

// loadSession is the state one session's callbacks share.
type loadSession struct {
	r  *SessionResult
	mu sync.Mutex // guards r's times and the receive state

	arrivals []int64  // unix ns of each first arrival, in order
	seen     []uint64 // bitset of extended sequence numbers received
	maxExt   uint64   // highest extended sequence number received
	anyRx    bool
}

// stamp records now into *p once.
func (s *loadSession) stamp(p *int64) {
	s.mu.Lock()
	if *p == 0 {
		*p = time.Now().UnixNano()
	}
	s.mu.Unlock()
}

// receive records one echoed packet with sequence number seq; it reports
// whether it was new.
func (s *loadSession) receive(seq uint16, now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recordLocked(extendSeq(s.maxExt, s.anyRx, seq), now)
}

// extendSeq extends the 16-bit seq to the 64-bit count nearest to maxExt,
// the highest extended sequence number seen so far (RFC 3550 §A.1): a
// small step back is a late packet, a large one a wrap.
func extendSeq(maxExt uint64, any bool, seq uint16) uint64 {
	if !any {
		return uint64(seq)
	}
	ext := maxExt&^0xffff | uint64(seq)
	switch {
	case ext > maxExt && ext-maxExt > 1<<15 && ext >= 1<<16:
		ext -= 1 << 16
	case ext < maxExt && maxExt-ext > 1<<15:
		ext += 1 << 16
	}
	return ext
}

func (s *loadSession) recordLocked(ext uint64, now int64) bool {
	w := int(ext / 64)
	if w >= len(s.seen) {
		s.seen = append(s.seen, make([]uint64, w+1-len(s.seen))...)
	}
	bit := uint64(1) << (ext % 64)
	if s.seen[w]&bit != 0 {
		s.r.Duplicates++
		return false
	}
	s.seen[w] |= bit
	s.arrivals = append(s.arrivals, now)
	if s.anyRx && ext < s.maxExt {
		s.r.Reordered++
	}
	if !s.anyRx || ext > s.maxExt {
		s.maxExt = ext
	}
	s.anyRx = true
	return true
}

// session runs session i to its end and returns its result: it builds
// the peer connection (dial), posts the offer (signal), waits for it to
// connect, streams the audio, says goodbye (hangUp) and sums up what came
// back (measure).
func (l *Load) session(ctx context.Context, i int) SessionResult {
	c := &loadRun{l: l, r: SessionResult{I: i, URLIndex: i % len(l.opts.URLs)}}
	c.s = &loadSession{r: &c.r}
	l.started.Add(1)
	api, err := c.newAPI()
	if c.vn != nil {
		defer c.vn.vanish()
	}
	if err != nil {
		return c.fail(FailClient, err)
	}
	err = c.dial(api)
	if c.pc != nil {
		defer c.pc.Close()
	}
	if err != nil {
		return c.fail(FailClient, err)
	}
	c.watch()
	defer c.closePC()

	cctx, cancel := context.WithTimeout(ctx, l.opts.ConnectTimeout)
	defer cancel()
	c.r.PostedNS = time.Now().UnixNano()
	session, err := l.signal(cctx, c.pc, l.targets[c.r.URLIndex])
	c.r.Session, c.session = session, session
	if err != nil {
		l.hangup(session)
		return c.fail(FailSignaling, err)
	}
	if c.vn != nil {
		return l.vanish(ctx, cctx, &c.r, c.s, c.vn, c.iceUp, c.failed, c.dcOpen, c.closePC, c.fail)
	}
	if reason, err := c.waitConnected(cctx); err != nil {
		l.hangup(session)
		return c.fail(reason, err)
	}
	l.connected.Add(1)
	l.live.Add(1)
	defer l.live.Add(-1)
	c.reportConnected()
	c.waitDataChannel()

	sendErr := l.stream(ctx, c.track, c.failed, &c.r)
	streamEnd := time.Now().UnixNano()
	if !c.r.DCOpen {
		// Opened while the audio streamed: on a lossy path SCTP's
		// association and the channel's DCEP open each retransmit on
		// timers from 1 s, doubled on each loss (RFC 4960 §6.3.3), so
		// four losses in a row take one of them past the 10 s of
		// waitDataChannel.
		select {
		case <-c.dcOpen:
			c.r.DCOpen = true
		default:
		}
	}
	c.hangUp()
	c.closePC()
	return c.measure(streamEnd, sendErr)
}

// loadRun is one session of a load run from its start to its end: its
// peer connection, the channels its callbacks close, and its result. Only
// the goroutine running Load.session touches its fields after watch,
// except r, which callbacks update under s.mu.
type loadRun struct {
	l       *Load
	r       SessionResult
	s       *loadSession
	vn      *vanishNet // nil unless the session vanishes (LoadOptions.Vanish)
	session string     // the session URL, "" before signaling or when none

	pc    *webrtc.PeerConnection
	track *webrtc.TrackLocalStaticRTP
	tr    *webrtc.RTPTransceiver
	dc    *webrtc.DataChannel

	// Closed once each, by the peer connection's callbacks.
	connected, failed, dcOpen, iceUp chan struct{}
	pong                             chan string // the IDs of ping echoes

	readers sync.WaitGroup // the RTP and RTCP readers
	closing atomic.Bool    // set when the peer connection closes: no new readers
}

// fail ends the session with a failure: reason, one of the Fail…
// constants, and err.
func (c *loadRun) fail(reason string, err error) SessionResult {
	c.r.Failure, c.r.Error = reason, err.Error()
	c.l.failed.Add(1)
	c.l.ended.Add(1)
	return c.r
}

// newAPI returns the API the session's peer connection is made with: the
// load's own, or, for a session that vanishes, one on sockets of its
// own, to close at once (c.vn, set even when the API then fails).
func (c *loadRun) newAPI() (*webrtc.API, error) {
	if c.l.opts.Vanish <= 0 {
		return c.l.api, nil
	}
	std, err := stdnet.NewNet()
	if err != nil {
		return nil, err
	}
	c.vn = &vanishNet{Net: std}
	return newLoadAPI(c.l.opts.SettingEngine, c.vn, c.l.opts.Network)
}

// dial makes the peer connection (c.pc, set as soon as it exists) with
// its sendrecv Opus track and its data channel.
func (c *loadRun) dial(api *webrtc.API) error {
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return err
	}
	c.pc = pc
	c.track, err = webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "switchboard-load")
	if err != nil {
		return err
	}
	c.tr, err = pc.AddTransceiverFromTrack(c.track, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendrecv})
	if err != nil {
		return err
	}
	c.dc, err = pc.CreateDataChannel(DataChannelLabel, nil)
	return err
}

// watch sets the peer connection's callbacks, which stamp the session's
// state changes into c.r and close c's channels, and starts the readers
// of RTP and RTCP; closePC stops them.
func (c *loadRun) watch() {
	s, r, pc := c.s, &c.r, c.pc
	c.connected, c.failed, c.dcOpen = make(chan struct{}), make(chan struct{}), make(chan struct{})
	c.iceUp = make(chan struct{})
	c.pong = make(chan string, 4)
	var connOnce, failOnce, openOnce, iceOnce sync.Once
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		switch st {
		case webrtc.PeerConnectionStateConnected:
			s.stamp(&r.ConnectedNS)
			connOnce.Do(func() { close(c.connected) })
		case webrtc.PeerConnectionStateFailed:
			s.stamp(&r.FailedNS)
			failOnce.Do(func() { close(c.failed) })
		}
	})
	pc.OnICEConnectionStateChange(func(st webrtc.ICEConnectionState) {
		switch st {
		case webrtc.ICEConnectionStateConnected:
			iceOnce.Do(func() { close(c.iceUp) })
		case webrtc.ICEConnectionStateDisconnected:
			s.stamp(&r.DisconnectedNS)
		case webrtc.ICEConnectionStateFailed:
			s.mu.Lock()
			r.ICEFailed = true
			s.mu.Unlock()
		}
	})
	pc.SCTP().Transport().OnStateChange(func(st webrtc.DTLSTransportState) {
		if st == webrtc.DTLSTransportStateClosed {
			s.stamp(&r.ClosedNS)
			failOnce.Do(func() { close(c.failed) })
		}
	})
	c.dc.OnOpen(func() { openOnce.Do(func() { close(c.dcOpen) }) })
	c.dc.OnMessage(func(m webrtc.DataChannelMessage) {
		// Only the ping's echo is awaited: the events a transceiver also
		// sends here (output_audio_buffer.*) must not crowd it out.
		var echo struct{ Type, ID string }
		if json.Unmarshal(m.Data, &echo) != nil || echo.Type != "ping" {
			return
		}
		select {
		case c.pong <- echo.ID:
		default:
		}
	})
	c.readers.Go(func() { // RTCP from the server, so that the report interceptors see it
		buf := make([]byte, 1500)
		for {
			if _, _, err := c.tr.Sender().Read(buf); err != nil {
				return
			}
		}
	})
	pc.OnTrack(func(t *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		if c.closing.Load() {
			return
		}
		c.readers.Add(1)
		defer c.readers.Done()
		buf := make([]byte, 1500)
		var h rtp.Header
		for {
			n, _, err := t.Read(buf)
			if err != nil {
				return
			}
			if _, err := h.Unmarshal(buf[:n]); err != nil {
				continue
			}
			if s.receive(h.SequenceNumber, time.Now().UnixNano()) {
				c.l.received.Add(1)
			}
		}
	})
}

// closePC closes the peer connection and waits for the readers watch
// started. It may be called more than once.
func (c *loadRun) closePC() {
	c.closing.Store(true)
	_ = c.pc.Close()
	c.readers.Wait()
}

// waitConnected waits for the peer connection to connect; when it fails
// first, or cctx ends, it returns the failure's reason and error.
func (c *loadRun) waitConnected(cctx context.Context) (string, error) {
	select {
	case <-c.connected:
		return "", nil
	case <-c.failed:
		return FailConnect, fmt.Errorf("peer connection failed before connecting; %s", connectHint(remoteSDP(c.pc)))
	case <-cctx.Done():
		return FailConnectTimeout, fmt.Errorf("not connected after %v; %s", c.l.opts.ConnectTimeout, connectHint(remoteSDP(c.pc)))
	}
}

// reportConnected records the setup time and hands a snapshot of the
// result to LoadOptions.OnConnected.
func (c *loadRun) reportConnected() {
	c.s.mu.Lock()
	c.r.SetupMS = float64(c.r.ConnectedNS-c.r.PostedNS) / 1e6
	snapshot := c.r
	c.s.mu.Unlock()
	if c.l.opts.OnConnected != nil {
		c.l.opts.OnConnected(snapshot)
	}
}

// waitDataChannel waits up to 10 s for the data channel to open, unless
// the session fails first.
func (c *loadRun) waitDataChannel() {
	dcWait := time.NewTimer(10 * time.Second)
	select {
	case <-c.dcOpen:
		c.r.DCOpen = true
	case <-c.failed:
	case <-dcWait.C:
	}
	dcWait.Stop()
}

// hangUp ends a session that has not failed: when the data channel is
// open it checks that it still echoes (closingPing, unless NoEcho), then
// waits LoadTail for the last echoed audio and DELETEs the session.
func (c *loadRun) hangUp() {
	select {
	case <-c.failed:
		return
	default:
	}
	if c.r.DCOpen && !c.l.opts.NoEcho && c.closingPing() {
		c.r.DCEchoEnd = true
	}
	time.Sleep(LoadTail)
	c.l.hangup(c.session)
}

// closingPing sends a ping on the data channel and reports whether its
// echo came back within closingPingWait, before the session failed.
func (c *loadRun) closingPing() bool {
	var id [8]byte
	_, _ = rand.Read(id[:])
	pingID := fmt.Sprintf("load-%d-%x", c.r.I, id)
	if err := c.dc.SendText(fmt.Sprintf(`{"type":"ping","id":%q}`, pingID)); err != nil {
		return false
	}
	deadline := time.NewTimer(closingPingWait)
	defer deadline.Stop()
	for {
		select {
		case got := <-c.pong:
			if got == pingID {
				return true
			}
		case <-deadline.C:
			return false
		case <-c.failed:
			return false
		}
	}
}

// measure sums up the ended session, whose audio stopped at streamEnd
// (unix ns) with the first write error sendErr, and returns its result:
// what was received, the gaps, and the failure, if any.
func (c *loadRun) measure(streamEnd int64, sendErr error) SessionResult {
	l, s, r := c.l, c.s, &c.r
	s.mu.Lock()
	defer s.mu.Unlock()
	r.StreamEndNS = streamEnd
	r.Received = len(s.arrivals)
	if len(s.arrivals) > 0 {
		r.LastRxNS = s.arrivals[len(s.arrivals)-1]
	}
	gaps(r, s.arrivals, streamEnd, l.mark.Load())
	l.ended.Add(1)
	switch {
	case r.FailedNS != 0 || (r.ClosedNS != 0 && r.ClosedNS < streamEnd):
		r.Failure = FailDropped
	case sendErr != nil:
		r.Failure, r.Error = FailDropped, fmt.Sprintf("write RTP: %v", sendErr)
	case !r.DCOpen || (!r.DCEchoEnd && !l.opts.NoEcho):
		r.Failure = FailDataChannel
	}
	if r.Failure != "" {
		l.failed.Add(1)
	}
	return *r
}

// vanish runs a Vanish session from its signaling on: it waits for ICE
// to connect, then a random 0 to Vanish, and closes the sockets; closePC
// then closes the peer connection, whose goodbyes go nowhere.
func (l *Load) vanish(ctx, cctx context.Context, r *SessionResult, s *loadSession, vn *vanishNet, iceUp, failed, dcOpen <-chan struct{}, closePC func(), fail func(string, error) SessionResult) SessionResult {
	select {
	case <-iceUp:
	case <-failed:
		return fail(FailConnect, errors.New("peer connection failed before ICE connected"))
	case <-cctx.Done():
		return fail(FailConnectTimeout, fmt.Errorf("ICE not connected after %v", l.opts.ConnectTimeout))
	}
	l.connected.Add(1)
	wait := time.NewTimer(time.Duration(mrand.Int64N(int64(l.opts.Vanish) + 1)))
	select {
	case <-wait.C:
	case <-ctx.Done():
		wait.Stop()
	}
	vn.vanish()
	vanished := time.Now().UnixNano()
	select {
	case <-dcOpen:
		r.DCOpen = true
	default:
	}
	closePC()
	l.ended.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	r.VanishedNS = vanished
	// The peer connection reached "connected" only if DTLS finished
	// before the session vanished; one that vanished first has no setup
	// time (and ConnectedNS 0), not a setup time of 0.
	if r.ConnectedNS != 0 {
		r.SetupMS = float64(r.ConnectedNS-r.PostedNS) / 1e6
	}
	return *r
}

// vanishNet is a vanishing session's network: it remembers the UDP
// sockets ICE opens, so that the session can close them all at once.
type vanishNet struct {
	*stdnet.Net
	mu     sync.Mutex
	conns  []io.Closer
	closed bool
}

var _ transport.Net = (*vanishNet)(nil)

// ListenUDP opens a socket as stdnet does and remembers it.
func (n *vanishNet) ListenUDP(network string, laddr *net.UDPAddr) (transport.UDPConn, error) {
	c, err := n.Net.ListenUDP(network, laddr)
	if err == nil {
		n.keep(c)
	}
	return c, err
}

// ListenPacket opens a socket as stdnet does and remembers it.
func (n *vanishNet) ListenPacket(network, address string) (net.PacketConn, error) {
	c, err := n.Net.ListenPacket(network, address)
	if err == nil {
		n.keep(c)
	}
	return c, err
}

// keep remembers c, or closes it at once after vanish.
func (n *vanishNet) keep(c io.Closer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		_ = c.Close()
		return
	}
	n.conns = append(n.conns, c)
}

// vanish closes every socket, and any opened later.
func (n *vanishNet) vanish() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for _, c := range n.conns {
		_ = c.Close()
	}
	n.conns = nil
}

// stream sends one packet every 20 ms for Duration, until failed closes
// or ctx ends, and returns the first write error.
func (l *Load) stream(ctx context.Context, track *webrtc.TrackLocalStaticRTP, failed <-chan struct{}, r *SessionResult) error {
	var ssrc [4]byte
	_, _ = rand.Read(ssrc[:])
	pkt := &rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: OpusPayloadType, SSRC: binary.BigEndian.Uint32(ssrc[:])}}
	counter := newCounterPayload()
	tick := time.NewTicker(frameDuration)
	defer tick.Stop()
	stop := time.NewTimer(l.opts.Duration)
	defer stop.Stop()
	var sendErr error
	for idx := uint64(0); ; idx++ {
		select {
		case <-tick.C:
		case <-stop.C:
			return sendErr
		case <-failed:
			return sendErr
		case <-ctx.Done():
			return sendErr
		}
		if l.frames != nil {
			pkt.Payload = l.frames[idx%uint64(len(l.frames))]
		} else {
			binary.BigEndian.PutUint64(counter[1:], idx)
			pkt.Payload = counter
		}
		pkt.SequenceNumber = uint16(idx)
		pkt.Timestamp = uint32(idx * 960)
		if err := track.WriteRTP(pkt); err != nil && sendErr == nil {
			sendErr = err
		}
		r.Sent++
		l.sent.Add(1)
	}
}

// newCounterPayload returns a counter payload with index 0: loadTOC, the
// index, filler.
func newCounterPayload() []byte {
	p := make([]byte, loadPayloadSize)
	for i := range p {
		p[i] = byte(i * 7)
	}
	p[0] = loadTOC
	binary.BigEndian.PutUint64(p[1:], 0)
	return p
}

// signal POSTs the complete offer and applies the answer; it returns the
// absolute session URL ("" if there is none).
func (l *Load) signal(ctx context.Context, pc *webrtc.PeerConnection, target *url.URL) (string, error) {
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		return "", err
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		return "", err
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return "", fmt.Errorf("ICE gathering: %w", ctx.Err())
	}
	answer, session, _, err := l.signaling().post(ctx, l.opts.HTTPClient, target, pc.LocalDescription().SDP)
	if err != nil {
		return "", err
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
		return session.String(), fmt.Errorf("%w: set remote description: %w", ErrSignaling, err)
	}
	return session.String(), nil
}

// hangup DELETEs the session, if there is one; failures are ignored (the
// server ends the session on its own when the client goes).
func (l *Load) hangup(session string) {
	if session == "" {
		return
	}
	u, err := url.Parse(session)
	if err != nil {
		return
	}
	_ = l.signaling().delete(context.Background(), l.opts.HTTPClient, u)
}

// remoteSDP returns pc's remote description, or "" before one is set.
func remoteSDP(pc *webrtc.PeerConnection) string {
	if d := pc.RemoteDescription(); d != nil {
		return d.SDP
	}
	return ""
}

// signaling returns a call carrying only what post and delete use: the
// headers.
func (l *Load) signaling() *call {
	return &call{opts: Options{AuthToken: l.opts.AuthToken, Header: l.opts.Header}}
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
