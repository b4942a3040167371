// Package callclient runs one voice session against a Switchboard
// signaling URL with a Pion WebRTC client and reports how it went. It is
// the scripted counterpart of the demo page: smoke tests, load tests and
// latency measurements use it.
//
// # Signaling (docs/design.md §6)
//
//	POST <URL>
//	Content-Type: application/sdp
//	Authorization: Bearer <token>        (optional)
//	<complete SDP offer: ICE gathering finished, no trickle>
//
//	201 Created
//	Location: /v1/calls/{id}             (resolved against URL)
//	Content-Type: application/sdp
//	<complete SDP answer from an ICE-lite server>
//
//	DELETE <Location>                    ends the session
//
// Errors are 4xx/5xx with a JSON body {"error":{"message":"..."}}.
//
// # Media
//
// The offer has one sendrecv audio m-line carrying only Opus (48000/2,
// payload type 111, RFC 7587) and an SCTP data channel named "oai-events",
// created by the client. Once the peer connection is connected the client
// streams the WAV file as 20 ms Opus frames paced by a ticker, sends one
// JSON message on the data channel ({"type":"ping","id":"<random>"}) and
// waits for it to come back, and records every Opus payload sent and
// received so that an echo server can be checked payload for payload.
package callclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"
	"github.com/pion/webrtc/v4/pkg/media"
)

// DataChannelLabel is the label of the data channel the client creates;
// it matches OpenAI's Realtime WebRTC flow.
const DataChannelLabel = "oai-events"

// Opus payload format offered (RFC 7587).
const (
	OpusPayloadType = 111
	opusFmtp        = "minptime=10;useinbandfec=1"
)

// Errors returned by Run, wrapped with detail.
var (
	ErrOptions   = errors.New("callclient: invalid options")
	ErrSignaling = errors.New("callclient: signaling failed")
	ErrConnect   = errors.New("callclient: connection failed")
)

// connectHint returns what usually keeps a session from connecting once
// signaling succeeded, for the errors of Run and Load: the answer came,
// and the relay it advertises (answer's candidates) never let ICE through.
// A relay that drops the checks logs why ("relay: dropping datagrams").
func connectHint(answer string) string {
	var addrs []string
	for line := range strings.Lines(answer) {
		// a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ …
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "a=candidate:"))
		if strings.HasPrefix(line, "a=candidate:") && len(f) >= 6 {
			addrs = append(addrs, net.JoinHostPort(f[4], f[5])+"/"+strings.ToLower(f[2]))
		}
	}
	where := "the address the answer advertises"
	if len(addrs) > 0 {
		where += " (" + strings.Join(addrs, ", ") + ")"
	}
	return "usually the relay drops the checks: the relays' and transceivers' -token-key differ, " +
		"or the relay's -members lacks the transceiver's -id (the relay's log says which: \"relay: dropping datagrams\"); " +
		"or nothing answers at " + where + ": no relay there, a firewall, or a transceiver -advertise this client cannot reach"
}

// Bounds of the phases that follow streaming.
const (
	// echoDrain is how long Run waits, after the last frame was sent, for
	// packets still in flight; it stops early once every packet is back.
	echoDrain = 1 * time.Second
	// deleteTimeout bounds the DELETE that ends the session, which is sent
	// even when ctx is already done.
	deleteTimeout = 5 * time.Second
	// timeoutSlack is added to the clip length when Options.Timeout is 0.
	timeoutSlack = 15 * time.Second
)

// Options configures Run.
type Options struct {
	// URL is the signaling endpoint the offer is POSTed to, such as
	// "https://edge.example/v1/calls". Required.
	URL string
	// AudioPath is a 16-bit PCM WAV file (mono or stereo, 8/12/16/24/48
	// kHz). Required unless Audio is set.
	AudioPath string
	// Audio, if set, is sent instead of the file at AudioPath (harnesses
	// that synthesize their audio use it).
	Audio *WAV
	// Duration is how much audio to send; 0 sends the whole file once. A
	// Duration longer than the file loops it.
	Duration time.Duration
	// Timeout bounds the whole of Run, signaling to DELETE; 0 means the
	// audio length plus 15 s.
	Timeout time.Duration
	// Logger receives progress at debug level and problems at warn; nil
	// discards.
	Logger *slog.Logger
	// SettingEngine, if set, is used as is (tests inject one bound to
	// loopback). If nil, Run uses one that includes loopback host
	// candidates, disables mDNS, and gathers on udp4 and udp6 (udp4 only
	// with IPv4Only).
	SettingEngine *webrtc.SettingEngine
	// IPv4Only restricts the default SettingEngine to udp4 (tcp4 with
	// Network "tcp"). Ignored when SettingEngine is set.
	IPv4Only bool
	// Network is what the default SettingEngine gathers on: "udp" (the
	// default, also ""), "tcp" (ICE-TCP only, RFC 6544: the client's
	// active TCP candidates connect to the answer's passive one, as from
	// a network that drops UDP) or "any" (both; ICE picks). Ignored when
	// SettingEngine is set.
	Network string
	// AuthToken, if set, is sent as "Authorization: Bearer <AuthToken>" on
	// the POST, the PATCH of an ICE restart and the DELETE: a client token
	// (internal/auth) or an API key.
	AuthToken string
	// Header holds extra headers for the POST and the DELETE (e.g. a
	// region header a CDN would set in front of a director).
	Header http.Header
	// HTTPClient is used for signaling; nil uses a private client whose
	// idle connections are closed when Run returns.
	HTTPClient *http.Client
	// ICEServers are STUN/TURN servers the client gathers candidates from
	// (webrtc.Configuration.ICEServers); none by default.
	ICEServers []webrtc.ICEServer
	// RelayOnly sets iceTransportPolicy "relay": the client offers and
	// uses only TURN relay candidates, so all media goes through a TURN
	// server from ICEServers.
	RelayOnly bool
	// ICERestartAfter, if positive, makes Run restart ICE once (RestartICE,
	// a PATCH per RFC 9725 §4.3) this long after the connection is up,
	// while audio streams; Report.ICERestart says how it went.
	ICERestartAfter time.Duration
}

// SetupTimes are milliseconds from the start of the POST to each event; 0
// means the event did not happen.
type SetupTimes struct {
	SignalingMS       float64 `json:"signaling_ms"`         // answer received
	ICEConnectedMS    float64 `json:"ice_connected_ms"`     // ICE connection state "connected"
	DTLSConnectedMS   float64 `json:"dtls_connected_ms"`    // DTLS transport state "connected"
	DataChannelOpenMS float64 `json:"data_channel_open_ms"` // "oai-events" open
	FirstAudioMS      float64 `json:"first_audio_ms"`       // first RTP packet from the server
}

// Report is the outcome of one session. It marshals to JSON as printed by
// String.
type Report struct {
	Setup           SetupTimes `json:"setup_ms"`
	PacketsSent     int        `json:"packets_sent"`
	PacketsReceived int        `json:"packets_received"`
	// AudioEchoed is true when the server echoed the audio back: at least
	// one packet was received, PayloadMismatches is 0 (the received
	// payloads, in arrival order, are a subsequence of the sent payloads:
	// each equals a sent payload later than the one the previous matched),
	// and PacketsReceived*10 >= PacketsSent*9 (at least 90% came back).
	AudioEchoed bool `json:"audio_echoed"`
	// PayloadMismatches counts received payloads that did not match a sent
	// payload after the previous match, under the rule above.
	PayloadMismatches int `json:"payload_mismatches"`
	// DataChannelEchoed is true when the ping sent on "oai-events" came
	// back byte for byte.
	DataChannelEchoed bool `json:"data_channel_echoed"`
	// SessionURL is the absolute Location of the session.
	SessionURL string `json:"session_url"`
	// GatheringMS is how long ICE gathering took before the POST (the
	// offer is complete, so the POST waits for it): near 0 with host
	// candidates only, the TURN allocation round trips with a TURN server.
	GatheringMS float64 `json:"gathering_ms,omitempty"`
	// Started is when the POST began, the origin of Setup's times, on
	// this process's monotonic clock: a harness in the same process
	// measures other events (such as audio reaching a backend) against it.
	Started time.Time `json:"-"`
	Error   string    `json:"error,omitempty"`
	// MaxGapMS is the longest time between two consecutive received audio
	// packets, in milliseconds: 20 on a clean path, the outage otherwise.
	MaxGapMS float64 `json:"max_gap_ms"`
	// Transport is the transport of the last selected candidate pair,
	// "udp" or "tcp" (ICE-TCP); empty if none was selected.
	Transport string `json:"transport,omitempty"`
	// ICERestart reports the ICE restart of Options.ICERestartAfter; nil
	// when none was asked for.
	ICERestart *RestartReport `json:"ice_restart,omitempty"`

	// SentPayloads and ReceivedPayloads are the Opus payloads in order.
	SentPayloads     [][]byte `json:"-"`
	ReceivedPayloads [][]byte `json:"-"`
}

// RestartReport is the outcome of an ICE restart: times are milliseconds
// from the start of the restart (new offer created), 0 when the event did
// not happen.
type RestartReport struct {
	PatchMS float64 `json:"patch_ms"` // answer fragment received and applied
	// ResumedMS is when the first audio packet arrived after the answer
	// was applied.
	ResumedMS float64 `json:"resumed_ms"`
	// GapMS is the longest time between two consecutive received audio
	// packets where the later one arrived after the restart began: the
	// outage the restart caused, in milliseconds.
	GapMS float64 `json:"gap_ms"`
	// ETag is the ICE session's tag after the restart.
	ETag  string `json:"etag,omitempty"`
	Error string `json:"error,omitempty"`
}

// String returns the report as indented JSON, without HTML escapes.
func (r Report) String() string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // errors quote SDP and addresses: "<", ">" and "&" as they are
	if err := enc.Encode(r); err != nil {
		return fmt.Sprintf("report: %v", err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// Run performs one session as described in the package comment. It always
// returns a Report, filled as far as the session got; on failure the error
// is also in Report.Error. A session that connected but whose audio or
// data channel was not echoed is not an error: check AudioEchoed and
// DataChannelEchoed.
func Run(ctx context.Context, opts Options) (Report, error) {
	c := &call{opts: opts, log: opts.Logger}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	err := c.run(ctx)
	rep := c.report()
	if err != nil {
		rep.Error = err.Error()
	}
	return rep, err
}

// call is the state of one Run.
type call struct {
	opts Options
	log  *slog.Logger

	// Set before the peer connection exists, never mutated after.
	frames [][]byte
	ping   []byte

	// start is when the POST began; zero before. Written once before any
	// callback that reads it can fire.
	start time.Time

	connected chan struct{} // closed on peer connection state "connected"
	failed    chan struct{} // closed on "failed" or "closed"
	dcEcho    chan struct{} // closed when the ping comes back
	allBack   chan struct{} // closed when as many packets came back as were sent

	readers sync.WaitGroup // OnTrack read loops

	mu          sync.Mutex // guards the following
	transport   string     // the selected pair's local protocol, "udp" or "tcp"
	setup       SetupTimes
	sent        [][]byte
	received    [][]byte
	sessionURL  string
	gatheringMS float64
	lastAudio   time.Time // arrival of the latest audio packet
	maxGap      time.Duration
	restart     *RestartReport
	restartAt   time.Time // start of the ICE restart; zero before
	patched     bool      // the restart's answer was applied
	dcEchoed    bool
	stopReading bool // set before closing the peer connection
	signals     map[chan struct{}]bool
}

func (c *call) run(ctx context.Context) error {
	if c.opts.URL == "" {
		return fmt.Errorf("%w: URL is empty", ErrOptions)
	}
	if c.opts.AudioPath == "" && c.opts.Audio == nil {
		return fmt.Errorf("%w: AudioPath is empty", ErrOptions)
	}
	target, err := url.Parse(c.opts.URL)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") {
		return fmt.Errorf("%w: URL %q is not an http(s) URL", ErrOptions, c.opts.URL)
	}
	wav := c.opts.Audio
	if wav == nil {
		if wav, err = LoadWAV(c.opts.AudioPath); err != nil {
			return fmt.Errorf("%w: %w", ErrOptions, err)
		}
	}
	maxFrames := 0
	if c.opts.Duration > 0 {
		maxFrames = int((c.opts.Duration + frameDuration - 1) / frameDuration)
	}
	if c.frames, err = encodeOpus(wav, maxFrames); err != nil {
		return err
	}
	timeout := c.opts.Timeout
	if timeout <= 0 {
		timeout = time.Duration(len(c.frames))*frameDuration + timeoutSlack
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	c.ping, err = newPing()
	if err != nil {
		return err
	}
	for _, ch := range []*chan struct{}{&c.connected, &c.failed, &c.dcEcho, &c.allBack} {
		*ch = make(chan struct{})
	}
	c.signals = make(map[chan struct{}]bool)

	pc, track, err := c.newPeerConnection()
	if err != nil {
		return err
	}
	defer c.closePeerConnection(pc)

	httpc := c.opts.HTTPClient
	if httpc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		defer tr.CloseIdleConnections()
		httpc = &http.Client{Transport: tr}
	}

	offer, err := pc.CreateOffer(nil)
	if err != nil {
		return fmt.Errorf("create offer: %w", err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	gatherStart := time.Now()
	if err := pc.SetLocalDescription(offer); err != nil {
		return fmt.Errorf("set local description: %w", err)
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return fmt.Errorf("%w: ICE gathering: %w", ErrConnect, ctx.Err())
	}

	c.mu.Lock()
	c.start = time.Now()
	c.gatheringMS = float64(c.start.Sub(gatherStart).Microseconds()) / 1000
	c.mu.Unlock()
	answer, session, etag, err := c.post(ctx, httpc, target, pc.LocalDescription().SDP)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.setup.SignalingMS = c.sinceStartLocked()
	c.sessionURL = session.String()
	c.mu.Unlock()
	defer func() {
		if derr := c.delete(ctx, httpc, session); derr != nil {
			c.log.Warn("DELETE session", "url", session.String(), "err", derr)
		}
	}()

	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
		return fmt.Errorf("%w: set remote description: %w", ErrSignaling, err)
	}

	select {
	case <-c.connected:
	case <-c.failed:
		return fmt.Errorf("%w: peer connection state %s; %s", ErrConnect, pc.ConnectionState(), connectHint(answer))
	case <-ctx.Done():
		return fmt.Errorf("%w: not connected %v after the offer (%w); %s", ErrConnect,
			time.Since(c.start).Round(100*time.Millisecond), ctx.Err(), connectHint(answer))
	}
	c.log.Debug("connected", "session", session.String())

	if c.opts.ICERestartAfter > 0 {
		stop, restarted := make(chan struct{}), make(chan struct{})
		defer func() { close(stop); <-restarted }()
		go func() {
			defer close(restarted)
			c.restartICE(ctx, stop, httpc, pc, session.String(), etag)
		}()
	}
	if err := c.stream(ctx, track); err != nil {
		return err
	}
	c.drain(ctx)
	return nil
}

// restartICE waits Options.ICERestartAfter, restarts ICE and records how
// it went. It gives up when stop closes first (the call is over).
func (c *call) restartICE(ctx context.Context, stop <-chan struct{}, httpc *http.Client, pc *webrtc.PeerConnection, session, etag string) {
	t := time.NewTimer(c.opts.ICERestartAfter)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
		return
	case <-ctx.Done():
		return
	case <-c.failed:
		return
	}
	rep := &RestartReport{}
	c.mu.Lock()
	c.restartAt = time.Now()
	c.restart = rep
	c.mu.Unlock()
	tag, err := RestartICE(ctx, httpc, pc, session, etag, c.header())
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		rep.Error = err.Error()
		c.log.Warn("ICE restart", "err", err)
		return
	}
	rep.ETag = tag
	rep.PatchMS = msSince(c.restartAt)
	c.patched = true
}

// networkTypes returns the network types Options.Network names.
func networkTypes(network string, v4only bool) []webrtc.NetworkType {
	var types []webrtc.NetworkType
	if network != "tcp" {
		types = append(types, webrtc.NetworkTypeUDP4)
		if !v4only {
			types = append(types, webrtc.NetworkTypeUDP6)
		}
	}
	if network == "tcp" || network == "any" {
		types = append(types, webrtc.NetworkTypeTCP4)
		if !v4only {
			types = append(types, webrtc.NetworkTypeTCP6)
		}
	}
	return types
}

// msSince returns the milliseconds since t.
func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// newPeerConnection builds the peer connection, its audio transceiver and
// data channel, and wires every callback.
func (c *call) newPeerConnection() (*webrtc.PeerConnection, *webrtc.TrackLocalStaticSample, error) {
	codec := webrtc.RTPCodecCapability{
		MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2, SDPFmtpLine: opusFmtp,
	}
	var me webrtc.MediaEngine
	if err := me.RegisterCodec(webrtc.RTPCodecParameters{RTPCodecCapability: codec, PayloadType: OpusPayloadType}, webrtc.RTPCodecTypeAudio); err != nil {
		return nil, nil, err
	}
	se := c.opts.SettingEngine
	if se == nil {
		se = &webrtc.SettingEngine{}
		se.SetIncludeLoopbackCandidate(true)
		se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
		se.SetNetworkTypes(networkTypes(c.opts.Network, c.opts.IPv4Only))
	}
	api := webrtc.NewAPI(webrtc.WithMediaEngine(&me), webrtc.WithSettingEngine(*se))
	conf := webrtc.Configuration{ICEServers: c.opts.ICEServers}
	if c.opts.RelayOnly {
		conf.ICETransportPolicy = webrtc.ICETransportPolicyRelay
	}
	pc, err := api.NewPeerConnection(conf)
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*webrtc.PeerConnection, *webrtc.TrackLocalStaticSample, error) {
		_ = pc.Close()
		return nil, nil, err
	}

	pc.SCTP().Transport().ICETransport().OnSelectedCandidatePairChange(func(p *webrtc.ICECandidatePair) {
		if p == nil || p.Local == nil {
			return
		}
		c.mu.Lock()
		c.transport = p.Local.Protocol.String()
		c.mu.Unlock()
	})
	pc.OnICEConnectionStateChange(func(s webrtc.ICEConnectionState) {
		c.log.Debug("ICE connection state", "state", s.String())
		if s == webrtc.ICEConnectionStateConnected {
			c.mark(&c.setup.ICEConnectedMS)
		}
	})
	pc.SCTP().Transport().OnStateChange(func(s webrtc.DTLSTransportState) {
		c.log.Debug("DTLS state", "state", s.String())
		if s == webrtc.DTLSTransportStateConnected {
			c.mark(&c.setup.DTLSConnectedMS)
			// DTLS runs over a connected ICE transport, so this is the
			// moment the peer connection becomes "connected". Signal it
			// here too: with aggressive ICE consent timeouts (a latency
			// harness) ICE can blink "disconnected" between handshake
			// flights and delay the peer connection state.
			c.mu.Lock()
			iceUp := c.setup.ICEConnectedMS > 0
			c.mu.Unlock()
			if iceUp {
				c.signal(c.connected)
			}
		}
	})
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		c.log.Debug("peer connection state", "state", s.String())
		switch s {
		case webrtc.PeerConnectionStateConnected:
			c.signal(c.connected)
		case webrtc.PeerConnectionStateFailed, webrtc.PeerConnectionStateClosed:
			c.signal(c.failed)
		}
	})
	pc.OnTrack(c.onTrack)

	track, err := webrtc.NewTrackLocalStaticSample(codec, "audio", "switchboard-callclient")
	if err != nil {
		return fail(err)
	}
	tr, err := pc.AddTransceiverFromTrack(track, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendrecv})
	if err != nil {
		return fail(err)
	}
	// Read RTCP so that interceptors run; the loop ends when pc closes.
	sender := tr.Sender()
	c.readers.Add(1)
	go func() {
		defer c.readers.Done()
		buf := make([]byte, 1500)
		for {
			if _, _, err := sender.Read(buf); err != nil {
				return
			}
		}
	}()

	dc, err := pc.CreateDataChannel(DataChannelLabel, nil)
	if err != nil {
		return fail(err)
	}
	dc.OnOpen(func() {
		c.mark(&c.setup.DataChannelOpenMS)
		if err := dc.Send(c.ping); err != nil {
			c.log.Warn("data channel send", "err", err)
		}
	})
	dc.OnMessage(func(m webrtc.DataChannelMessage) {
		if bytes.Equal(m.Data, c.ping) {
			c.mu.Lock()
			c.dcEchoed = true
			c.mu.Unlock()
			c.signal(c.dcEcho)
			return
		}
		c.log.Debug("data channel message", "data", string(m.Data))
	})
	return pc, track, nil
}

// onTrack reads RTP from the server's track and records the payloads.
func (c *call) onTrack(t *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
	c.mu.Lock()
	if c.stopReading {
		c.mu.Unlock()
		return
	}
	c.readers.Add(1)
	c.mu.Unlock()
	defer c.readers.Done()
	c.log.Debug("remote track", "kind", t.Kind().String(), "codec", t.Codec().MimeType)
	for {
		p, _, err := t.ReadRTP()
		if err != nil {
			return
		}
		now := time.Now()
		c.mu.Lock()
		if len(c.received) == 0 {
			c.setup.FirstAudioMS = c.sinceStartLocked()
		} else {
			gap := now.Sub(c.lastAudio)
			c.maxGap = max(c.maxGap, gap)
			if c.restart != nil {
				c.restart.GapMS = max(c.restart.GapMS, float64(gap.Microseconds())/1000)
			}
		}
		c.lastAudio = now
		if c.patched && c.restart.ResumedMS == 0 {
			c.restart.ResumedMS = float64(now.Sub(c.restartAt).Microseconds()) / 1000
		}
		c.received = append(c.received, bytes.Clone(p.Payload))
		back := len(c.sent) > 0 && len(c.received) >= len(c.sent) && len(c.sent) == len(c.frames)
		c.mu.Unlock()
		if back {
			c.signal(c.allBack)
		}
	}
}

// stream sends the frames in real time, one per 20 ms tick.
func (c *call) stream(ctx context.Context, track *webrtc.TrackLocalStaticSample) error {
	tick := time.NewTicker(frameDuration)
	defer tick.Stop()
	for i, f := range c.frames {
		if i > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return fmt.Errorf("streaming audio: %w", ctx.Err())
			case <-c.failed:
				return fmt.Errorf("%w: connection lost while streaming", ErrConnect)
			}
		}
		if err := track.WriteSample(media.Sample{Data: f, Duration: frameDuration}); err != nil {
			if errors.Is(err, ice.ErrNoCandidatePairs) {
				continue // ICE is restarting: this frame is lost, as on a real outage
			}
			return fmt.Errorf("write sample: %w", err)
		}
		c.mu.Lock()
		c.sent = append(c.sent, f)
		c.mu.Unlock()
	}
	return nil
}

// drain waits, bounded by echoDrain, for the last echoed packets and the
// data channel echo.
func (c *call) drain(ctx context.Context) {
	t := time.NewTimer(echoDrain)
	defer t.Stop()
	c.mu.Lock()
	back := len(c.received) >= len(c.sent)
	c.mu.Unlock()
	if back {
		c.signal(c.allBack)
	}
	for _, ch := range []chan struct{}{c.allBack, c.dcEcho} {
		select {
		case <-ch:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// post sends the offer and returns the answer SDP, the absolute session
// URL and the ETag of its ICE session.
func (c *call) post(ctx context.Context, httpc *http.Client, target *url.URL, offer string) (string, *url.URL, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), strings.NewReader(offer))
	if err != nil {
		return "", nil, "", fmt.Errorf("%w: %w", ErrSignaling, err)
	}
	req.Header.Set("Content-Type", "application/sdp")
	req.Header.Set("Accept", "application/sdp")
	c.authorize(req)
	resp, err := httpc.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "", nil, "", fmt.Errorf("%w: POST: %w (nothing listens at %s: is the transceiver, or the demo, running there?)", ErrSignaling, err, target.Host)
	}
	if err != nil {
		return "", nil, "", fmt.Errorf("%w: POST: %w", ErrSignaling, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", nil, "", fmt.Errorf("%w: reading answer: %w", ErrSignaling, err)
	}
	if resp.StatusCode != http.StatusCreated {
		return "", nil, "", fmt.Errorf("%w: POST: %s: %s", ErrSignaling, resp.Status, errorMessage(body))
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/sdp") {
		return "", nil, "", fmt.Errorf("%w: answer Content-Type %q, want application/sdp", ErrSignaling, ct)
	}
	loc := resp.Header.Get("Location")
	if loc == "" {
		return "", nil, "", fmt.Errorf("%w: 201 without Location", ErrSignaling)
	}
	rel, err := url.Parse(loc)
	if err != nil {
		return "", nil, "", fmt.Errorf("%w: bad Location %q: %w", ErrSignaling, loc, err)
	}
	return string(body), target.ResolveReference(rel), resp.Header.Get("ETag"), nil
}

// delete ends the session. It runs even after ctx is done.
func (c *call) delete(ctx context.Context, httpc *http.Client, session *url.URL) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, session.String(), nil)
	if err != nil {
		return err
	}
	c.authorize(req)
	resp, err := httpc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("DELETE: %s: %s", resp.Status, errorMessage(body))
	}
	return nil
}

func (c *call) authorize(req *http.Request) {
	for k, vs := range c.header() {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
}

// header returns the headers every signaling request carries:
// Options.Header, and the bearer token when set.
func (c *call) header() http.Header {
	h := c.opts.Header.Clone()
	if c.opts.AuthToken != "" {
		if h == nil {
			h = http.Header{}
		}
		h.Set("Authorization", "Bearer "+c.opts.AuthToken)
	}
	return h
}

// closePeerConnection closes pc and waits for the read loops.
func (c *call) closePeerConnection(pc *webrtc.PeerConnection) {
	c.mu.Lock()
	c.stopReading = true
	c.mu.Unlock()
	if err := pc.Close(); err != nil {
		c.log.Warn("close peer connection", "err", err)
	}
	c.readers.Wait()
}

// errorMessage extracts the message of a {"error":{"message":...}} body,
// or returns the body itself, shortened.
func errorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	if s == "" {
		return "(empty body)"
	}
	return s
}

// mark records, once, the time since the POST began into *field.
func (c *call) mark(field *float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if *field == 0 {
		*field = c.sinceStartLocked()
	}
}

func (c *call) sinceStartLocked() float64 {
	if c.start.IsZero() {
		return 0
	}
	return float64(time.Since(c.start).Microseconds()) / 1000
}

// signal closes ch once.
func (c *call) signal(ch chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.signals[ch] {
		c.signals[ch] = true
		close(ch)
	}
}

// report builds the Report; the read loops have stopped when it runs.
func (c *call) report() Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Report{
		Setup:             c.setup,
		PacketsSent:       len(c.sent),
		PacketsReceived:   len(c.received),
		DataChannelEchoed: c.dcEchoed,
		SessionURL:        c.sessionURL,
		GatheringMS:       c.gatheringMS,
		MaxGapMS:          float64(c.maxGap.Microseconds()) / 1000,
		Transport:         c.transport,
		ICERestart:        c.restart,
		Started:           c.start,
		SentPayloads:      c.sent,
		ReceivedPayloads:  c.received,
	}
	r.PayloadMismatches = payloadMismatches(c.sent, c.received)
	r.AudioEchoed = r.PacketsReceived > 0 && r.PayloadMismatches == 0 &&
		r.PacketsReceived*10 >= r.PacketsSent*9
	return r
}

// payloadMismatches counts received payloads that are not, in order, a
// subsequence of sent: each received payload must equal a sent payload
// after the one the previous received payload matched. Greedy earliest
// matching is exact for the subsequence test; an unmatched payload counts
// one mismatch and does not move the cursor.
func payloadMismatches(sent, received [][]byte) int {
	mismatches, next := 0, 0
	for _, r := range received {
		j := next
		for j < len(sent) && !bytes.Equal(sent[j], r) {
			j++
		}
		if j == len(sent) {
			mismatches++
			continue
		}
		next = j + 1
	}
	return mismatches
}

func newPing() ([]byte, error) {
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]string{"type": "ping", "id": hex.EncodeToString(id[:])})
}
