package peer

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/datachannel"
	"github.com/pion/dtls/v4"
	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/sctp"
	"github.com/pion/stun/v4"
	"github.com/pion/transport/v5/deadline"
)

// Errors of sessions.
var (
	// ErrClosed: the session is closed.
	ErrClosed = errors.New("peer: session closed")
	// ErrNotConnected: media written before the DTLS handshake gave SRTP
	// keys.
	ErrNotConnected = errors.New("peer: session not connected")
	// ErrTooBig: an RTP packet whose SRTP datagram could be longer than
	// Config.MaxPayload (the packet plus 16 bytes of SRTP tag).
	ErrTooBig = errors.New("peer: packet longer than the maximum payload")

	errDuplicateUfrag = errors.New("peer: local ufrag already in use")
	errNoAddress      = errors.New("peer: no client address selected yet")
)

// DTLSRole is the DTLS role a session takes (RFC 5763 §5: the answer's
// a=setup, active for the client, passive for the server).
type DTLSRole uint8

// DTLS roles.
const (
	DTLSClient DTLSRole = iota + 1
	DTLSServer
)

// State is a session's connection event, passed to SessionConfig.OnState.
type State uint8

// Session states.
const (
	// StateICEConnected: the client nominated a pair (a valid check with
	// USE-CANDIDATE), or traffic resumed after StateDisconnected.
	StateICEConnected State = iota + 1
	// StateDisconnected: nothing authenticated arrived for
	// SessionConfig.DisconnectedTimeout.
	StateDisconnected
	// StateFailed: nothing authenticated arrived for
	// SessionConfig.FailedTimeout: consent is lost (RFC 7675 §5.1). Final.
	StateFailed
	// StateDTLSConnected: the DTLS handshake completed and the remote
	// certificate matched a fingerprint of the offer.
	StateDTLSConnected
	// StateDTLSFailed: the DTLS handshake failed, did not end within
	// SessionConfig.HandshakeTimeout, or gave no SRTP profile. Final.
	StateDTLSFailed
	// StateConnected: SRTP keys are derived; media flows both ways.
	StateConnected
	// StateClosed: the client closed the DTLS association (close_notify or
	// a fatal alert). Final.
	StateClosed
	// StateChecked: the session's first authenticated check (USERNAME,
	// MESSAGE-INTEGRITY and FINGERPRINT verified) arrived and was answered;
	// the DTLS handshake starts now, before any nomination. Once.
	StateChecked
	// StateSCTPConnected: the SCTP association for data channels is up
	// (SessionConfig.Data), after StateConnected. Once.
	StateSCTPConnected
)

var stateNames = [...]string{"", "ice_connected", "disconnected", "failed", "dtls_connected", "dtls_failed", "connected", "closed", "checked", "sctp_connected"}

// String returns the state's name, e.g. "ice_connected".
func (s State) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return "unknown"
}

// SessionConfig is one session: its ICE credentials, the remote DTLS
// certificate's fingerprints, and where its traffic goes.
type SessionConfig struct {
	// LocalUfrag and LocalPwd are the session's ICE credentials (the
	// answer's), RemoteUfrag the client's (the offer's). Required.
	LocalUfrag, LocalPwd, RemoteUfrag string
	// Role is the DTLS role taken. Required.
	Role DTLSRole
	// Certificate is the DTLS certificate the session presents (a
	// self-signed one, authenticated by the answer's fingerprint, RFC
	// 8122; sessions may share one). Required.
	Certificate tls.Certificate
	// Fingerprints are the offer's a=fingerprint lines: the client's
	// certificate must match one of those of the strongest hash function
	// among them (RFC 8122 §5); sha-1 and sha-2 are accepted, md5 and
	// unknown functions ignored. At least one.
	Fingerprints []Fingerprint
	// Data runs an SCTP association for data channels over DTLS (the
	// offer has an application m-section).
	Data bool
	// MaxMessageSize is the client's a=max-message-size (RFC 8841 §6), in
	// bytes: the largest message sent to it. 0: 65536.
	MaxMessageSize int
	// RemoteSCTPInit is the offer's a=sctp-init (SCTP SNAP, a Pion
	// extension): with it, the association starts without its 4-way
	// handshake and LocalSCTPInit gives the answer's. Nil: none.
	RemoteSCTPInit []byte
	// HandshakeTimeout bounds the DTLS handshake, from the first
	// authenticated check; past it the session reports StateDTLSFailed.
	// Default 30 s (about when RFC 6347 §4.2.4.1's retransmissions,
	// doubling from 1 s, would have given up).
	HandshakeTimeout time.Duration
	// DisconnectedTimeout and FailedTimeout bound the client's silence
	// (RFC 7675); 0 disables either.
	DisconnectedTimeout, FailedTimeout time.Duration
	// RTPQueue is how many decrypted RTP packets may wait for ReadRTP.
	// Default 16 (320 ms of 20 ms audio).
	RTPQueue int

	// OnCheck, if set, is called on the read loop for every valid
	// connectivity check, with the client's address and whether the check
	// nominated it (USE-CANDIDATE). It must not block.
	OnCheck func(addr netip.AddrPort, nominated bool)
	// OnState, if set, is called with each connection event, on the read
	// loop, the consent sweeper or the session's goroutine. It must not
	// block.
	OnState func(State)
	// OnRTCP, if set, is called on the read loop with each decrypted
	// compound RTCP packet (RFC 3550 §6.1); for the few that came before
	// the SRTP keys, on the session's goroutine. It must not block or keep
	// b.
	OnRTCP func(b []byte)
	// OnDataChannel, if set, is called with each data channel the client
	// opens (DCEP, RFC 8832), on the session's goroutine: it must return
	// promptly (start the channel's reader on a goroutine of its own). The
	// channel closes with the session.
	OnDataChannel func(*datachannel.DataChannel)

	// SPED takes the DTLS handshake inside the ICE checks (sped.go): the
	// offer and the answer have a=ice-options sped/googspedv1. It needs
	// Role DTLSServer and an ECDSA Certificate (a handshake datagram must
	// fit in a Binding message), and negotiates up to DTLS 1.3 whatever
	// Config.DTLSVersion says: only DTLS 1.3 saves the round trip.
	SPED bool
}

// credentials are a session's current ICE credentials.
type credentials struct {
	localUfrag, remoteUfrag string
	integrity               stun.MessageIntegrity
}

// Session is one client's ICE-lite, DTLS-SRTP and SCTP association on
// the Endpoint's socket.
type Session struct {
	// Set once.
	e      *Endpoint
	cfg    SessionConfig
	dtls   *feed
	sped   *sped // nil unless SessionConfig.SPED
	rtpq   chan *[]byte
	rdline *deadline.Deadline
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	snap   []byte        // the answer's a=sctp-init; nil: no SNAP

	cred     atomic.Pointer[credentials]
	addr     atomic.Pointer[netip.AddrPort] // the selected client address; nil until the first check
	lastSeen atomic.Int64                   // unix ns of the last authenticated datagram
	started  atomic.Bool                    // the first authenticated check came; run started
	iceUp    atomic.Bool                    // the first nomination came (StateICEConnected)
	answered atomic.Int64                   // unix ns the answer left (Answered); 0: not told
	checkAt  atomic.Int64                   // unix ns of the first authenticated check; 0: none yet
	nomAt    atomic.Int64                   // unix ns of the first nomination; 0: none yet
	dtlsAt   atomic.Int64                   // unix ns the DTLS handshake completed; 0: not yet
	sctpUp   atomic.Bool                    // the SCTP association is up
	// dtlsVersion is the negotiated DTLSVersion, set as the handshake
	// completes; 0 before.
	dtlsVersion atomic.Uint32
	keys        atomic.Pointer[srtpKeys]
	media       atomic.Bool // SRTP or SRTCP from the client has authenticated
	closing     atomic.Bool

	// The transaction IDs of the last checks, the read loop's alone
	// (Session.replayed).
	txids [txRing][stun.TransactionIDSize]byte
	txn   int // next slot
	txLen int // slots filled

	// Candidates, the read loop's alone ("Path selection"): the addresses
	// other than the selected one that fresh checks of generation candGen
	// came from since the media began or last moved, waiting for the
	// client's media from them.
	cands    [maxLearned]netip.AddrPort
	candAt   [maxLearned]time.Time // when each candidate's last fresh check came
	candN    int                   // slots filled
	candNext int
	candGen  *credentials
	candTTL  time.Duration // candidateTTL; tests shorten it (export_test.go)

	// flightFixed, if not 0, is the DTLS retransmission timeout instead of
	// the one the session computes (Session.flightInterval); tests fix it
	// (export_test.go).
	flightFixed time.Duration

	// Consent state, the sweeper's alone.
	silent, failed bool

	// emu guards early, SRTP and SRTCP that came before the keys
	// (media.go), and the keys' publication.
	emu   sync.Mutex
	early [][]byte

	// wmu guards the outbound SRTP context and the scratch headers.
	wmu   sync.Mutex
	whdr  rtp.Header
	wrtcp rtcp.Header

	mu    sync.Mutex
	conn  *dtls.Conn        // guarded by mu; nil until the handshake starts
	assoc *sctp.Association // guarded by mu

	// Guarded by Endpoint.mu.
	learned []netip.AddrPort
	gone    bool

	closeOnce sync.Once
}

// NewSession registers a session on e: checks for its local ufrag are
// answered from now on. It errs if the ufrag is taken or the config is
// incomplete.
func (e *Endpoint) NewSession(cfg SessionConfig) (*Session, error) {
	switch {
	case cfg.LocalUfrag == "" || cfg.LocalPwd == "" || cfg.RemoteUfrag == "":
		return nil, errors.New("peer: a session needs local and remote ICE credentials")
	case cfg.Role != DTLSClient && cfg.Role != DTLSServer:
		return nil, errors.New("peer: a session needs a DTLS role")
	case len(cfg.Certificate.Certificate) == 0:
		return nil, errors.New("peer: a session needs a DTLS certificate")
	case len(cfg.Fingerprints) == 0:
		return nil, errors.New("peer: a session needs the remote certificate's fingerprint")
	case cfg.SPED && cfg.Role != DTLSServer:
		return nil, errors.New("peer: a SPED session is the DTLS server (a=setup:passive)")
	case cfg.SPED && !isECDSA(cfg.Certificate):
		return nil, errors.New("peer: a SPED session needs an ECDSA certificate: an RSA one does not fit in a Binding message")
	}
	if cfg.RTPQueue <= 0 {
		cfg.RTPQueue = 16
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = 65536
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 30 * time.Second
	}
	s := &Session{e: e, cfg: cfg, rtpq: make(chan *[]byte, cfg.RTPQueue), rdline: deadline.New(), done: make(chan struct{}), candTTL: candidateTTL}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.dtls = newFeed(s)
	if cfg.SPED {
		s.sped = &sped{wait: spedResponseWait}
	}
	s.dtls.resendDelay = resendDelay
	s.cred.Store(&credentials{localUfrag: cfg.LocalUfrag, remoteUfrag: cfg.RemoteUfrag, integrity: stun.NewShortTermIntegrity(cfg.LocalPwd)})
	if cfg.Data && len(cfg.RemoteSCTPInit) > 0 {
		snap, err := sctp.GenerateOutOfBandToken(s.sctpOptions(nil)...)
		if err != nil {
			return nil, err
		}
		s.snap = snap
	}
	if err := e.register(s, cfg.LocalUfrag); err != nil {
		return nil, err
	}
	return s, nil
}

// LocalSCTPInit returns the answer's a=sctp-init payload when the offer
// had one (SessionConfig.RemoteSCTPInit), else nil.
func (s *Session) LocalSCTPInit() []byte { return s.snap }

func (s *Session) credentials() *credentials { return s.cred.Load() }

func (s *Session) ufrag() string { return s.cred.Load().localUfrag }

// remote returns the selected client address; invalid before the first
// check.
func (s *Session) remote() netip.AddrPort {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return netip.AddrPort{}
}

// RemoteAddr returns the client address the session sends to; invalid
// before the first valid check.
func (s *Session) RemoteAddr() netip.AddrPort { return s.remote() }

func (s *Session) seen() { s.lastSeen.Store(time.Now().UnixNano()) }

func (s *Session) state(st State) {
	if s.cfg.OnState != nil {
		s.cfg.OnState(st)
	}
}

// txRing is how many recent check transaction IDs a session remembers.
// A client gives each check a fresh one (RFC 8489 §6.2.1); an identical
// one is a retransmission or a replay.
const txRing = 16

// replayed reports whether id is one of the session's last txRing check
// transaction IDs, and remembers it if not. MESSAGE-INTEGRITY covers the
// ID, so whoever lacks the pwd cannot mint a fresh one; a replay of a
// check older than the ring passes here, and "Path selection" bounds what
// it can move. Read loop.
func (s *Session) replayed(id [stun.TransactionIDSize]byte) bool {
	for i := range s.txLen {
		if s.txids[i] == id {
			return true
		}
	}
	s.txids[s.txn] = id
	s.txn = (s.txn + 1) % txRing
	s.txLen = min(s.txLen+1, txRing)
	return false
}

// Path selection.
//
// The selected address is where the session sends (RemoteAddr). The first
// valid check selects its address, so that the session can answer and
// send (its DTLS handshake starts there, checked). What moves the media
// after that depends on whether the client's media has begun (SRTP or
// SRTCP from it has authenticated) and the client has nominated:
//
//   - Before either: a nominating check (USE-CANDIDATE, which the controlling
//     client sends on the pair it chose, RFC 8445 §8.1.1) moves the media
//     at once, a lite agent's selected pair being the nominated one (RFC
//     8445 §8.2), MoveNominated. There is no media to take yet: DTLS is
//     still starting, or the client sends data channels only. The first
//     nomination moves the media even when the client's media began
//     before it (DTLS done before the nomination, below ~48 ms of RTT with
//     Chromium, which nominates on a later check): no nomination came
//     before it to be replayed.
//   - After both: a fresh check from another address, nominating or not, only
//     makes that address a candidate for candidateTTL (a nominating one is
//     counted, MoveDeferred); the media moves there with the first SRTP or
//     SRTCP from it within that time that authenticates and passes the
//     replay window (RFC 3711 §3.3.2), MoveConfirmed. A check carries no
//     time and short-term credentials have no replay protection (RFC 8489
//     §9.1): whoever captured one can replay it from anywhere, and the
//     transaction-ID ring catches only recent ones. SRTP cannot be made
//     without the keys nor replayed, so the confirmation is the client's
//     own packet: a NAT-rebound client sends RTP every 20 ms from its new
//     port, so the move waits for its first check from there (a
//     nominating one, or a consent check, which Pion sends without
//     USE-CANDIDATE at least every 2 s) and one packet. A replayer's
//     address confirms only if a copy of one of the client's fresh
//     packets, sent from there, reaches the session before the packet
//     itself: the replayer's path from where it captured is shorter, or
//     the original is lost past that point (Wi-Fi uplink loss). That
//     takes no man in the middle, only capturing and sending; the
//     replayer gets SRTP it cannot decrypt, the client loses audio until
//     its next check and packet move the media back, and candidateTTL
//     bounds each replayed check to one such race, in the seconds after
//     it. A move clears the candidates, so that late packets from the
//     address left do not move the media back.
//
// Consent (RFC 7675): a check refreshes it only from the selected address
// (or when it selects its address); a candidate's check does not, its
// confirming SRTP does. SRTP, SRTCP and authenticated DTLS refresh it from
// any learned address.
//
// An ICE restart (Restart) voids the old generation's candidates.

// checked handles a valid, fresh check from addr of the credentials cred
// (ice.go). It reports whether this is the session's first authenticated
// check, for which the caller starts the DTLS handshake once it has
// answered (startHandshake), and whether it is the first nomination, for
// which it reports StateICEConnected. Read loop.
//
// The handshake starts on the first authenticated check, not on the
// nomination: a lite agent has no pair to choose, the check has proved
// the client holds the pwd and can be reached at addr, and a client that
// nominates on a later check (regular nomination: Chromium and Pion, RFC
// 8445 §8.1.1) would otherwise wait a check interval and a round trip more.
// The nomination still decides where the session sends ("Path selection").
func (s *Session) checked(addr netip.AddrPort, nominated bool, cred *credentials) (first, firstNomination bool) {
	cur := s.remote()
	switch {
	case !cur.IsValid():
		s.selectAddr(addr)
		cur = addr
	case cur == addr:
	case !s.media.Load() || !s.iceUp.Load():
		if nominated {
			s.selectAddr(addr)
			cur = addr
			s.e.moves[MoveNominated].Add(1)
		}
	default:
		s.candidate(addr, cred)
		if nominated {
			s.e.moves[MoveDeferred].Add(1)
		}
	}
	if addr == cur {
		s.seen()
	}
	if s.cfg.OnCheck != nil {
		s.cfg.OnCheck(addr, nominated)
	}
	if nominated && !s.iceUp.Load() {
		if firstNomination = !s.iceUp.Swap(true); firstNomination {
			s.nomAt.Store(time.Now().UnixNano())
		}
	}
	if s.started.Load() {
		return false, firstNomination
	}
	s.mu.Lock()
	first = !s.closing.Load() && !s.started.Swap(true)
	s.mu.Unlock()
	if first {
		s.checkAt.Store(time.Now().UnixNano())
	}
	return first, firstNomination
}

// selectAddr makes a the selected address. (Its own function, so that
// only a move puts an address on the heap.)
func (s *Session) selectAddr(a netip.AddrPort) { s.addr.Store(&a) }

// candidateTTL is how long an address stays a candidate after its last
// fresh check ("Path selection"). A NAT-rebound client's first RTP packet
// from its new port follows its check from there within a packet time, 20
// ms; 2 s is a hundred of them, room for a client whose RTP pauses and
// that confirms with RTCP. A candidate that lapses unconfirmed costs the
// client a wait, not the move: its next check from there (Pion's consent
// checks come every 2 s, browsers' every 4 to 6 s, RFC 7675 §5.1) makes it
// a candidate again. What the bound buys: a replayed check is good for one
// race, a copy of the client's SRTP overtaking the original within 2 s of
// the replay, rather than for any time until the media next moves.
const candidateTTL = 2 * time.Second

// candidate makes addr, from a fresh check of generation cred, a
// candidate from now for s.candTTL; a candidate's check renews it. The
// oldest candidate gives way when all maxLearned slots are taken (as the
// oldest learned address does, ice.go). Read loop.
func (s *Session) candidate(addr netip.AddrPort, cred *credentials) {
	if s.candGen != cred {
		s.candN, s.candNext, s.candGen = 0, 0, cred
	}
	now := time.Now()
	for i, a := range s.cands[:s.candN] {
		if a == addr {
			s.candAt[i] = now
			return
		}
	}
	s.cands[s.candNext], s.candAt[s.candNext] = addr, now
	s.candNext = (s.candNext + 1) % len(s.cands)
	s.candN = min(s.candN+1, len(s.cands))
}

// authenticated handles SRTP or SRTCP from the client address from that
// authenticated and passed the replay window: it refreshes consent, marks
// the client's media begun and, from a candidate whose check came within
// s.candTTL, moves the media there.
// from is invalid for the datagrams that came before the keys, which move
// nothing. The read loop (setKeys for those before the keys).
func (s *Session) authenticated(from netip.AddrPort) {
	s.seen()
	if !s.media.Load() {
		s.media.Store(true)
	}
	// from is checked first: the candidates are the read loop's.
	if !from.IsValid() || from == s.remote() || s.candN == 0 {
		return
	}
	// A datagram from another address than the selected one: from a
	// candidate whose check is recent, a move; else a late one from an
	// address the media left, or from a candidate that lapsed, which
	// moves nothing.
	if s.candGen != s.credentials() {
		s.candN, s.candNext = 0, 0 // an ICE restart since
		return
	}
	for i, a := range s.cands[:s.candN] {
		if a == from {
			if time.Since(s.candAt[i]) > s.candTTL {
				return
			}
			s.selectAddr(from)
			s.candN, s.candNext = 0, 0
			s.e.moves[MoveConfirmed].Add(1)
			return
		}
	}
}

// startHandshake reports StateChecked and starts the session's goroutine
// (run), which starts the DTLS handshake, after the first authenticated
// check has been answered. Read loop.
func (s *Session) startHandshake() {
	s.state(StateChecked)
	go s.run()
}

// Answered records at as when the session's answer left (the signaling
// response was written). The first authenticated check then comes a round
// trip and the client's processing later, which bounds the path's round
// trip from above before any DTLS: the handshake's first retransmission
// timeout is taken from it (flightInterval). Call it once, before the
// client can have the answer; a session not told retransmits after 1 s
// (RFC 6347 §4.2.4.1).
func (s *Session) Answered(at time.Time) { s.answered.Store(at.UnixNano()) }

// SetupRTT returns the time from Answered to the first authenticated
// check, the bound of the round trip the handshake retransmits on, and
// whether both have happened.
func (s *Session) SetupRTT() (time.Duration, bool) {
	a, c := s.answered.Load(), s.checkAt.Load()
	if a == 0 || c == 0 || c < a {
		return 0, false
	}
	return time.Duration(c - a), true
}

// SPED reports whether a DTLS datagram of the client's came inside one
// of its checks (SessionConfig.SPED, sped.go).
func (s *Session) SPED() bool {
	if s.sped == nil {
		return false
	}
	s.sped.mu.Lock()
	defer s.sped.mu.Unlock()
	return s.sped.used
}

// isECDSA reports whether c's key is ECDSA.
func isECDSA(c tls.Certificate) bool {
	_, ok := c.PrivateKey.(*ecdsa.PrivateKey)
	return ok
}

// DTLSVersion returns the DTLS version the handshake negotiated, or 0
// before it has completed.
func (s *Session) DTLSVersion() DTLSVersion { return DTLSVersion(s.dtlsVersion.Load()) }

// SetupPhase is how far a session's setup has come (Session.SetupPhase):
// where a setup that failed stopped.
type SetupPhase uint8

// Setup phases, in order.
const (
	// SetupNoCheck: no authenticated check has come (a firewall, a wrong
	// address in the answer, a client that never applied it).
	SetupNoCheck SetupPhase = iota
	// SetupNoDTLS: authenticated checks came, and no DTLS from the client:
	// its DTLS did not start, or was lost both ways.
	SetupNoDTLS
	// SetupDTLS: DTLS came from the client, and the handshake has not
	// completed (a lossy path, a failed handshake).
	SetupDTLS
	// SetupConnected: the handshake completed and SRTP has keys; the SCTP
	// association, if the session has one, is not up.
	SetupConnected
	// SetupSCTP: the SCTP association is up too.
	SetupSCTP
)

var setupPhaseNames = [...]string{"no_check", "no_dtls", "dtls", "connected", "sctp"}

// String returns the phase's name, e.g. "no_dtls".
func (p SetupPhase) String() string {
	if int(p) < len(setupPhaseNames) {
		return setupPhaseNames[p]
	}
	return "unknown"
}

// SetupPhase returns how far the session's setup has come.
func (s *Session) SetupPhase() SetupPhase {
	switch {
	case s.sctpUp.Load():
		return SetupSCTP
	case s.keys.Load() != nil:
		return SetupConnected
	case s.dtls.heard.Load():
		return SetupDTLS
	case s.checkAt.Load() != 0:
		return SetupNoDTLS
	}
	return SetupNoCheck
}

// SetupTimes are when a session's setup milestones happened; a zero time
// has not happened yet.
type SetupTimes struct {
	// Answered is what Session.Answered was given.
	Answered time.Time
	// Checked is the first authenticated check; Nominated the first
	// nomination (USE-CANDIDATE); DTLS the handshake's completion.
	Checked, Nominated, DTLS time.Time
}

// SetupTimes returns the session's setup milestones.
func (s *Session) SetupTimes() SetupTimes {
	at := func(ns int64) time.Time {
		if ns == 0 {
			return time.Time{}
		}
		return time.Unix(0, ns)
	}
	return SetupTimes{Answered: at(s.answered.Load()), Checked: at(s.checkAt.Load()), Nominated: at(s.nomAt.Load()), DTLS: at(s.dtlsAt.Load())}
}

// checkConsent reports the client's silence (the sweeper, peer.go).
func (s *Session) checkConsent(now time.Time) {
	if !s.started.Load() || s.failed || s.closing.Load() {
		return
	}
	silent := now.Sub(time.Unix(0, s.lastSeen.Load()))
	fail, disc := s.cfg.FailedTimeout, s.cfg.DisconnectedTimeout
	switch {
	case fail > 0 && silent >= fail:
		s.failed = true
		s.state(StateFailed)
	case disc > 0 && silent >= disc:
		if !s.silent {
			s.silent = true
			s.state(StateDisconnected)
		}
	case s.silent:
		s.silent = false
		s.state(StateICEConnected)
	}
}

// Restart moves the session to new ICE credentials (an ICE restart, RFC
// 8445 §9): checks must now carry localUfrag and remoteUfrag and verify
// with localPwd; the old local ufrag is forgotten at once, and so are the
// client addresses learned from the old generation's checks but the
// selected one. DTLS, SRTP and SCTP continue, and media keeps going to the
// selected address until the new generation moves it ("Path selection").
// It fails with ErrClosed once the session is closed.
func (s *Session) Restart(localUfrag, localPwd, remoteUfrag string) error {
	if localUfrag == "" || localPwd == "" || remoteUfrag == "" {
		return errors.New("peer: an ICE restart needs local and remote credentials")
	}
	e := s.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.gone {
		return ErrClosed
	}
	old := s.cred.Load().localUfrag
	if _, dup := e.byUfrag[localUfrag]; dup && localUfrag != old {
		return errDuplicateUfrag
	}
	delete(e.byUfrag, old)
	e.byUfrag[localUfrag] = s
	sel := s.remote()
	kept := s.learned[:0]
	for _, a := range s.learned {
		if a == sel {
			kept = append(kept, a)
		} else if e.byAddr[a] == s {
			delete(e.byAddr, a)
		}
	}
	clear(s.learned[len(kept):])
	s.learned = kept
	s.cred.Store(&credentials{localUfrag: localUfrag, remoteUfrag: remoteUfrag, integrity: stun.NewShortTermIntegrity(localPwd)})
	return nil
}

// Close closes the session: the SCTP association, then DTLS with a
// close_notify alert (RFC 5246 §7.2.1) when the handshake completed; the
// Endpoint forgets the session's ufrag and addresses. It waits for the
// session's goroutine. Idempotent.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing.Store(true)
		assoc, conn, started := s.assoc, s.conn, s.started.Load()
		s.mu.Unlock()
		s.cancel()
		if assoc != nil {
			_ = assoc.Close() // closes conn too
		}
		if conn != nil {
			_ = conn.Close()
		}
		_ = s.dtls.Close()
		if s.sped != nil {
			s.sped.close()
		}
		s.e.forget(s)
		if started {
			<-s.done
		}
		// Return what waits for ReadRTP to the pool.
		for {
			select {
			case bp := <-s.rtpq:
				putBuf(bp)
				continue
			default:
			}
			break
		}
	})
	return nil
}

// Done is closed when the session is closed (Close).
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// run drives the session after its first authenticated check: the DTLS handshake,
// SRTP keys, then the SCTP association and its data channels until DTLS
// ends.
func (s *Session) run() {
	defer close(s.done)
	conn, err := s.handshake()
	if err != nil {
		if !s.closing.Load() {
			s.e.log.Debug("peer: DTLS handshake failed", "ufrag", s.ufrag(), "err", err)
			s.state(StateDTLSFailed)
		}
		return
	}
	s.dtlsAt.Store(time.Now().UnixNano())
	s.state(StateDTLSConnected)
	if err := s.startSRTP(conn); err != nil {
		if !s.closing.Load() {
			s.e.log.Debug("peer: SRTP keys", "ufrag", s.ufrag(), "err", err)
			s.state(StateDTLSFailed)
		}
		_ = conn.Close()
		return
	}
	s.state(StateConnected)
	if s.cfg.Data {
		s.serveSCTP(authConn{conn, s})
	}
	// Without data channels, or once the association is gone, read DTLS
	// until it closes: its reader must see the client's close_notify.
	ac := authConn{conn, s}
	bp := getBuf()
	for {
		if _, err := ac.Read(*bp); err != nil {
			break
		}
	}
	putBuf(bp)
	if !s.closing.Load() {
		s.state(StateClosed)
	}
}

// authConn is the session's DTLS connection as SCTP reads it: a record
// that the record layer returns has authenticated (its MAC or AEAD tag
// verified), so it refreshes the client's consent (RFC 7675 §5.1). The
// read loop does not refresh consent for DTLS: anyone can send a datagram
// from the client's address that looks like DTLS.
type authConn struct {
	*dtls.Conn
	s *Session
}

func (c authConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.s.seen()
	}
	return n, err
}
