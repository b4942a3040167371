// Package peer is a lean WebRTC endpoint built from Pion's parts, without
// webrtc.PeerConnection: ICE-lite (RFC 8445 §2.5) answered inline with
// pion/stun, DTLS-SRTP (RFC 5764) with pion/dtls and pion/srtp, data
// channels (RFC 8831, RFC 8832) with pion/sctp and pion/datachannel, and
// the SDP of an offer and its answer (sdp_offer.go, sdp_answer.go).
//
// One Endpoint serves every session on one shared UDP socket from one read
// loop. It demultiplexes each datagram by its first byte (RFC 7983 §7):
// STUN Binding requests are checked and answered there and then, with no
// goroutine per session; DTLS records go to the session's DTLS connection
// through a small queue; SRTP and SRTCP are decrypted in the read loop with
// the session's srtp.Context, the RTP queued for the session's one media
// reader (Session.ReadRTP) and the RTCP handed to SessionConfig.OnRTCP.
// Outbound RTP and RTCP are encrypted on the writer's goroutine and written
// to the socket directly (Session.WriteRTP, WriteRTCP), so a socket that
// batches sends (internal/hop) batches them.
//
// Per session it runs pion/dtls's two goroutines (v4: the handshake state
// machine and the record reader), pion/sctp's three (read,
// write, timers) and one of its own that drives the handshake and then
// accepts data channels (docs/benchmarks.md, "Goroutines and memory per
// session"); the caller adds its media reader (ReadRTP) and whatever reads
// the channels. ICE and SRTP cost no goroutine per session;
// liveness (RFC 7675 consent) is watched for every session by one sweeper
// goroutine of the Endpoint.
package peer

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/dtls/v4/pkg/protocol"
	"github.com/pion/logging"
	"github.com/switchboard-rtc/switchboard/internal/stunpeek"
)

// PacketConn is the shared socket an Endpoint reads and writes: a UDP
// socket, or internal/hop's Conn over one. Reads come from the Endpoint's
// one read loop; writes from any goroutine.
type PacketConn interface {
	ReadFromAddrPort(b []byte) (int, netip.AddrPort, error)
	WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error)
	LocalAddr() net.Addr
}

// DropReason says why the read loop dropped a datagram. Its String is the
// reason label of the metric the caller counts drops in.
type DropReason uint8

// dropNone is the zero value: a handler kept the datagram.
const dropNone DropReason = 0

// Reasons a datagram is dropped.
const (
	// DropUnknownPacket: the first byte is none of STUN, DTLS, RTP/RTCP
	// (RFC 7983 §7), or the datagram is empty (RFC 7983 does not say; no
	// protocol it names sends one).
	DropUnknownPacket DropReason = iota + 1
	// DropSTUNMalformed: a STUN message that does not decode.
	DropSTUNMalformed
	// DropSTUNNotRequest: a STUN message other than a Binding request (a
	// lite agent sends no requests, so expects no responses).
	DropSTUNNotRequest
	// DropSTUNUnknownUfrag: a Binding request whose USERNAME names no
	// session's local ufrag (an ended session, a restart's old ufrag).
	DropSTUNUnknownUfrag
	// DropSTUNBadUsername: a USERNAME that is not "<local>:<remote>" with
	// the session's remote ufrag (RFC 8445 §7.3).
	DropSTUNBadUsername
	// DropSTUNBadIntegrity: no MESSAGE-INTEGRITY, or one that does not
	// verify with the session's pwd (RFC 8489 §9.1.4).
	DropSTUNBadIntegrity
	// DropSTUNBadFingerprint: no FINGERPRINT, or a wrong one (RFC 8489
	// §14.7; RFC 8445 §7.3 requires it).
	DropSTUNBadFingerprint
	// DropUnknownAddress: DTLS or SRTP from an address no session has
	// learned from an authenticated check.
	DropUnknownAddress
	// DropDTLSQueueFull: the session's DTLS connection is 256 KiB of
	// datagrams behind the read loop (dtlsQueueBytes).
	DropDTLSQueueFull
	// DropSRTPNotReady: SRTP or SRTCP before the DTLS handshake gave keys,
	// past the few kept for them.
	DropSRTPNotReady
	// DropSRTPAuth: SRTP or SRTCP that does not decrypt and authenticate
	// (RFC 3711 §3.3), or a replay.
	DropSRTPAuth
	// DropRTPQueueFull: the session's media reader is behind.
	DropRTPQueueFull
	// DropSTUNIndication: a STUN indication (a Binding indication is a
	// keepalive some stacks send, RFC 7675 allows it; it needs no answer
	// and, unauthenticated, refreshes nothing). Counted apart from
	// stun_not_request, which it would swamp.
	DropSTUNIndication
	// DropSPEDMalformed: an authenticated check of a SPED session
	// (sped.go) whose DTLS-IN-STUN is not a DTLS record, or whose
	// DTLS-IN-STUN-ACK is not a list of 4-byte checksums: the attribute
	// is ignored; the check itself is answered and taken.
	DropSPEDMalformed
	// NumDropReasons is one more than the largest DropReason; Drops has
	// this length.
	NumDropReasons
)

var dropNames = [NumDropReasons]string{
	dropNone:               "none",
	DropUnknownPacket:      "unknown_packet",
	DropSTUNMalformed:      "stun_malformed",
	DropSTUNNotRequest:     "stun_not_request",
	DropSTUNUnknownUfrag:   "stun_unknown_ufrag",
	DropSTUNBadUsername:    "stun_bad_username",
	DropSTUNBadIntegrity:   "stun_bad_integrity",
	DropSTUNBadFingerprint: "stun_bad_fingerprint",
	DropUnknownAddress:     "unknown_address",
	DropDTLSQueueFull:      "dtls_queue_full",
	DropSRTPNotReady:       "srtp_not_ready",
	DropSRTPAuth:           "srtp_auth",
	DropRTPQueueFull:       "rtp_queue_full",
	DropSTUNIndication:     "stun_indication",
	DropSPEDMalformed:      "sped_malformed",
}

// String returns the reason's metric label, e.g. "stun_bad_integrity".
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

// MoveReason says why a session's media moved to another client address,
// or why a nomination of another address did not move it (MoveDeferred).
// Its String is the reason label of the metric the caller exports
// (Endpoint.Moves).
type MoveReason uint8

// Reasons for a move (session.go, "Path selection").
const (
	// MoveNominated: a fresh nominating check (USE-CANDIDATE) from
	// another address moved the media, before any SRTP or SRTCP from the
	// client had authenticated (RFC 8445 §8.2: a lite agent's selected
	// pair is the nominated one).
	MoveNominated MoveReason = iota
	// MoveConfirmed: SRTP or SRTCP that authenticated and passed the
	// replay window (RFC 3711 §3.3.2) came from a candidate, an address a
	// fresh check had come from since the client's media began, and the
	// media moved there.
	MoveConfirmed
	// MoveDeferred: a fresh nominating check from another address, after
	// the client's media began, moved nothing: the address is a
	// candidate until the client's media comes from it (a NAT rebinding's
	// first check, a check on a path the client sends no media on, or a
	// replay of a captured check from another address). Not a move.
	MoveDeferred
	// NumMoveReasons is the number of reasons.
	NumMoveReasons
)

var moveNames = [NumMoveReasons]string{"nominated", "confirmed", "deferred"}

// String returns the reason's metric label, e.g. "confirmed".
func (r MoveReason) String() string {
	if r < NumMoveReasons {
		return moveNames[r]
	}
	return "unknown"
}

// DTLSVersion is a DTLS protocol version.
type DTLSVersion uint8

// DTLS versions.
const (
	// DTLS12 is DTLS 1.2 (RFC 6347).
	DTLS12 DTLSVersion = iota + 1
	// DTLS13 is DTLS 1.3 (RFC 9147).
	DTLS13
)

// String returns the version as "1.2" or "1.3"; "" for the zero value.
func (v DTLSVersion) String() string {
	switch v {
	case DTLS12:
		return "1.2"
	case DTLS13:
		return "1.3"
	}
	return ""
}

// ParseDTLSVersion parses "1.2" or "1.3".
func ParseDTLSVersion(s string) (DTLSVersion, error) {
	switch s {
	case "1.2":
		return DTLS12, nil
	case "1.3":
		return DTLS13, nil
	}
	return 0, fmt.Errorf("peer: DTLS version %q: want 1.2 or 1.3", s)
}

// protocol is v as pion/dtls names it; the zero value is DTLS 1.2.
func (v DTLSVersion) protocol() protocol.Version {
	if v == DTLS13 {
		return protocol.Version1_3
	}
	return protocol.Version1_2
}

// versionOf is the DTLSVersion of a negotiated pion/dtls version, or 0.
func versionOf(p protocol.Version) DTLSVersion {
	switch p {
	case protocol.Version1_2:
		return DTLS12
	case protocol.Version1_3:
		return DTLS13
	}
	return 0
}

// Config configures an Endpoint.
type Config struct {
	// Conn is the shared socket. Required. The Endpoint reads it until a
	// read fails with net.ErrClosed; the caller closes it.
	Conn PacketConn
	// InsecureSkipHelloVerify skips the DTLS HelloVerifyRequest cookie
	// round trip when a session is the DTLS server (RFC 6347 §4.2.1 makes
	// it optional; ICE has already proved the path).
	InsecureSkipHelloVerify bool
	// DTLSVersion is the highest DTLS version sessions negotiate: DTLS12
	// (the zero value), or DTLS13, which takes DTLS 1.3 (RFC 9147) with a
	// client that offers it and DTLS 1.2 with one that does not.
	DTLSVersion DTLSVersion
	// ConsentTick is how often the sweeper looks at how long each
	// session's client has been silent. Default 1 s.
	ConsentTick time.Duration
	// MaxPayload is the longest datagram read or written, in bytes.
	// Default 1500. It must be at least the path MTU's payload: a longer
	// datagram is cut by the read, and the cut DTLS or SRTP fails to
	// authenticate (counted as srtp_auth, or dropped by DTLS). WriteRTP
	// refuses a packet whose SRTP datagram could exceed it (ErrTooBig).
	MaxPayload int
	// OnDrop, if set, is called for every datagram dropped, on the read
	// loop (or, for SRTP that came before a session's keys, on the
	// session's goroutine). It must not block.
	OnDrop func(DropReason)
	// LoggerFactory receives the DTLS, SCTP and data channel libraries'
	// logs. Nil: none.
	LoggerFactory logging.LoggerFactory
	// Logger receives the Endpoint's own (rare) lines. Default
	// slog.Default().
	Logger *slog.Logger
}

// Endpoint serves the sessions of one shared socket.
type Endpoint struct {
	// Set once.
	cfg  Config
	conn PacketConn
	log  *slog.Logger
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.RWMutex
	byUfrag map[string]*Session         // local ufrag → session; guarded by mu
	byAddr  map[netip.AddrPort]*Session // learned client address → session; guarded by mu

	drops [NumDropReasons]atomic.Uint64
	moves [NumMoveReasons]atomic.Uint64
	// SPED's DTLS datagrams (sped.go): taken from checks, sent in
	// Binding responses.
	spedIn, spedOut atomic.Uint64

	closeOnce sync.Once
}

// New returns an Endpoint and starts its read loop and consent sweeper.
func New(cfg Config) (*Endpoint, error) {
	if cfg.Conn == nil {
		return nil, errors.New("peer: Config.Conn is required")
	}
	if cfg.ConsentTick <= 0 {
		cfg.ConsentTick = time.Second
	}
	switch cfg.DTLSVersion {
	case 0:
		cfg.DTLSVersion = DTLS12
	case DTLS12, DTLS13:
	default:
		return nil, fmt.Errorf("peer: Config.DTLSVersion %d is neither DTLS12 nor DTLS13", cfg.DTLSVersion)
	}
	if cfg.MaxPayload <= 0 {
		cfg.MaxPayload = 1500
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LoggerFactory == nil {
		lf := logging.NewDefaultLoggerFactory()
		lf.DefaultLogLevel = logging.LogLevelDisabled
		cfg.LoggerFactory = lf
	}
	e := &Endpoint{
		cfg:     cfg,
		conn:    cfg.Conn,
		log:     cfg.Logger,
		stop:    make(chan struct{}),
		byUfrag: make(map[string]*Session),
		byAddr:  make(map[netip.AddrPort]*Session),
	}
	e.wg.Add(2)
	go e.readLoop()
	go e.sweep()
	return e, nil
}

// Close stops the consent sweeper and waits for the read loop, which ends
// when the socket is closed: close Config.Conn first. Sessions are not
// closed; close them before.
func (e *Endpoint) Close() {
	e.closeOnce.Do(func() { close(e.stop) })
	e.wg.Wait()
}

// Drops returns how many datagrams the read loop dropped, by reason.
func (e *Endpoint) Drops() [NumDropReasons]uint64 {
	var d [NumDropReasons]uint64
	for i := range d {
		d[i] = e.drops[i].Load()
	}
	return d
}

// Moves returns how many times sessions' media moved to another client
// address, by reason, and how many nominations of another address were
// deferred (MoveDeferred).
func (e *Endpoint) Moves() [NumMoveReasons]uint64 {
	var m [NumMoveReasons]uint64
	for i := range m {
		m[i] = e.moves[i].Load()
	}
	return m
}

// SPEDStats are an Endpoint's counts of DTLS datagrams carried in the ICE
// checks (SPED, sped.go).
type SPEDStats struct {
	// In: the clients' DTLS datagrams taken from their checks (fresh,
	// from the selected address) into the handshake.
	In uint64
	// Out: the sessions' own DTLS datagrams sent inside Binding
	// responses.
	Out uint64
}

// SPEDStats returns the Endpoint's SPED counts.
func (e *Endpoint) SPEDStats() SPEDStats {
	return SPEDStats{In: e.spedIn.Load(), Out: e.spedOut.Load()}
}

func (e *Endpoint) drop(r DropReason) {
	e.drops[r].Add(1)
	if e.cfg.OnDrop != nil {
		e.cfg.OnDrop(r)
	}
}

// readLoop reads the shared socket and demultiplexes every datagram by its
// first byte (RFC 7983 §7): 0–3 STUN, 20–63 DTLS, 128–191 RTP and RTCP.
func (e *Endpoint) readLoop() {
	defer e.wg.Done()
	buf := make([]byte, e.cfg.MaxPayload)
	var rd reader
	for {
		n, addr, err := e.conn.ReadFromAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				continue
			}
			e.log.Warn("peer: socket read failed; the endpoint stops", "err", err)
			return
		}
		e.handle(&rd, buf[:n], addr)
	}
}

// handle demultiplexes one datagram from addr by its first byte (RFC 7983
// §7, stunpeek.Classify; an empty datagram is unknown) and hands it to its
// handler. Read loop.
func (e *Endpoint) handle(rd *reader, b []byte, addr netip.AddrPort) {
	switch stunpeek.Classify(b) {
	case stunpeek.KindSTUN:
		e.handleSTUN(rd, b, addr)
	case stunpeek.KindDTLS:
		s := e.session(addr)
		if s == nil {
			e.drop(DropUnknownAddress)
			return
		}
		// Not yet authenticated: consent is refreshed only once the
		// record layer has verified it (authConn).
		if !s.dtls.push(b) {
			e.drop(DropDTLSQueueFull)
		}
	case stunpeek.KindRTP:
		s := e.session(addr)
		if s == nil {
			e.drop(DropUnknownAddress)
			return
		}
		if r := s.handleSRTP(rd, b, addr); r != dropNone {
			e.drop(r)
		}
	default:
		e.drop(DropUnknownPacket)
	}
}

// session returns the session that learned addr, or nil.
func (e *Endpoint) session(addr netip.AddrPort) *Session {
	e.mu.RLock()
	s := e.byAddr[addr]
	e.mu.RUnlock()
	return s
}

// sweep looks at every connected session's silence once per ConsentTick
// (consent.go).
func (e *Endpoint) sweep() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.ConsentTick)
	defer t.Stop()
	var live []*Session
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		e.mu.RLock()
		for _, s := range e.byUfrag {
			live = append(live, s)
		}
		e.mu.RUnlock()
		now := time.Now()
		for _, s := range live {
			s.checkConsent(now)
		}
		clear(live)
		live = live[:0]
	}
}
