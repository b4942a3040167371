package transceiver

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/datachannel"
	"github.com/pion/rtp"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/rtcpreport"
)

// MetaRegion is the session metadata key holding the client's region,
// taken from RegionHeader; it selects the advertised ingress.
const MetaRegion = "region"

// session is one client's WebRTC session and its backend bridge. It
// wires five parts and owns only the lifecycle between them: the peer
// session (ICE-lite, DTLS-SRTP, SCTP: internal/peer), the bridge
// connection (internal/bridge), the media path with its turn detection
// (mediaPath, media.go and turns.go), the client events on oai-events
// (clientEvents, events.go) and the RTCP reports (reports.go).
//
// Goroutines and what each owns:
//
//   - the signaling handler: newSession, until the session is in the
//     table; ICE restarts (restart.go), serialized by imu;
//   - the peer session's goroutine: onDataChannel (dcOthers, dcRefused,
//     the client events' channel);
//   - the shared read loop, the consent sweeper and the peer session's
//     goroutine: onPeerState and onRTCP, which must not block;
//   - fromClient, the track goroutine: the client's RTP and the media
//     path's input side;
//   - fromBackend, the bridge reader: backend audio, controls and events;
//   - the playout clock's worker and the event drain: the media path's
//     output side (mediaPath's comment);
//   - one reader per data channel (events.go), and one goroutine per
//     connection report (consent.go);
//   - the end goroutine (lifecycle.go): teardown, once.
//
// Locks: Server.mu and imu are never held together; the media path's
// are taken in the order turnMu, encMu, the output queue's (mediaPath).
// The parts' own locks (peer, bridge, playout, rtcpreport) are leaves:
// none calls back into the session while holding one, except the output
// queue's OnEvents, which only counts and starts the drain.
type session struct {
	// Set once, before the session is in the table.
	id      string
	owner   string // id of the client token that created the session; "" when signaling is open
	srv     *Server
	ingress netip.AddrPort // the address the answer advertises
	// ingressTCP is the ICE-TCP address the answer advertises (RFC 6544);
	// invalid: none.
	ingressTCP netip.AddrPort
	log        *slog.Logger
	peer       *peer.Session // ICE-lite, DTLS-SRTP and SCTP (internal/peer)
	offer      *peer.Offer   // the offer answered; guarded by imu after an ICE restart
	cert       *certificate  // the DTLS certificate presented
	setup      string        // the answer's a=setup: "active" or "passive"
	sped       bool          // the answer has the offer's SPED a=ice-options (Config.SPED)
	outSSRC    uint32        // the SSRC of the audio sent to the client
	cname      string        // its RTCP CNAME
	opusPT     uint8         // the Opus payload type, the offer's
	sent       rtcpreport.LocalStream
	be         *bridge.Conn
	media      *mediaPath              // codecs, turn detection and paced playout (media.go)
	client     *clientEvents           // the oai-events channel (events.go)
	reports    *rtcpreport.Interceptor // the session's RTCP reports (reports.go)
	quality    callQuality             // the client's reports about our audio, summed up (reports.go)
	created    time.Time
	ctx        context.Context // cancelled when the session ends
	cancel     context.CancelFunc
	// wantSCTP: the offer has data channels, so the setup waits for
	// their SCTP association; peerSet is closed once peer is set, which
	// the peer session's callbacks read only after it (peerSession).
	wantSCTP bool
	peerSet  chan struct{}
	// The pending slot (pending.go): the key it counts under.
	pendingKey netip.Prefix

	// The peer session's goroutine's: data channels the client opened
	// other than oai-events, taken and refused (onDataChannel).
	dcOthers, dcRefused int

	// Any goroutine.
	connected   atomic.Bool
	silent      atomic.Bool // the client went silent (consent.go)
	pendingHeld atomic.Bool // the session still holds its pending slot
	// connSent is closed when the last connection-state report has been
	// sent (consent.go): each report waits for the one before.
	connSent atomic.Pointer[chan struct{}]
	// setupTimer ends the session if it does not connect in time
	// (watchSetup); set under Server.mu.
	setupTimer *time.Timer
	// Setup phases reached, each observed once.
	iceUp, dtlsUp, audioUp atomic.Bool
	endOnce                sync.Once     // end (lifecycle.go)
	ending                 atomic.Bool   // set when end starts: bridge errors after it are the teardown's
	dropped                atomic.Uint64 // backend messages that could not be delivered to the client

	// imu serializes ICE restarts (restart.go) and guards the ICE
	// session's identity: its local ufrag (a routing token) and its
	// generation, which the ETag names.
	imu   sync.Mutex
	ufrag string // guarded by imu
	// lastOffer is the client's last offer SDP (an ICE restart's fragment
	// applies to it); guarded by imu.
	lastOffer string
	iceGen    int  // guarded by imu; 1 for the offer's ICE session, +1 per restart
	iceDone   bool // guarded by imu; set by end: no restart after it
	// restarted is the last ICE restart; guarded by imu.
	restarted *lastRestart
}

// newSession registers the peer session and opens the backend bridge in
// parallel, then returns the complete answer.
func (s *Server) newSession(ctx context.Context, offer string, info offerInfo, meta map[string]string, owner string) (*session, string, error) {
	ufrag, pwd, err := s.newCredentials()
	if err != nil {
		return nil, "", err
	}
	id := newSessionID()
	sctx, cancel := context.WithCancel(s.ctx)
	sess := &session{id: id, owner: owner, ufrag: ufrag, iceGen: 1, srv: s, log: s.log.With("session", id), created: time.Now(), ctx: sctx, cancel: cancel, peerSet: make(chan struct{})}
	sess.client = newClientEvents(id, s.metrics.eventsDropped)
	sess.pendingKey = info.client
	sess.pendingHeld.Store(true)
	sess.ingress = s.cfg.advertise
	if a, ok := s.cfg.ingress[meta[MetaRegion]]; ok {
		sess.ingress = a
	}
	sess.ingressTCP = s.cfg.tcpIngress(sess.ingress)

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
		be, err := s.bridges.Dial(dctx, bridge.SessionStart{SessionID: id, Metadata: meta, Session: info.session})
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
		if sess.peer != nil {
			_ = sess.peer.Close()
		}
		_ = sess.reports.Close()
		if !joined {
			if r := <-dialed; r.be != nil {
				_ = r.be.End(context.Background(), bridge.ReasonError)
			}
		}
		return nil, "", err
	}

	sess.reports = s.reports.New()
	if sess.cert, err = s.certs.get(time.Now()); err != nil {
		return fail(err)
	}
	o := info.offer
	role := info.dtlsRole
	// SPED (the DTLS handshake in the ICE checks) when the offer has it,
	// lets the transceiver be the DTLS server (peer sped.go) and DTLS 1.3,
	// which SPED needs, is allowed: an operator who pins 1.2 gets 1.2.
	sess.sped = len(o.SPED) > 0 && s.cfg.SPED && s.cfg.dtlsVersion == peer.DTLS13 && role != peer.DTLSClient
	if sess.sped {
		role = peer.DTLSServer
	}
	if role == 0 {
		role = peer.DTLSClient
		if s.cfg.DTLSRole == "server" {
			role = peer.DTLSServer
		}
	}
	sess.setup = "active"
	if role == peer.DTLSServer {
		sess.setup = "passive"
	}
	sess.offer, sess.lastOffer = o, offer
	sess.wantSCTP = o.Data >= 0
	sess.opusPT = o.Sections[o.Audio].OpusPT
	sess.outSSRC, sess.cname = randomSSRC(), newSessionID()
	sess.reports.SetCNAME(sess.cname) // RFC 3550 §6.1: SDES CNAME in each compound
	pcfg := peer.SessionConfig{
		LocalUfrag: ufrag, LocalPwd: pwd, RemoteUfrag: o.ICEUfrag,
		Role:                role,
		Certificate:         sess.cert.tls,
		Fingerprints:        o.Fingerprints,
		Data:                o.Data >= 0,
		RemoteSCTPInit:      o.SCTPInit,
		SPED:                sess.sped,
		DisconnectedTimeout: s.cfg.DisconnectedTimeout,
		FailedTimeout:       s.cfg.ConsentTimeout,
		RTPQueue:            mediaQueue,
		OnState:             sess.onPeerState,
		OnRTCP:              sess.onRTCP,
		OnDataChannel:       sess.onDataChannel,
	}
	if o.Data >= 0 {
		pcfg.MaxMessageSize = o.Sections[o.Data].MaxMessageSize
	}
	if sess.peer, err = s.peer.NewSession(pcfg); err != nil {
		return fail(err)
	}
	close(sess.peerSet)
	answer, err := sess.answer(o, ufrag, pwd)
	if err != nil {
		return fail(err)
	}
	r := <-dialed
	joined = true
	if r.err != nil {
		sess.log.Warn("backend dial failed", "err", r.err)
		return fail(fmt.Errorf("%w: %v", ErrBackend, r.err))
	}
	sess.be = r.be
	sess.client.input, sess.client.output = r.be.InputAudioBufferEvents(), r.be.OutputAudioBufferEvents()
	sess.sent = sess.reports.AddLocalStream(sess.outSSRC, opusClockRate)
	sess.reports.Start(sess.peer.WriteRTCP)
	if sess.media, err = newMediaPath(sess); err != nil {
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
	s.wg.Add(2)       // fromBackend, fromClient
	s.mu.Unlock()
	s.metrics.sessionsStarted.Inc()

	go sess.fromBackend()
	go sess.fromClient()
	sess.watchChecks()
	sess.log.Info("session created", "ufrag", ufrag)
	return sess, answer, nil
}

// mediaQueue is how many decrypted client RTP packets may wait for the
// session's media reader (fromClient): 320 ms of 20 ms audio. The reader
// waits only on the bridge write; past it packets are dropped, counted
// (peer_dropped_total{reason="rtp_queue_full"}).
const mediaQueue = 16

// The answer's a=msid (RFC 8830): the stream and track ids of the audio
// sent to the client.
const (
	answerStreamID = "switchboard"
	answerTrackID  = "audio"
)

// answer returns the SDP answer to o with the session's local ICE
// credentials ufrag and pwd.
func (sess *session) answer(o *peer.Offer, ufrag, pwd string) (string, error) {
	ans, err := peer.Answer(o, peer.AnswerParams{
		ICEUfrag: ufrag, ICEPwd: pwd,
		Fingerprint:    sess.cert.fp,
		Setup:          sess.setup,
		Candidate:      sess.ingress,
		TCPCandidate:   sess.ingressTCP,
		AudioSSRC:      sess.outSSRC,
		CNAME:          sess.cname,
		StreamID:       answerStreamID,
		TrackID:        answerTrackID,
		SCTPPort:       5000,
		MaxMessageSize: eventsMaxSize,
		SCTPInit:       sess.peer.LocalSCTPInit(),
		Ptime:          sess.srv.cfg.answerPtime(),
		SPED:           sess.sped,
	})
	if err != nil {
		return "", fmt.Errorf("transceiver: answer: %w", err)
	}
	return ans, nil
}

// randomSSRC returns a random nonzero SSRC (RFC 3550 §8.1).
func randomSSRC() uint32 {
	var b [4]byte
	for {
		_, _ = rand.Read(b[:])
		if v := binary.BigEndian.Uint32(b[:]); v != 0 {
			return v
		}
	}
}

// fromClient forwards the client's Opus packets to the backend as they
// come: payloads untouched for Opus, decoded for the PCM formats
// (media.go). It is the session's one media goroutine: the shared read
// loop decrypts and queues (internal/peer), this one decodes and writes
// the bridge, which may block.
func (sess *session) fromClient() {
	defer sess.srv.wg.Done()
	defer sess.media.stopTurns()
	// One buffer and one packet for the session's life. pkt.Payload
	// aliases buf until the next read; toBackend does not keep it (the
	// bridge copies the frame).
	buf := make([]byte, hop.MaxPayload)
	var rp rtp.Packet
	pkt := &rp
	var audio uint32 // the client's audio SSRC: its first stream's
	var recv rtcpreport.RemoteStream
	ignored := uint32(0)
	deadline := false // a read deadline is set: turn detection waits on wall time
	for {
		if wait := sess.media.turnsWait(time.Now()); wait > 0 {
			_ = sess.peer.SetReadDeadline(time.Now().Add(wait))
			deadline = true
		} else if deadline {
			_ = sess.peer.SetReadDeadline(time.Time{})
			deadline = false
		}
		n, err := sess.peer.ReadRTP(buf)
		if err != nil {
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				sess.media.idleTurns(time.Now())
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
		switch {
		case audio == 0:
			audio = pkt.SSRC
			recv = sess.reports.AddRemoteStream(audio, opusClockRate)
		case pkt.SSRC != audio:
			// A second stream (an offer with several audio sections):
			// the decoder follows one.
			if pkt.SSRC != ignored {
				ignored = pkt.SSRC
				sess.srv.metrics.tracksIgnored.Inc()
			}
			continue
		}
		recv.Received(buf[:n], time.Now())
		if len(pkt.Payload) == 0 {
			continue // padding-only packet
		}
		if err := sess.media.toBackend(pkt); err != nil {
			if sess.ctx.Err() == nil && !sess.ending.Load() {
				sess.srv.metrics.bridgeErrors.WithLabelValues("send").Inc()
			}
			sess.end(bridge.ReasonBackendGone)
			return
		}
		sess.srv.probe.toBackend.leave(pkt.SSRC, pkt.SequenceNumber)
		if !sess.audioUp.Swap(true) {
			now := time.Now()
			sess.srv.metrics.setup.WithLabelValues(phaseFirstAudio).Observe(now.Sub(sess.created).Seconds())
			sess.srv.metrics.observeSetupPhase(phaseFirstAudio, sess.peer.SetupTimes().DTLS, now)
		}
	}
}

// maxDataChannels bounds the data channels one session takes: the first
// oai-events and maxDataChannels-1 others, which are drained. Each costs
// a reader goroutine, and DCEP lets a client open up to 65535 (RFC 8832).
const maxDataChannels = 4

// onDataChannel takes a data channel the client opened (on the peer
// session's goroutine): the first oai-events is bridged; others are
// drained, up to maxDataChannels in all, and beyond it closed at once,
// counted, and logged once per session. Channels open in no set order,
// so oai-events always has its place.
func (sess *session) onDataChannel(dc *datachannel.DataChannel) {
	forward := dc.Config.Label == EventsLabel && !sess.client.opened()
	if !forward && sess.dcOthers == maxDataChannels-1 {
		sess.srv.metrics.dcRefused.Inc()
		if sess.dcRefused++; sess.dcRefused == 1 {
			sess.log.Info("refusing data channels over the limit", "limit", maxDataChannels, "label", dc.Config.Label)
		}
		_ = dc.Close()
		return
	}
	if !forward {
		sess.dcOthers++
		sess.log.Info("ignoring data channel", "label", dc.Config.Label)
	} else {
		sess.client.open(dc)
	}
	sess.srv.wg.Add(1)
	go sess.readDataChannel(dc, forward) // events.go
}

// onPeerState follows the peer session's connection events. It runs on
// the shared read loop, the consent sweeper or the peer session's
// goroutine, so it must not block: what talks to the backend runs on a
// goroutine of its own (reportConnection).
func (sess *session) onPeerState(st peer.State) {
	sess.log.Debug("peer state", "state", st.String())
	m := sess.srv.metrics
	switch st {
	case peer.StateICEConnected:
		if !sess.iceUp.Swap(true) {
			m.setup.WithLabelValues(phaseICE).Observe(time.Since(sess.created).Seconds())
		} else {
			sess.reportConnection(st)
		}
	case peer.StateDisconnected:
		sess.reportConnection(st)
	case peer.StateChecked:
		if p := sess.peerSession(); p != nil {
			t := p.SetupTimes()
			m.observeSetupPhase(phaseCheck, t.Answered, t.Checked)
		}
	case peer.StateFailed:
		if !sess.connected.Load() {
			sess.setupFailed(phaseICE, failFailed)
		}
		sess.end(bridge.ReasonICEFailed)
	case peer.StateDTLSConnected:
		if !sess.dtlsUp.Swap(true) {
			m.setup.WithLabelValues(phaseDTLS).Observe(time.Since(sess.created).Seconds())
			if p := sess.peerSession(); p != nil {
				t := p.SetupTimes()
				m.observeSetupPhase(phaseDTLS, t.Checked, t.DTLS)
				v, inSTUN := p.DTLSVersion(), p.SPED()
				m.dtlsHandshakes.WithLabelValues(v.String(), strconv.FormatBool(inSTUN)).Inc()
				sess.log.Debug("DTLS connected", "version", v.String(), "in_stun", inSTUN)
			}
		}
	case peer.StateDTLSFailed:
		if !sess.dtlsUp.Load() {
			sess.setupFailed(phaseDTLS, failFailed)
		}
		sess.end(bridge.ReasonICEFailed)
	case peer.StateConnected:
		if !sess.connected.Swap(true) {
			if !sess.wantSCTP {
				sess.setupTimer.Stop()
			}
			m.connect.Observe(time.Since(sess.created).Seconds())
			sess.srv.byTrans.connected(sess)
		}
		sess.leavePending()
		sess.media.startPlayout()
	case peer.StateSCTPConnected:
		sess.setupTimer.Stop() // after StateConnected, on the same goroutine
	case peer.StateClosed:
		sess.end(bridge.ReasonClientHangup)
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
			sess.end(bridge.ReasonBackendGone)
			return
		}
		switch {
		case m.Audio != nil:
			sess.media.playAudio(m.Audio)
		case m.Control != nil:
			sess.media.onControl(m.Control)
		case m.Event != nil:
			if !sess.client.forward(m.Event) {
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

// isEnding reports whether the session is ending: bridge errors after
// it are the teardown's, not counted.
func (sess *session) isEnding() bool { return sess.ctx.Err() != nil || sess.ending.Load() }

// watchSetup ends the session if it does not connect within
// Config.SetupTimeout (setupTimedOut). Like watchChecks, the timer holds no
// goroutine while it waits; connecting (and the SCTP association, when the
// offer has data channels) or ending stops it, so that it does not keep
// the session reachable for the rest of the timeout either.
func (sess *session) watchSetup() {
	sess.setupTimer = time.AfterFunc(sess.srv.cfg.SetupTimeout, sess.setupTimedOut)
}

// teardown ends the session: the backend is told why, the client gets
// the goodbye event, and the peer session is closed. It runs once, on
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
	sess.client.end(reason)
	_ = sess.peer.Close() // sends DTLS close_notify; no peer event after it
	_ = sess.reports.Close()
	sess.waitConnectionReports(context.Background()) // the bridge is closed: they end at once
	sess.imu.Lock()                                  // waits for a restart in progress
	sess.iceDone = true
	sess.imu.Unlock()
	s.metrics.sessionsEnded.WithLabelValues(reason).Inc()
	s.byTrans.endedOn(sess)
	attrs := append([]any{"reason", reason, "duration", time.Since(sess.created).Round(time.Millisecond)}, sess.observeQuality()...)
	sess.log.Info("session ended", attrs...)
}
