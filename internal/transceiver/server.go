// Package transceiver is Switchboard's stateful WebRTC endpoint. It answers
// SDP offers over HTTP, terminates ICE (lite), DTLS, SRTP and SCTP on one
// shared internal-hop socket with internal/peer (Pion's parts, one read
// loop for every session), and bridges each session's audio
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
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/playout"
	"github.com/switchboard-rtc/switchboard/internal/rtcpreport"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/udpio"
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

// opusClockRate is the RTP clock rate of the one codec served, Opus (RFC
// 7587 §4.1: always 48 kHz).
const opusClockRate = 48000

// Server is one transceiver: the signaling handlers, the shared
// internal-hop socket and the live sessions.
type Server struct {
	// Set once.
	cfg     Config
	keys    *token.Keyring
	log     *slog.Logger
	sock    *net.UDPConn // the one UDP socket
	conn    *hop.Conn    // the internal hop over sock; nil when Config.Direct
	udp     *probeConn   // what peer reads and writes: conn, or sock when Direct
	peer    *peer.Endpoint
	metrics *metrics
	byTrans *transportMetrics     // metrics by transport (transport.go)
	probe   *delayProbe           // samples the media delay inside (delay.go)
	certs   certs                 // the DTLS certificate sessions share (cert.go)
	pion    *pionLogs             // Pion's log lines, through log (pionlog.go)
	auth    *auth.Authority       // nil: signaling is open
	clock   *playout.Clock        // paces every session's output (media.go)
	reports *rtcpreport.Generator // sends every session's RTCP reports (reports.go)
	bridges *bridge.Pool          // every session's bridge, v2 connections shared (bridgepool.go)
	ctx     context.Context
	cancel  context.CancelFunc

	sockDrops atomic.Uint64 // the socket's kernel drops at the last scrape (metrics.go)
	setupLog  setupLog      // rate-limits the setup-failure log lines (setup.go)

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
	// Every session's datagrams share this socket: with the default
	// receive buffer, a read loop held up some tens of milliseconds on a
	// busy machine lost audio in the kernel (switchboard_transceiver_socket_dropped_total).
	udpio.SetBuffers(sock)
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
	s.reports = rtcpreport.NewGenerator(cfg.ReportInterval)
	s.pion = newPionLogs(s.log)
	s.metrics = newMetrics(s, reg)
	s.byTrans = newTransportMetrics(s, reg)
	s.bridges = newBridgePool(cfg.BackendURL, reg)
	s.probe = newDelayProbe(s.metrics.mediaDelay)
	if cfg.Direct {
		if s.cfg.advertise.Port() == 0 {
			s.cfg.advertise = sock.LocalAddr().(*net.UDPAddr).AddrPort()
		}
		s.udp = newProbeConn(udpAddrPort{sock}, s.probe)
	} else {
		s.conn, err = hop.NewConn(sock, hop.ConnConfig{Advertise: cfg.advertise, AllowRelays: cfg.allow, OnSent: s.probe.sent})
		if err != nil {
			_ = sock.Close()
			return nil, err
		}
		s.udp = newProbeConn(s.conn, s.probe)
	}
	s.peer, err = peer.New(peer.Config{
		Conn: s.udp,
		// ICE has already proved the path when DTLS starts: no cookie
		// round trip when we are the DTLS server (RFC 6347 §4.2.1 makes
		// it optional).
		InsecureSkipHelloVerify: true,
		DTLSVersion:             cfg.dtlsVersion,
		ConsentTick:             consentTick,
		MaxPayload:              hop.MaxPayload, // the path's one datagram limit
		OnDrop:                  s.metrics.peerDrop,
		LoggerFactory:           s.pion,
		Logger:                  s.log,
	})
	if err != nil {
		_ = sock.Close()
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// Each tick's paced packets leave together (hop.Conn.Hold, Flush).
	if s.clock, err = playout.NewClock(playout.ClockConfig{Tick: cfg.clockTick(), Batcher: s.udp}); err != nil {
		s.cancel()
		s.peer.Close()
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

// PeerSPED returns the WebRTC endpoint's counts of DTLS datagrams carried
// in the ICE checks (peer.Endpoint.SPEDStats).
func (s *Server) PeerSPED() peer.SPEDStats {
	if s.peer == nil {
		return peer.SPEDStats{}
	}
	return s.peer.SPEDStats()
}

// PeerMoves returns how many times the WebRTC endpoint moved sessions'
// media to another client address, by reason (peer.Endpoint.Moves).
func (s *Server) PeerMoves() [peer.NumMoveReasons]uint64 {
	if s.peer == nil {
		return [peer.NumMoveReasons]uint64{}
	}
	return s.peer.Moves()
}

// Sessions returns the number of live sessions.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
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
	// The answer leaves now: its first check's arrival bounds the round
	// trip the DTLS handshake retransmits on (peer.Session.Answered).
	sess.peer.Answered(time.Now())
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
	_ = s.bridges.Close()
	s.clock.Close()
	s.reports.Close()
	s.cancel()
	var err error
	if cerr := s.sock.Close(); !errors.Is(cerr, net.ErrClosed) {
		err = cerr
	}
	if s.conn != nil {
		_ = s.conn.Close() // stops its sweeper; the socket is already closed
	}
	s.peer.Close() // its read loop ends with the socket
	return err
}
