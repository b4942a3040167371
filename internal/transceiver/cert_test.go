package transceiver

import (
	"testing"
	"time"
)

func TestCertsShareAndRotate(t *testing.T) {
	var c certs
	t0 := time.Now()
	a, err := c.get(t0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.get(t0.Add(certLifetime - time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("two sessions within a day got different certificates")
	}
	n, err := c.get(t0.Add(certLifetime))
	if err != nil {
		t.Fatal(err)
	}
	if a == n || string(a.fp.Digest) == string(n.fp.Digest) {
		t.Fatal("certificate not replaced after its lifetime")
	}
	if exp := n.expires; exp.Before(t0.Add(certLifetime + 7*24*time.Hour)) {
		t.Fatalf("new certificate expires %v, too soon for sessions started under it", exp)
	}
}

// BenchmarkCertificate compares a session's DTLS certificate cost: Pion's
// default (a new ECDSA P-256 key and self-signed certificate per peer
// connection) against the shared one.
func BenchmarkCertificate(b *testing.B) {
	b.Run("per-session", func(b *testing.B) {
		for b.Loop() {
			var c certs
			if _, err := c.get(time.Now()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("shared", func(b *testing.B) {
		var c certs
		for b.Loop() {
			if _, err := c.get(time.Now()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
