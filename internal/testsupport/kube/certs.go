package kube

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the control plane's keys: one CA that signs the API server's
// serving certificate and the admin's client certificate, and the key
// that signs ServiceAccount tokens.
type pki struct {
	caPEM                     []byte
	serverCert, serverKey     string // files
	caFile                    string
	adminCertPEM, adminKeyPEM []byte
	saKey                     string // file: private key, signs and verifies tokens
	ca                        *x509.Certificate
	caKey                     crypto.Signer
}

func newPKI(dir string, ips []net.IP) (*pki, error) {
	p := &pki{}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "switchboard-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	p.ca, err = x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p.caKey = caKey
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	p.caFile = filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(p.caFile, p.caPEM, 0o600); err != nil {
		return nil, err
	}

	certPEM, keyPEM, err := p.issue(&x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  ips,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	p.serverCert, p.serverKey = filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key")
	if err := os.WriteFile(p.serverCert, certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.serverKey, keyPEM, 0o600); err != nil {
		return nil, err
	}
	// system:masters is the group the API server's RBAC lets do anything.
	p.adminCertPEM, p.adminKeyPEM, err = p.issue(&x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "switchboard-test-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	p.saKey = filepath.Join(dir, "sa.key")
	if err := os.WriteFile(p.saKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

// issue signs tmpl with the CA, for a new key; it returns both in PEM.
func (p *pki) issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
