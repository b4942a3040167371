package transceiver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"sync"
	"time"

	"github.com/pion/webrtc/v4"
)

// certLifetime is how long one DTLS certificate serves new sessions
// before the next one is made. Pion's certificates are valid for a month;
// a session keeps the certificate it started with.
const certLifetime = 24 * time.Hour

// certs holds the DTLS certificate new sessions share. A WebRTC
// certificate is self-signed and authenticated only by the fingerprint in
// the SDP (RFC 8827 §6.5, RFC 8122), so one certificate for many sessions
// is as safe as one each: what it saves is an ECDSA key generation and a
// signature per session, and the certificate's memory. Its cost is that a
// client can tell two sessions reached the same transceiver on the same
// day, which the answer's candidate says anyway.
type certs struct {
	mu   sync.Mutex
	cur  *webrtc.Certificate
	made time.Time
}

// get returns the current certificate, making a new one (ECDSA P-256,
// as Pion and browsers default to) when none is younger than
// certLifetime.
func (c *certs) get(now time.Time) (webrtc.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && now.Sub(c.made) < certLifetime {
		return *c.cur, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return webrtc.Certificate{}, fmt.Errorf("transceiver: DTLS key: %w", err)
	}
	cert, err := webrtc.GenerateCertificate(key)
	if err != nil {
		return webrtc.Certificate{}, fmt.Errorf("transceiver: DTLS certificate: %w", err)
	}
	c.cur, c.made = cert, now
	return *cert, nil
}

// peerConfig is the configuration of every session's peer connection:
// the shared certificate.
func (s *Server) peerConfig() (webrtc.Configuration, error) {
	cert, err := s.certs.get(time.Now())
	if err != nil {
		return webrtc.Configuration{}, err
	}
	return webrtc.Configuration{Certificates: []webrtc.Certificate{cert}}, nil
}
