package transceiver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/pion/dtls/v3/pkg/crypto/selfsign"

	"github.com/switchboard-rtc/switchboard/internal/peer"
)

// certLifetime is how long one DTLS certificate serves new sessions
// before the next one is made. The certificates are valid for a month
// (selfsign's default); a session keeps the certificate it started with.
const certLifetime = 24 * time.Hour

// certificate is a DTLS certificate and its SHA-256 fingerprint, which
// answers carry (RFC 8122 §5).
type certificate struct {
	tls     tls.Certificate
	fp      peer.Fingerprint
	expires time.Time
}

// certs holds the DTLS certificate new sessions share. A WebRTC
// certificate is self-signed and authenticated only by the fingerprint in
// the SDP (RFC 8827 §6.5, RFC 8122), so one certificate for many sessions
// is as safe as one each: what it saves is an ECDSA key generation and a
// signature per session, and the certificate's memory. Its cost is that a
// client can tell two sessions reached the same transceiver on the same
// day, which the answer's candidate says anyway.
type certs struct {
	mu   sync.Mutex
	cur  *certificate
	made time.Time
}

// get returns the current certificate, making a new one (ECDSA P-256,
// as Pion and browsers default to) when none is younger than
// certLifetime.
func (c *certs) get(now time.Time) (*certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && now.Sub(c.made) < certLifetime {
		return c.cur, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("transceiver: DTLS key: %w", err)
	}
	cert, err := selfsign.SelfSign(key)
	if err != nil {
		return nil, fmt.Errorf("transceiver: DTLS certificate: %w", err)
	}
	x, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("transceiver: DTLS certificate: %w", err)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	c.cur = &certificate{tls: cert, fp: peer.Fingerprint{Hash: "sha-256", Digest: sum[:]}, expires: x.NotAfter}
	c.made = now
	return c.cur, nil
}
