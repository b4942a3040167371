package transceiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/rtcpreport"
)

// Session end reasons added to the bridge's list.
const (
	// ReasonSetupTimeout: ICE and DTLS did not connect within Config.SetupTimeout.
	ReasonSetupTimeout = "setup_timeout"
	// ReasonBackendGone: the backend closed the bridge.
	ReasonBackendGone = "backend_gone"
)

// MetaRegion is the session metadata key holding the client's region,
// taken from RegionHeader; it selects the advertised ingress.
const MetaRegion = "region"

// session is one client's WebRTC session and its backend bridge.
type session struct {
	// Set once.
	id      string
	owner   string // id of the client token that created the session; "" when signaling is open
	srv     *Server
	api     *webrtc.API    // the session's own API: its SettingEngine holds the credentials an ICE restart uses
	ingress netip.AddrPort // the address the answer advertises
	log     *slog.Logger
	pc      *webrtc.PeerConnection
	out     *webrtc.TrackLocalStaticRTP // audio from the backend to the client
	outSSRC uint32                      // out's SSRC, for the media delay probe
	be      *bridge.Conn
	media   *media                  // codecs and paced playout (media.go)
	reports *rtcpreport.Interceptor // the session's RTCP reports (reports.go)
	turns   turns                   // turn detection (turns.go)
	// turnMu orders a barge-in's input.speech_started before the
	// playout events its clear causes (turns.go, media.go).
	turnMu  sync.Mutex
	created time.Time
	ctx     context.Context // cancelled when the session ends
	cancel  context.CancelFunc

	events    atomic.Pointer[webrtc.DataChannel] // the oai-events channel, once the client opened it
	connected atomic.Bool
	silent    atomic.Bool // the client went silent (consent.go)
	checked   atomic.Bool // an authenticated connectivity check came (pending.go)
	// The pending slot (pending.go): the key it counts under, and whether
	// the session still holds it.
	pendingKey  netip.Prefix
	pendingHeld atomic.Bool
	setupTimer  *time.Timer // ends the session if it does not connect in time (watchSetup)
	// Setup phases reached, each observed once.
	iceUp, dtlsUp, audioUp atomic.Bool
	endOnce                sync.Once     // end (lifecycle.go)
	ending                 atomic.Bool   // set when end starts: bridge errors after it are the teardown's
	dropped                atomic.Uint64 // backend messages that could not be delivered to the client

	// imu serializes ICE restarts (restart.go) and guards the ICE
	// session's identity: its local ufrag (a routing token) and its
	// generation, which the ETag names.
	imu     sync.Mutex
	ufrag   string // guarded by imu
	iceGen  int    // guarded by imu; 1 for the offer's ICE session, +1 per restart
	iceDone bool   // guarded by imu; set by end: no restart after it
	// restarted is the last ICE restart; guarded by imu.
	restarted *lastRestart
}

// newSession builds the peer connection and opens the backend bridge in
// parallel, then returns the complete answer.
func (s *Server) newSession(ctx context.Context, offer string, info offerInfo, meta map[string]string, owner string) (*session, string, error) {
	ufrag, pwd, err := s.newCredentials()
	if err != nil {
		return nil, "", err
	}
	id := newSessionID()
	sctx, cancel := context.WithCancel(s.ctx)
	sess := &session{id: id, owner: owner, ufrag: ufrag, iceGen: 1, srv: s, log: s.log.With("session", id), created: time.Now(), ctx: sctx, cancel: cancel}
	sess.pendingKey = info.client
	sess.pendingHeld.Store(true)
	sess.ingress = s.cfg.advertise
	if a, ok := s.cfg.ingress[meta[MetaRegion]]; ok {
		sess.ingress = a
	}

	// The backend dial and the WebRTC answer are independent: overlap them.
	type dialResult struct {
		be  *bridge.Conn
		err error
	}
	dialed := make(chan dialResult, 1)
	go func() {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		start := time.Now()
		be, err := bridge.Dial(dctx, s.cfg.BackendURL, bridge.SessionStart{SessionID: id, Metadata: meta, Session: info.session})
		if err != nil {
			s.metrics.bridgeErrors.WithLabelValues("dial").Inc()
		} else {
			s.metrics.bridgeDial.Observe(time.Since(start).Seconds())
		}
		dialed <- dialResult{be, err}
	}()
	joined := false
	fail := func(err error) (*session, string, error) {
		cancel()
		if s.conn != nil {
			s.conn.RemoveSession(ufrag)
		}
		if sess.pc != nil {
			_ = sess.pc.Close()
		}
		if !joined {
			if r := <-dialed; r.be != nil {
				_ = r.be.End(context.Background(), bridge.ReasonError)
			}
		}
		return nil, "", err
	}

	sess.reports = s.reports.New()
	if sess.api, err = s.newAPI(sess, ufrag, pwd, info.dtlsRole); err != nil {
		return fail(err)
	}
	if s.conn != nil {
		// Follow the client across NAT rebindings (hop/latch.go).
		s.conn.AddSession(ufrag, pwd)
	}
	pcConfig, err := s.peerConfig()
	if err != nil {
		return fail(err)
	}
	if sess.pc, err = sess.api.NewPeerConnection(pcConfig); err != nil {
		return fail(err)
	}
	if err := sess.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: offer}); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrBadOffer, err))
	}
	if sess.out, err = webrtc.NewTrackLocalStaticRTP(opusCodec.RTPCodecCapability, "audio", "switchboard"); err != nil {
		return fail(err)
	}
	sender, err := sess.pc.AddTrack(sess.out)
	if err != nil {
		return fail(err)
	}
	sess.outSSRC = senderSSRC(sender)
	answer, err := sess.pc.CreateAnswer(nil)
	if err != nil {
		return fail(fmt.Errorf("%w: %v", ErrBadOffer, err))
	}
	gathered := webrtc.GatheringCompletePromise(sess.pc)
	if err := sess.pc.SetLocalDescription(answer); err != nil {
		return fail(err)
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	r := <-dialed
	joined = true
	if r.err != nil {
		sess.log.Warn("backend dial failed", "err", r.err)
		return fail(fmt.Errorf("%w: %v", ErrBackend, r.err))
	}
	sess.be = r.be
	if err := sess.newMedia(); err != nil {
		_ = sess.be.End(context.Background(), bridge.ReasonError)
		sess.be = nil
		return fail(err)
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = sess.be.End(context.Background(), bridge.ReasonShutdown)
		sess.be = nil
		return fail(ErrClosed)
	}
	s.sessions[id] = sess
	sess.watchSetup() // under s.mu: whoever finds the session in the table finds its timer
	s.wg.Add(1)
	s.mu.Unlock()
	s.metrics.sessionsStarted.Inc()

	sess.pc.OnTrack(sess.onTrack)
	sess.pc.OnDataChannel(sess.onDataChannel)
	sess.pc.OnConnectionStateChange(sess.onConnectionState)
	sess.pc.OnICEConnectionStateChange(sess.onICEState)
	sess.pc.SCTP().Transport().OnStateChange(sess.onDTLSState)
	go sess.fromBackend()
	sess.watchChecks()
	sess.log.Info("session created", "ufrag", ufrag)
	return sess, withPtime(finalizeAnswer(sess.pc.LocalDescription().SDP, sess.ingress), s.cfg.Ptime), nil
}

// finalizeAnswer makes the answer advertise exactly one candidate, at
// ingress. It removes candidate lines for ICE component 2 (RTCP), which
// Pion writes beside every component-1 candidate and which BUNDLE with
// rtcp-mux (RFC 8843, RFC 5761), offered by every WebRTC client, makes
// redundant; and it puts ingress in the remaining candidate when it differs
// from the mux's advertised address (a region's nearest Global Relay). As
// an ICE-lite agent (RFC 8445 §2.5) never sends checks, the address the
// client sends to need not be one Pion knows: checks reach the shared mux
// whichever relay forwards them.
func finalizeAnswer(sdp string, ingress netip.AddrPort) string {
	var b strings.Builder
	b.Grow(len(sdp))
	for line := range strings.SplitAfterSeq(sdp, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[0], "a=candidate:") {
			b.WriteString(line)
			continue
		}
		if f[1] != "1" {
			continue
		}
		if ingress.IsValid() {
			f[4], f[5] = ingress.Addr().String(), strconv.Itoa(int(ingress.Port()))
			line = strings.Join(f, " ") + "\r\n"
		}
		b.WriteString(line)
	}
	return b.String()
}

// onTrack forwards the client's Opus packets to the backend as they come:
// payloads untouched for Opus, decoded for the PCM formats (media.go).
func (sess *session) onTrack(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
	if tr.Kind() != webrtc.RTPCodecTypeAudio || !sess.claimAudioTrack() {
		return
	}
	defer sess.stopTurns()
	// One buffer and one packet for the session's life: TrackRemote.ReadRTP
	// allocates both per packet. pkt.Payload aliases buf until the next
	// Read; toBackend does not keep it (the bridge copies the frame).
	buf := make([]byte, hop.MaxPayload)
	var rp rtp.Packet
	pkt := &rp
	deadline := false // a read deadline is set: turn detection waits on wall time
	for {
		if wait := sess.turnsWait(time.Now()); wait > 0 {
			_ = tr.SetReadDeadline(time.Now().Add(wait))
			deadline = true
		} else if deadline {
			_ = tr.SetReadDeadline(time.Time{})
			deadline = false
		}
		n, _, err := tr.Read(buf)
		if err != nil {
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				sess.idleTurns(time.Now())
				continue
			}
			return
		}
		if err := pkt.Unmarshal(buf[:n]); err != nil {
			// SRTP authenticated the header; a bad padding length still
			// fails here.
			sess.srv.metrics.clientAudioDropped.WithLabelValues("invalid_rtp").Inc()
			continue
		}
		if len(pkt.Payload) == 0 {
			continue // padding-only packet
		}
		if err := sess.toBackend(pkt); err != nil {
			if sess.ctx.Err() == nil && !sess.ending.Load() {
				sess.srv.metrics.bridgeErrors.WithLabelValues("send").Inc()
			}
			sess.end(ReasonBackendGone)
			return
		}
		sess.srv.probe.toBackend.leave(pkt.SSRC, pkt.SequenceNumber)
		if !sess.audioUp.Swap(true) {
			sess.srv.metrics.setup.WithLabelValues(phaseFirstAudio).Observe(time.Since(sess.created).Seconds())
		}
	}
}

func (sess *session) onDataChannel(dc *webrtc.DataChannel) {
	if dc.Label() != EventsLabel {
		sess.log.Info("ignoring data channel", "label", dc.Label())
		dc.OnOpen(func() { sess.readDataChannel(dc, false) })
		return
	}
	// Pion hands over a remote-created channel once it is open; store it
	// now, not in OnOpen, or a backend reply to the client's first message
	// could arrive before the OnOpen callback ran and be dropped.
	sess.events.Store(dc)
	dc.OnOpen(func() { sess.readDataChannel(dc, true) }) // events.go
}

func (sess *session) onConnectionState(st webrtc.PeerConnectionState) {
	sess.log.Debug("peer connection state", "state", st.String())
	switch st {
	case webrtc.PeerConnectionStateConnected:
		if !sess.connected.Swap(true) {
			sess.setupTimer.Stop()
			sess.srv.metrics.connect.Observe(time.Since(sess.created).Seconds())
		}
		sess.leavePending()
		sess.startPlayout()
	case webrtc.PeerConnectionStateFailed:
		sess.end(bridge.ReasonICEFailed)
	case webrtc.PeerConnectionStateClosed:
		sess.end(bridge.ReasonClientHangup)
	}
}

func (sess *session) onICEState(st webrtc.ICEConnectionState) {
	sess.reportConnection(st)
	switch st {
	case webrtc.ICEConnectionStateConnected:
		if !sess.iceUp.Swap(true) {
			sess.srv.metrics.setup.WithLabelValues(phaseICE).Observe(time.Since(sess.created).Seconds())
		}
	case webrtc.ICEConnectionStateFailed:
		if !sess.connected.Load() {
			sess.srv.metrics.setupFailures.WithLabelValues(phaseICE, "failed").Inc()
		}
	}
}

func (sess *session) onDTLSState(st webrtc.DTLSTransportState) {
	switch st {
	case webrtc.DTLSTransportStateConnected:
		if !sess.dtlsUp.Swap(true) {
			sess.srv.metrics.setup.WithLabelValues(phaseDTLS).Observe(time.Since(sess.created).Seconds())
		}
	case webrtc.DTLSTransportStateFailed:
		if !sess.dtlsUp.Load() {
			sess.srv.metrics.setupFailures.WithLabelValues(phaseDTLS, "failed").Inc()
		}
	}
}

// fromBackend queues backend audio for paced playout to the client's
// track (media.go) and sends backend events to the client's data channel.
func (sess *session) fromBackend() {
	defer sess.srv.wg.Done()
	ignored := uint64(0)
	for {
		m, err := sess.be.Recv(bridgeCtx)
		if n := sess.be.Ignored(); n != ignored {
			sess.srv.metrics.backendRefused.WithLabelValues(refusedUnknown).Add(float64(n - ignored))
			ignored = n
		}
		if err != nil {
			if sess.ctx.Err() == nil && !sess.ending.Load() {
				sess.log.Info("backend bridge closed", "err", err)
				sess.srv.metrics.bridgeErrors.WithLabelValues("recv").Inc()
			}
			sess.end(ReasonBackendGone)
			return
		}
		switch {
		case m.Audio != nil:
			sess.playAudio(m.Audio)
		case m.Control != nil:
			sess.onControl(m.Control)
		case m.Event != nil:
			dc := sess.events.Load()
			if dc == nil || dc.SendText(string(m.Event)) != nil {
				sess.dropped.Add(1)
				sess.srv.metrics.eventsDropped.Inc()
			}
		case m.End != nil:
			sess.log.Info("backend ended the session", "reason", m.End.Reason)
			sess.end(bridge.ReasonDone)
			return
		}
	}
}

// EndEventType is the type of the event the transceiver sends on
// oai-events just before it ends a session, e.g.
// {"type":"switchboard.session.end","reason":"shutdown"}.
const EndEventType = "switchboard.session.end"

// notifyClient tells the client why the session ends, on its data channel
// if open, and waits briefly for the message to leave.
func (sess *session) notifyClient(reason string) {
	dc := sess.events.Load()
	if dc == nil || dc.ReadyState() != webrtc.DataChannelStateOpen {
		return
	}
	msg, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Reason string `json:"reason"`
	}{EndEventType, reason})
	if dc.SendText(string(msg)) != nil {
		return
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for dc.BufferedAmount() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// watchSetup ends the session if it does not connect within
// Config.SetupTimeout. Like watchChecks, the timer holds no goroutine
// while it waits; connecting or ending stops it, so that it does not keep
// the session reachable for the rest of the timeout either.
func (sess *session) watchSetup() {
	sess.setupTimer = time.AfterFunc(sess.srv.cfg.SetupTimeout, func() {
		if sess.connected.Load() || sess.ending.Load() {
			return
		}
		sess.srv.metrics.setupFailures.WithLabelValues("connect", "timeout").Inc()
		sess.log.Info("session did not connect in time", "timeout", sess.srv.cfg.SetupTimeout)
		sess.end(ReasonSetupTimeout)
	})
}

// teardown ends the session: the backend is told why, the client gets
// the goodbye event, and the peer connection is closed. It runs once, on
// the tracked goroutine end starts (lifecycle.go), after the session left
// the table.
func (sess *session) teardown(reason string) {
	s := sess.srv
	sess.setupTimer.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	sess.media.q.Close()    // no playout event after session.end
	sess.media.stopEvents() // nor a drain to report one
	_ = sess.be.End(ctx, reason)
	cancel()
	sess.cancel()
	sess.media.evWG.Wait() // a report stuck on the backend failed when End closed the bridge
	sess.notifyClient(reason)
	_ = sess.pc.Close() // sends DTLS close_notify
	sess.imu.Lock()     // waits for a restart in progress
	sess.iceDone = true
	if s.conn != nil {
		s.conn.RemoveSession(sess.ufrag)
	}
	sess.imu.Unlock()
	s.metrics.sessionsEnded.WithLabelValues(reason).Inc()
	sess.log.Info("session ended", "reason", reason, "duration", time.Since(sess.created).Round(time.Millisecond))
}
