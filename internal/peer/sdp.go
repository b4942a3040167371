package peer

import (
	"errors"
	"fmt"
)

// Fingerprint is one a=fingerprint (RFC 8122 §5): a hash function name, lower case
// ("sha-256"), and its digest.
type Fingerprint struct {
	// Hash is the hash function's name in the RFC 8122 §5 registry
	// ("sha-1", "sha-256", "sha-384", "sha-512", …).
	Hash string
	// Digest is the certificate's digest as raw bytes (32 for sha-256),
	// not the colon-separated hex of the SDP line.
	Digest []byte
}

// String returns f as an a=fingerprint value: the hash function, a space,
// and the digest as upper-case hex bytes separated by colons (RFC 8122 §5),
// e.g. "sha-256 AB:CD:…".
func (f Fingerprint) String() string {
	const digits = "0123456789ABCDEF"
	b := make([]byte, 0, len(f.Hash)+3*len(f.Digest))
	b = append(b, f.Hash...)
	for i, c := range f.Digest {
		sep := byte(':')
		if i == 0 {
			sep = ' '
		}
		b = append(b, sep, digits[c>>4], digits[c&0x0f])
	}
	return string(b)
}

// fingerprintLen is the digest length in bytes of each hash function an
// a=fingerprint may name (RFC 8122 §5) that DTLS certificate checks
// support.
var fingerprintLen = map[string]int{
	"sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48, "sha-512": 64, "md5": 16,
}

// checkICECredentials checks an ICE ufrag and pwd against RFC 8839 §5.4:
// ufrag = 4*256ice-char, pwd = 22*256ice-char.
func checkICECredentials(ufrag, pwd string) error {
	switch {
	case ufrag == "" || pwd == "":
		return errors.New("no a=ice-ufrag and a=ice-pwd: ICE needs the client's credentials (RFC 8839 §5.4)")
	case len(ufrag) < 4 || len(ufrag) > 256 || !isICEChars(ufrag):
		return fmt.Errorf("a=ice-ufrag:%s is not 4-256 characters of A-Z, a-z, 0-9, + and / (RFC 8839 §5.4)", ufrag)
	case len(pwd) < 22 || len(pwd) > 256 || !isICEChars(pwd):
		return fmt.Errorf("a=ice-pwd is %d characters, or has characters other than A-Z, a-z, 0-9, + and /; want 22-256 of them (RFC 8839 §5.4)", len(pwd))
	}
	return nil
}

// isICEChars reports whether s is all ice-char (RFC 8839 §5.4).
func isICEChars(s string) bool {
	for i := range len(s) {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}
