package peer

import (
	"bytes"
	"context"
	"crypto"
	_ "crypto/sha1" // a=fingerprint hash functions (RFC 8122 §5)
	_ "crypto/sha256"
	_ "crypto/sha512"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pion/dtls/v4"
	"github.com/pion/dtls/v4/pkg/crypto/elliptic"
	"github.com/pion/dtls/v4/pkg/protocol"
	"github.com/pion/srtp/v3"
)

// DTLS-SRTP (RFC 5763, RFC 5764).
//
// The session's DTLS connection runs over its feed (feed.go) with the
// session's certificate, DTLS 1.2 (RFC 6347) or, up to Config.DTLSVersion,
// 1.3 (RFC 9147), offering the SRTP protection profiles Pion
// offers (AEAD AES-256-GCM, AEAD AES-128-GCM, AES-128-CM-HMAC-SHA1-80, RFC
// 7714 and RFC 5764 §4.1.2) and asking for the extended master secret (RFC
// 7627). The client's certificate is self-signed; it is trusted only when it
// matches the offer's fingerprint of the strongest hash function offered
// (RFC 8122 §5; SHA-1 and SHA-2 only, MD5 is not accepted). After the
// handshake, the SRTP master keys and salts come from the DTLS exporter
// (RFC 5764 §4.2), the client-write half for whichever side is the DTLS
// client.

var (
	errNoCertificate       = errors.New("peer: the client sent no DTLS certificate")
	errFingerprintMismatch = errors.New("peer: the client's DTLS certificate matches no fingerprint of the offer")
	errNoSRTPProfile       = errors.New("peer: DTLS negotiated no SRTP protection profile")
)

// srtpProfiles are the profiles offered, most preferred first.
var srtpProfiles = []dtls.SRTPProtectionProfile{
	dtls.SRTP_AEAD_AES_256_GCM,
	dtls.SRTP_AEAD_AES_128_GCM,
	dtls.SRTP_AES128_CM_HMAC_SHA1_80,
}

// Key exchange groups, most preferred first (above): the server's, the
// client's.
var (
	dtlsServerGroups = []elliptic.Curve{elliptic.X25519, elliptic.P256, elliptic.P384, elliptic.X25519MLKEM768}
	dtlsClientGroups = []elliptic.Curve{elliptic.X25519, elliptic.P256, elliptic.P384}
)

// replayWindow is the SRTP and SRTCP replay window, in packets (RFC 3711
// §3.3.2 asks for at least 64), as Pion's SRTP sessions keep.
const replayWindow = 64

// srtpKeys are a session's SRTP contexts: local encrypts (under
// Session.wmu), remote decrypts (the read loop alone).
type srtpKeys struct {
	local, remote *srtp.Context
}

// handshake runs the DTLS handshake in the session's role.
func (s *Session) handshake() (*dtls.Conn, error) {
	e := s.e
	shared := []dtls.Option{
		dtls.WithCertificates(s.cfg.Certificate),
		dtls.WithSRTPProtectionProfiles(srtpProfiles...),
		dtls.WithExtendedMasterSecret(dtls.RequestExtendedMasterSecret),
		// The chain is not verified: the certificate is self-signed and
		// checked against the offer's fingerprints instead.
		dtls.WithInsecureSkipVerify(true),
		dtls.WithVerifyPeerCertificate(s.verifyCertificate),
		dtls.WithLoggerFactory(e.cfg.LoggerFactory),
		// The library retransmits every interval; the feed's pacing
		// decides which go (feed.go, "Retransmission pacing").
		dtls.WithFlightInterval(s.flightInterval()),
		dtls.WithDisableRetransmitBackoff(true),
		dtls.WithMinVersion(protocol.Version1_2),
	}
	if s.cfg.SPED {
		// Each datagram must fit in a Binding message (sped.go).
		shared = append(shared, dtls.WithMaxVersion(protocol.Version1_3), dtls.WithMTU(spedMTU))
	} else {
		shared = append(shared, dtls.WithMaxVersion(e.cfg.DTLSVersion.protocol()))
	}
	var conn *dtls.Conn
	var err error
	s.dtls.rtx.start(s.flightInterval())
	raddr := udpAddr(s.remote())
	if s.cfg.Role == DTLSClient {
		opts := make([]dtls.ClientOption, 0, len(shared))
		for _, o := range shared {
			opts = append(opts, o)
		}
		opts = append(opts, dtls.WithEllipticCurves(dtlsClientGroups...))
		conn, err = dtls.Client(s.dtls, raddr, opts...)
	} else {
		opts := make([]dtls.ServerOption, 0, len(shared)+2)
		for _, o := range shared {
			opts = append(opts, o)
		}
		// The skip covers DTLS 1.2's HelloVerifyRequest and DTLS 1.3's
		// cookie HelloRetryRequest alike (RFC 9147 §5.1).
		opts = append(opts, dtls.WithClientAuth(dtls.RequireAnyClientCert), dtls.WithInsecureSkipVerifyHello(e.cfg.InsecureSkipHelloVerify),
			dtls.WithEllipticCurves(dtlsServerGroups...))
		conn, err = dtls.Server(s.dtls, raddr, opts...)
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		_ = conn.Close()
		return nil, ErrClosed
	}
	s.conn = conn
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandshakeTimeout)
	err = conn.HandshakeContext(ctx)
	cancel()
	s.dtls.handshaken()
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if st, ok := conn.ConnectionState(); ok {
		s.dtlsVersion.Store(uint32(versionOf(st.NegotiatedVersion())))
	}
	return conn, nil
}

// Retransmission (RFC 6347 §4.2.4).
//
// RFC 6347 suggests 1 s for the first retransmission, doubling, as it
// cannot know the path. The session can: the first authenticated check
// comes a round trip and the client's processing after the answer left
// (Session.Answered, Session.SetupRTT), so that time bounds the round trip
// from above, before any DTLS. The handshake's retransmission timeout is
// 2.5 times it, within [minFlightInterval, maxFlightInterval]: the first
// flight may wait two round trips for its answer, as a client whose DTLS
// starts only once its own ICE is connected (Pion) keeps the ClientHello
// through the round trip of its nomination, and a shorter timeout
// retransmits that ClientHello for nothing. A flight that is not answered
// goes again after the timeout, then after twice it, and every twice it
// after that, 16 times at most (feed.go, "Retransmission pacing"); the next
// flight starts from the timeout again, and HandshakeTimeout bounds the
// whole. What it saves under loss, and the designs measured on the way:
// docs/benchmarks.md, "Under loss".

// Bounds of the first retransmission timeout.
const (
	minFlightInterval = 50 * time.Millisecond
	maxFlightInterval = time.Second
)

// flightInterval is the DTLS handshake's retransmission timeout: 2.5 ×
// SetupRTT within the bounds, or maxFlightInterval without it.
func (s *Session) flightInterval() time.Duration {
	if s.flightFixed > 0 {
		return s.flightFixed
	}
	rtt, ok := s.SetupRTT()
	if !ok {
		return maxFlightInterval
	}
	return min(max(rtt*5/2, minFlightInterval), maxFlightInterval)
}

// fingerprintHashes are the a=fingerprint hash functions accepted, by
// their SDP names (RFC 8122 §5; RFC 8827 §6.5 requires SHA-256).
var fingerprintHashes = map[string]crypto.Hash{
	"sha-1":   crypto.SHA1,
	"sha-224": crypto.SHA224,
	"sha-256": crypto.SHA256,
	"sha-384": crypto.SHA384,
	"sha-512": crypto.SHA512,
}

// strongestHash returns the strongest accepted hash function among fps
// (crypto.Hash numbers the SHA family in increasing strength), or 0.
func strongestHash(fps []Fingerprint) crypto.Hash {
	var best crypto.Hash
	for _, fp := range fps {
		if h, ok := fingerprintHashes[strings.ToLower(fp.Hash)]; ok && h.Available() && h > best {
			best = h
		}
	}
	return best
}

// verifyCertificate checks the client's certificate against the offer's
// fingerprints of the strongest hash function among them (RFC 8122 §5:
// one of the others may not be trusted to bind the certificate).
func (s *Session) verifyCertificate(raw [][]byte, _ [][]*x509.Certificate) error {
	if len(raw) == 0 {
		return errNoCertificate
	}
	cert, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return err
	}
	h := strongestHash(s.cfg.Fingerprints)
	if h == 0 {
		return errFingerprintMismatch
	}
	d := h.New()
	d.Write(cert.Raw)
	sum := d.Sum(nil)
	for _, fp := range s.cfg.Fingerprints {
		if fingerprintHashes[strings.ToLower(fp.Hash)] == h && bytes.Equal(sum, fp.Digest) {
			return nil
		}
	}
	return errFingerprintMismatch
}

// startSRTP derives the session's SRTP contexts from the handshake.
func (s *Session) startSRTP(conn *dtls.Conn) error {
	dp, ok := conn.SelectedSRTPProtectionProfile()
	if !ok {
		return errNoSRTPProfile
	}
	var profile srtp.ProtectionProfile
	switch dp {
	case dtls.SRTP_AEAD_AES_256_GCM:
		profile = srtp.ProtectionProfileAeadAes256Gcm
	case dtls.SRTP_AEAD_AES_128_GCM:
		profile = srtp.ProtectionProfileAeadAes128Gcm
	case dtls.SRTP_AES128_CM_HMAC_SHA1_80:
		profile = srtp.ProtectionProfileAes128CmHmacSha1_80
	default:
		return fmt.Errorf("%w: %v", errNoSRTPProfile, dp)
	}
	state, ok := conn.ConnectionState()
	if !ok {
		return errors.New("peer: DTLS connection state unavailable")
	}
	cfg := srtp.Config{Profile: profile}
	if err := cfg.ExtractSessionKeysFromDTLS(&state, s.cfg.Role == DTLSClient); err != nil {
		return err
	}
	local, err := srtp.CreateContext(cfg.Keys.LocalMasterKey, cfg.Keys.LocalMasterSalt, profile)
	if err != nil {
		return err
	}
	remote, err := srtp.CreateContext(cfg.Keys.RemoteMasterKey, cfg.Keys.RemoteMasterSalt, profile,
		srtp.SRTPReplayProtection(replayWindow), srtp.SRTCPReplayProtection(replayWindow))
	if err != nil {
		return err
	}
	s.setKeys(&srtpKeys{local: local, remote: remote})
	return nil
}
