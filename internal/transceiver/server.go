// Package transceiver is Switchboard's stateful WebRTC endpoint. It answers
// SDP offers over HTTP, terminates ICE (lite), DTLS, SRTP and SCTP with Pion
// on one shared internal-hop socket, and bridges each session's audio
// (Opus passthrough, or PCM it decodes and encodes) and `oai-events`
// data-channel messages to a backend over the bridge protocol
// (docs/bridge.md), pacing the backend's audio to the client on one shared
// media clock (media.go, internal/playout).
//
// Every session's local ufrag is a fresh routing token (internal/token)
// naming this transceiver, so relays can route the session's first STUN
// packet here without a lookup. The answer carries exactly one candidate:
// the relay's public address (Config.Advertise).
package transceiver

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/interceptor"
	"github.com/pion/transport/v5/stdnet"
	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/playout"
	"github.com/switchboard-rtc/switchboard/internal/rtcpreport"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// Errors returned when a session cannot be created.
var (
	// ErrFull: MaxSessions sessions are live.
	ErrFull = errors.New("transceiver: at session capacity")
	// ErrClosed: the transceiver is shutting down.
	ErrClosed = errors.New("transceiver: closed")
	// ErrDraining: the transceiver is draining and takes no new sessions.
	ErrDraining = errors.New("transceiver: draining, try another transceiver")
	// ErrBackend: the backend bridge could not be opened.
	ErrBackend = errors.New("transceiver: backend unavailable")
)

// EventsLabel is the label of the data channel whose messages are bridged
// to the backend, as in OpenAI's Realtime WebRTC flow.
const EventsLabel = "oai-events"

// opusCodec is the one codec served: Opus at 48 kHz, RFC 7587.
var opusCodec = webrtc.RTPCodecParameters{
	RTPCodecCapability: webrtc.RTPCodecCapability{
		MimeType:    webrtc.MimeTypeOpus,
		ClockRate:   48000,
		Channels:    2,
		SDPFmtpLine: "minptime=10;useinbandfec=1",
	},
	PayloadType: 111,
}

// Server is one transceiver: the signaling handlers, the shared
// internal-hop socket and the live sessions.
type Server struct {
	// Set once.
	cfg     Config
	keys    *token.Keyring
	log     *slog.Logger
	sock    *net.UDPConn // the one UDP socket
	conn    *hop.Conn    // the internal hop over sock; nil when Config.Direct
	udp     *probeConn   // what mux reads and writes: conn, or sock when Direct
	mux     *ice.UDPMuxDefault
	net     *stdnet.Net // the host's interfaces, listed once for every session's ICE agent
	metrics *metrics
	probe   *delayProbe           // samples the media delay inside (delay.go)
	certs   certs                 // the DTLS certificate sessions share (cert.go)
	pion    *pionLogs             // Pion's log lines, through log (pionlog.go)
	auth    *auth.Authority       // nil: signaling is open
	clock   *playout.Clock        // paces every session's output (media.go)
	reports *rtcpreport.Generator // sends every session's RTCP reports (reports.go)
	ctx     context.Context
	cancel  context.CancelFunc

	mu       sync.Mutex
	sessions map[string]*session // guarded by mu
	closed   bool                // guarded by mu
	draining bool                // guarded by mu
	starting int                 // offers being answered, counted against MaxSessions; guarded by mu
	pending  pending             // sessions not yet connected (pending.go); guarded by mu
	wg       sync.WaitGroup      // session goroutines
	ends     sync.WaitGroup      // session teardowns in flight (lifecycle.go); Add under mu
	left     chan struct{}       // a session left the table (capacity 1; Drain waits on it)
}

// New binds the internal-hop socket and returns a running transceiver. reg
// receives its metrics (nil for none).
func New(cfg Config, keys *token.Keyring, reg prometheus.Registerer, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if keys == nil {
		return nil, errors.New("transceiver: a token keyring is required")
	}
	if log == nil {
		log = slog.Default()
	}
	authority, err := auth.New(cfg.Auth)
	if err != nil {
		return nil, fmt.Errorf("transceiver: %w", err)
	}
	laddr, err := net.ResolveUDPAddr("udp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("transceiver: listen address %q: %w", cfg.ListenAddr, err)
	}
	sock, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, fmt.Errorf("transceiver: listen %s: %w", cfg.ListenAddr, err)
	}
	s := &Server{
		cfg:      cfg,
		keys:     keys,
		log:      log.With("transceiver", cfg.ID),
		sock:     sock,
		auth:     authority,
		sessions: make(map[string]*session),
		left:     make(chan struct{}, 1),
		pending:  pending{byClient: make(map[netip.Prefix]int)},
	}
	// Pion lists the host's interfaces (a netlink dump) for every ICE
	// agent and keeps the list for the agent's life unless it is given
	// one; an ICE-lite agent on the shared mux gathers once, so one list
	// serves every session (newAPI). Sharing it is safe only because
	// nothing updates it: never set the ICE gathering policy to
	// GatherContinually, under which each agent calls UpdateInterfaces
	// on it from its own goroutine, and stdnet.Net has no lock.
	if s.net, err = stdnet.NewNet(); err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("transceiver: list network interfaces: %w", err)
	}
	s.reports = rtcpreport.NewGenerator(cfg.ReportInterval)
	s.pion = newPionLogs(s.log)
	s.metrics = newMetrics(s, reg)
	s.probe = newDelayProbe(s.metrics.mediaDelay)
	if cfg.Direct {
		if s.cfg.advertise.Port() == 0 {
			s.cfg.advertise = sock.LocalAddr().(*net.UDPAddr).AddrPort()
		}
		s.udp = newProbeConn(udpAddrPort{sock}, s.probe)
	} else {
		s.conn, err = hop.NewConn(sock, hop.ConnConfig{Advertise: cfg.advertise, AllowRelays: cfg.allow, Logger: s.log, OnSent: s.probe.sent})
		if err != nil {
			_ = sock.Close()
			return nil, err
		}
		s.udp = newProbeConn(s.conn, s.probe)
	}
	s.mux = ice.NewUDPMuxDefault(ice.UDPMuxParams{UDPConn: s.udp, Logger: s.pion.NewLogger("ice")})
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// Each tick's paced packets leave together (hop.Conn.Hold, Flush).
	if s.clock, err = playout.NewClockConfig(playout.ClockConfig{Tick: cfg.clockTick(), Batcher: s.udp}); err != nil {
		s.cancel()
		_ = s.mux.Close()
		_ = sock.Close()
		return nil, fmt.Errorf("transceiver: %w", err)
	}
	return s, nil
}

// HopAddr returns the address of the internal-hop socket, which relays'
// membership tables must map this transceiver's id to.
func (s *Server) HopAddr() net.Addr { return s.sock.LocalAddr() }

// HopStats returns the internal-hop socket's counters.
// They are zero in Direct mode.
func (s *Server) HopStats() hop.ConnStats {
	if s.conn == nil {
		return hop.ConnStats{}
	}
	return s.conn.Stats()
}

// Sessions returns the number of live sessions.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// newAPI builds the Pion API for one session: ICE-lite on the shared mux,
// the session's credentials, Opus only, its RTCP through reports.go. role
// is the DTLS role the offer asked of the answer (offerInfo.dtlsRole);
// zero means Config.DTLSRole. sess.onCheck sees every authenticated
// Binding request (pending.go).
func (s *Server) newAPI(sess *session, ufrag, pwd string, role webrtc.DTLSRole) (*webrtc.API, error) {
	var se webrtc.SettingEngine
	se.LoggerFactory = s.pion
	se.SetLite(true)
	s.setICETimeouts(&se)
	se.SetICEBindingRequestHandler(sess.onCheck)
	se.SetICEUDPMux(s.mux)
	se.SetNet(s.net)
	se.SetICECredentials(ufrag, pwd)
	se.SetReceiveMTU(hop.MaxPayload) // the path's one datagram limit (hop.Conn drops longer ones, counted)
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4, webrtc.NetworkTypeUDP6})
	// ICE has already proved the path when DTLS starts: no cookie round
	// trip when we are the DTLS server (RFC 6347 §4.2.1 makes it optional).
	se.SetDTLSInsecureSkipHelloVerify(true)
	if role != webrtc.DTLSRoleClient && role != webrtc.DTLSRoleServer {
		role = webrtc.DTLSRoleClient
		if s.cfg.DTLSRole == "server" {
			role = webrtc.DTLSRoleServer
		}
	}
	if err := se.SetAnsweringDTLSRole(role); err != nil {
		return nil, err
	}
	// SCTP association setup carried in the SDP (SNAP) when the client
	// offers a=sctp-init: the data channel opens without the 4-way handshake.
	se.EnableSctpSnap(true)
	// Data channels are read by readDataChannel (events.go) with a buffer
	// the size of the messages, not Pion's 64 KiB per channel.
	se.DetachDataChannels()
	// RTCP from the client is handled as the SRTCP session decrypts it,
	// with no goroutine reading it (reports.go).
	se.BufferFactory = sess.bufferFactory

	var me webrtc.MediaEngine
	if err := me.RegisterCodec(opusCodec, webrtc.RTPCodecTypeAudio); err != nil {
		return nil, err
	}
	// Interceptors: only the RTCP sender and receiver reports (RFC 3550
	// §6.4), which give the client loss, jitter and round-trip figures
	// and us the round trip (reports.go), from the Server's one report
	// generator instead of Pion's two ticker goroutines per session.
	// Pion's defaults add NACK (a 1024-packet resend buffer per stream
	// and a goroutine; Opus conceals a lost 20 ms frame better than a
	// retransmission arrives), TWCC feedback (a goroutine; nothing to
	// steer at 50 packets a second of one audio stream), the stats
	// interceptor (a wrapper on every packet, for GetStats, unused) and
	// video simulcast header extensions.
	var ir interceptor.Registry
	ir.Add(reportFactory{sess.reports})
	return webrtc.NewAPI(webrtc.WithSettingEngine(se), webrtc.WithMediaEngine(&me), webrtc.WithInterceptorRegistry(&ir)), nil
}

// newCredentials mints the session's local ufrag (a routing token) and pwd
// (32 random ICE characters, 192 bits; RFC 8445 §5.3 asks for 128).
func (s *Server) newCredentials() (ufrag, pwd string, err error) {
	ufrag, err = s.keys.Seal(token.Claims{
		Cluster:      s.cfg.Cluster,
		Transceiver:  s.cfg.ID,
		IssuedMinute: token.MinuteOf(time.Now()),
	}, rand.Reader)
	if err != nil {
		return "", "", err
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	return ufrag, base64.RawStdEncoding.EncodeToString(b[:]), nil
}

func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Offer starts a session from an SDP offer and returns it with its
// complete answer. Errors wrap ErrBadOffer (the offer is unusable),
// ErrFull, ErrClosed or ErrBackend.
func (s *Server) Offer(ctx context.Context, offer string, meta map[string]string) (id, answer string, err error) {
	return s.offer(ctx, offerRequest{sdp: offer, meta: meta})
}

// offerRequest is an offer and what came with it.
type offerRequest struct {
	sdp     string
	session json.RawMessage   // session configuration for the backend; nil for none, else a JSON object
	meta    map[string]string // session.start metadata
	owner   string            // id of the client token that sent it; "" when signaling is open
	client  netip.Addr        // the client's address; invalid when unknown
}

// offer is Offer with everything an HTTP request brings. Errors also wrap
// ErrClientPending and ErrPending (pending.go).
func (s *Server) offer(ctx context.Context, req offerRequest) (id, answer string, err error) {
	key := clientKey(req.client)
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return "", "", ErrClosed
	case s.draining:
		s.mu.Unlock()
		s.metrics.offersRefused.WithLabelValues(refusedDraining).Inc()
		return "", "", ErrDraining
	case len(s.sessions)+s.starting >= s.cfg.MaxSessions:
		s.mu.Unlock()
		s.metrics.offersRefused.WithLabelValues(refusedCapacity).Inc()
		return "", "", ErrFull
	}
	if err := s.reservePending(key); err != nil {
		s.mu.Unlock()
		return "", "", err
	}
	// Reserve the slot while the offer is answered, so that concurrent
	// offers cannot overshoot MaxSessions.
	s.starting++
	s.mu.Unlock()
	held := true // the pending slot, until a session holds it
	defer func() {
		s.mu.Lock()
		s.starting--
		if held {
			s.releasePending(key)
		}
		s.mu.Unlock()
	}()
	info, err := parseOffer(req.sdp)
	if err != nil {
		return "", "", err
	}
	info.session, info.client = req.session, key

	start := time.Now()
	sess, answer, err := s.newSession(ctx, req.sdp, info, req.meta, req.owner)
	if err != nil {
		s.metrics.sessionsFailed.Inc()
		return "", "", err
	}
	held = false // the session holds it now, until it connects or ends
	s.metrics.signaling.Observe(time.Since(start).Seconds())
	return sess.id, answer, nil
}

// End ends the session with the given id, telling the backend reason, and
// reports whether the session existed. It returns once the session has
// left the table; the backend and the client are told on a goroutine that
// Close waits for (lifecycle.go).
func (s *Server) End(id, reason string) bool {
	s.mu.Lock()
	sess := s.sessions[id]
	s.mu.Unlock()
	if sess == nil {
		return false
	}
	sess.end(reason)
	return true
}

// owner returns the client token id that created session id, and whether
// the session exists.
func (s *Server) owner(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[id]
	if sess == nil {
		return "", false
	}
	return sess.owner, true
}

// Ready reports whether the transceiver takes new sessions: false once it
// drains or closes.
func (s *Server) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && !s.draining
}

// Drain stops taking sessions (offers get 503 with Retry-After, /ready
// fails), lets live sessions run until they end or ctx is done, then
// closes: the sessions still live are ended with reason "shutdown" (the
// client gets a session.end event on oai-events and a DTLS close_notify,
// the backend a session.end). It returns the number of sessions it had to
// end.
func (s *Server) Drain(ctx context.Context) int {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	n := 0
	if !s.waitEmpty(ctx) {
		n = s.Sessions()
	}
	_ = s.Close()
	return n
}

// Close ends every session (the backend is told "shutdown"), waits for
// every session's end in flight, whoever started it (lifecycle.go),
// closes the socket and waits for all goroutines. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	live := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		live = append(live, sess)
	}
	s.mu.Unlock()
	// The ends run in parallel: each waits on its backend and its client
	// (up to a few seconds), and all must finish within the pod's grace
	// period.
	for _, sess := range live {
		sess.end(bridge.ReasonShutdown)
	}
	s.ends.Wait()
	s.wg.Wait()
	s.clock.Close()
	s.reports.Close()
	s.cancel()
	err := s.mux.Close()
	if cerr := s.sock.Close(); err == nil && !errors.Is(cerr, net.ErrClosed) {
		err = cerr
	}
	if s.conn != nil {
		_ = s.conn.Close() // stops its sweeper; the socket is already closed
	}
	return err
}
