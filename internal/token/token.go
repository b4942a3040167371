// Package token mints and opens Switchboard routing tokens: the server ICE
// ufrag that tells a relay which cluster and which transceiver own a session.
//
// A token is 24 bytes written as 32 characters of the standard base64
// alphabet without padding. That alphabet is exactly the ICE character set
// (RFC 8445 §5.3: ALPHA / DIGIT / "+" / "/"), so a token is a valid ufrag.
//
//	byte 0      header: bits 7-6 format version (0), bits 5-0 key id (0-63)
//	bytes 1-16  C = AES-128(kEnc, P), one block
//	bytes 17-23 T = first 7 bytes of AES-128(kMac, C)
//
// with the 16-byte plaintext P
//
//	bytes 0-1   cluster id, big endian
//	bytes 2-5   transceiver id, big endian
//	bytes 6-9   issue time, minutes since the Unix epoch, big endian
//	bytes 10-15 nonce, 48 random bits
//
// C hides the ids (a client cannot read them) and T authenticates C
// (encrypt-then-MAC, with AES as a PRF over a single fixed-length block), so
// a client cannot forge a token or aim one at a host of its choosing: a
// random guess passes with probability 2^-56. kEnc and kMac are derived from
// the fleet secret of the key id with HKDF-SHA256 (RFC 5869). The design
// follows the single-pass encryption idea of QUIC-LB
// (draft-ietf-quic-load-balancers) with an explicit tag added, since a ufrag,
// unlike a connection id, has room for one. The full specification, with key
// rotation, is docs/token.md.
package token

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

const (
	// Len is the length of a token in characters; every token has exactly this length.
	Len = 32
	// rawLen is the decoded length in bytes.
	rawLen = 24
	// tagLen is the length of the authentication tag in bytes.
	tagLen = 7
	// Version is the token format version carried in the header byte.
	Version = 0
	// MaxKeyID is the largest key id a header can carry.
	MaxKeyID = 63
	// MinSecretLen is the shortest fleet secret accepted, in bytes.
	MinSecretLen = 16
)

// Errors returned by Open. They are returned unwrapped so that the relay can
// compare them without allocating.
var (
	// ErrMalformed: wrong length, a character outside the ICE alphabet, or an
	// unknown format version.
	ErrMalformed = errors.New("token: malformed")
	// ErrUnknownKey: the key id is not in the keyring (retired or never known).
	ErrUnknownKey = errors.New("token: unknown key id")
	// ErrForged: the tag does not match; the token was not sealed by the fleet.
	ErrForged = errors.New("token: authentication failed")
	// ErrExpired: the token is older than the keyring's MaxAge, or issued in the future.
	ErrExpired = errors.New("token: expired")
)

var enc = base64.RawStdEncoding

// Claims is what a token carries.
type Claims struct {
	// Cluster is the id of the cluster that owns the session (Global Relays route on it).
	Cluster uint16
	// Transceiver is the id of the owning transceiver within its cluster;
	// relays resolve it through their membership table.
	Transceiver uint32
	// IssuedMinute is the issue time in whole minutes since the Unix epoch.
	IssuedMinute uint32
}

// Key is one fleet key: an id that travels in the token header and a secret
// shared by every transceiver and relay of the fleet.
type Key struct {
	ID     uint8
	Secret []byte
}

type sealKey struct {
	enc cipher.Block
	mac cipher.Block
}

// Keyring holds the key used to mint tokens and every key accepted when
// opening them (during rotation, the current and the previous one). It is
// immutable after construction and safe for concurrent use.
type Keyring struct {
	current uint8
	keys    [MaxKeyID + 1]*sealKey
	// MaxAge bounds a token's age at Open; zero means no bound. Set it
	// before sharing the keyring.
	MaxAge time.Duration
}

// NewKeyring returns a keyring that mints with current and opens tokens
// sealed with current or any of accepted. It fails on a key id above
// MaxKeyID, a secret shorter than MinSecretLen, or two keys with one id.
func NewKeyring(current Key, accepted ...Key) (*Keyring, error) {
	k := &Keyring{current: current.ID}
	for _, key := range append([]Key{current}, accepted...) {
		if key.ID > MaxKeyID {
			return nil, fmt.Errorf("token: key id %d is above %d", key.ID, MaxKeyID)
		}
		if len(key.Secret) < MinSecretLen {
			return nil, fmt.Errorf("token: key %d: secret is %d bytes, need at least %d", key.ID, len(key.Secret), MinSecretLen)
		}
		if k.keys[key.ID] != nil {
			return nil, fmt.Errorf("token: key id %d given twice", key.ID)
		}
		sk, err := deriveKey(key)
		if err != nil {
			return nil, err
		}
		k.keys[key.ID] = sk
	}
	return k, nil
}

func deriveKey(key Key) (*sealKey, error) {
	var blocks [2]cipher.Block
	for i, label := range []string{"switchboard token v0 enc", "switchboard token v0 mac"} {
		b, err := hkdf.Key(sha256.New, key.Secret, nil, label, 16)
		if err != nil {
			return nil, fmt.Errorf("token: key %d: %w", key.ID, err)
		}
		if blocks[i], err = aes.NewCipher(b); err != nil {
			return nil, fmt.Errorf("token: key %d: %w", key.ID, err)
		}
	}
	return &sealKey{enc: blocks[0], mac: blocks[1]}, nil
}

// CurrentKeyID returns the id of the key that Seal uses.
func (k *Keyring) CurrentKeyID() uint8 { return k.current }

// Seal mints a token for c with the current key, a fresh nonce from rand
// (crypto/rand.Reader in production) and c.IssuedMinute as given (see
// MinuteOf). It returns the 32-character ufrag.
func (k *Keyring) Seal(c Claims, rand io.Reader) (string, error) {
	var p [16]byte
	binary.BigEndian.PutUint16(p[0:2], c.Cluster)
	binary.BigEndian.PutUint32(p[2:6], c.Transceiver)
	binary.BigEndian.PutUint32(p[6:10], c.IssuedMinute)
	if _, err := io.ReadFull(rand, p[10:16]); err != nil {
		return "", fmt.Errorf("token: nonce: %w", err)
	}
	sk := k.keys[k.current]
	var raw [rawLen]byte
	raw[0] = Version<<6 | k.current
	sk.enc.Encrypt(raw[1:17], p[:])
	var t [16]byte
	sk.mac.Encrypt(t[:], raw[1:17])
	copy(raw[17:], t[:tagLen])
	return enc.EncodeToString(raw[:]), nil
}

// MinuteOf converts t to the minute count carried in Claims.IssuedMinute.
func MinuteOf(t time.Time) uint32 { return uint32(t.Unix() / 60) }

// Open authenticates and decodes a token. ufrag is the server ufrag alone
// (the part of a STUN USERNAME before the colon); it is only read, never
// retained. now is used only when MaxAge is set. Open allocates nothing and
// returns one of the package's sentinel errors unwrapped.
func (k *Keyring) Open(ufrag []byte, now time.Time) (Claims, error) {
	if len(ufrag) != Len {
		return Claims{}, ErrMalformed
	}
	// The block cipher is an interface, so buffers handed to it escape; a
	// pooled scratch keeps Open free of allocations.
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	if n, err := enc.Decode(s.raw[:], ufrag); err != nil || n != rawLen {
		return Claims{}, ErrMalformed
	}
	if s.raw[0]>>6 != Version {
		return Claims{}, ErrMalformed
	}
	sk := k.keys[s.raw[0]&MaxKeyID]
	if sk == nil {
		return Claims{}, ErrUnknownKey
	}
	sk.mac.Encrypt(s.tag[:], s.raw[1:17])
	if subtle.ConstantTimeCompare(s.tag[:tagLen], s.raw[17:]) != 1 {
		return Claims{}, ErrForged
	}
	sk.enc.Decrypt(s.plain[:], s.raw[1:17])
	c := Claims{
		Cluster:      binary.BigEndian.Uint16(s.plain[0:2]),
		Transceiver:  binary.BigEndian.Uint32(s.plain[2:6]),
		IssuedMinute: binary.BigEndian.Uint32(s.plain[6:10]),
	}
	if k.MaxAge > 0 {
		age := now.Unix()/60 - int64(c.IssuedMinute)
		// One minute of slack each way for clock skew across the fleet.
		if age < -1 || age > int64(k.MaxAge/time.Minute)+1 {
			return Claims{}, ErrExpired
		}
	}
	return c, nil
}

type scratch struct {
	raw   [rawLen]byte
	tag   [16]byte
	plain [16]byte
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}
