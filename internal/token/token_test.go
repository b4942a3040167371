package token

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testKey(id uint8, fill byte) Key {
	return Key{ID: id, Secret: bytes.Repeat([]byte{fill}, 32)}
}

func mustKeyring(t testing.TB, cur Key, acc ...Key) *Keyring {
	t.Helper()
	k, err := NewKeyring(cur, acc...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func isICEChar(r rune) bool {
	return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '+' || r == '/'
}

func TestSealOpenRoundTrip(t *testing.T) {
	k := mustKeyring(t, testKey(5, 1))
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		c    Claims
	}{
		{"zero", Claims{}},
		{"typical", Claims{Cluster: 2, Transceiver: 17, IssuedMinute: MinuteOf(now)}},
		{"max", Claims{Cluster: 0xffff, Transceiver: 0xffffffff, IssuedMinute: 0xffffffff}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := k.Seal(tt.c, rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			if len(u) != Len {
				t.Fatalf("len %d, want %d", len(u), Len)
			}
			for _, r := range u {
				if !isICEChar(r) {
					t.Fatalf("ufrag %q has non-ICE character %q", u, r)
				}
			}
			got, err := k.Open([]byte(u), now)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.c {
				t.Fatalf("got %+v, want %+v", got, tt.c)
			}
		})
	}
}

func TestTokensAreOpaqueAndFresh(t *testing.T) {
	k := mustKeyring(t, testKey(0, 1))
	c := Claims{Cluster: 1, Transceiver: 1}
	seen := map[string]bool{}
	for range 1000 {
		u, err := k.Seal(c, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if seen[u] {
			t.Fatalf("token %q minted twice for the same claims", u)
		}
		seen[u] = true
	}
}

func TestOpenRejects(t *testing.T) {
	k := mustKeyring(t, testKey(1, 1))
	other := mustKeyring(t, testKey(1, 2)) // same id, different secret
	retired := mustKeyring(t, testKey(9, 1))
	now := time.Now()
	good, _ := k.Seal(Claims{Cluster: 3, Transceiver: 4, IssuedMinute: MinuteOf(now)}, rand.Reader)
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	wrongKey, _ := other.Seal(Claims{Cluster: 3, Transceiver: 4}, rand.Reader)
	retiredKey, _ := retired.Seal(Claims{Cluster: 3, Transceiver: 4}, rand.Reader)
	versioned := []byte(good)
	versioned[0] = 'w' // top bits of byte 0 become non-zero: unknown version
	tests := []struct {
		name  string
		ufrag string
		want  error
	}{
		{"empty", "", ErrMalformed},
		{"short", good[:31], ErrMalformed},
		{"long", good + "A", ErrMalformed},
		{"four chars", "abcd", ErrMalformed},
		{"bad alphabet", strings.Repeat("-", Len), ErrMalformed},
		{"newline inside", good[:10] + "\n" + good[11:], ErrMalformed},
		{"padding", good[:30] + "==", ErrMalformed},
		{"unknown version", string(versioned), ErrMalformed},
		{"flipped ciphertext", flip(good, 5), ErrForged},
		{"flipped tag", flip(good, 30), ErrForged},
		{"wrong secret", wrongKey, ErrForged},
		{"retired key id", retiredKey, ErrUnknownKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := k.Open([]byte(tt.ufrag), now); !errors.Is(err, tt.want) {
				t.Fatalf("Open(%q) = %v, want %v", tt.ufrag, err, tt.want)
			}
		})
	}
}

func TestRotation(t *testing.T) {
	oldKey, newKey := testKey(1, 1), testKey(2, 2)
	before := mustKeyring(t, oldKey)
	during := mustKeyring(t, newKey, oldKey) // mints with new, accepts both
	after := mustKeyring(t, newKey)          // old key retired
	c := Claims{Cluster: 1, Transceiver: 2}
	minted, _ := before.Seal(c, rand.Reader)
	fresh, _ := during.Seal(c, rand.Reader)
	if _, err := during.Open([]byte(minted), time.Now()); err != nil {
		t.Fatalf("token minted before rotation: %v", err)
	}
	if _, err := during.Open([]byte(fresh), time.Now()); err != nil {
		t.Fatalf("token minted after rotation: %v", err)
	}
	if _, err := after.Open([]byte(minted), time.Now()); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("retired key: got %v, want ErrUnknownKey", err)
	}
	if during.CurrentKeyID() != 2 {
		t.Fatalf("current key id %d, want 2", during.CurrentKeyID())
	}
}

func TestMaxAge(t *testing.T) {
	k := mustKeyring(t, testKey(0, 1))
	k.MaxAge = time.Hour
	now := time.Now()
	tests := []struct {
		name   string
		issued time.Time
		want   error
	}{
		{"now", now, nil},
		{"59 minutes", now.Add(-59 * time.Minute), nil},
		{"three hours", now.Add(-3 * time.Hour), ErrExpired},
		{"future", now.Add(10 * time.Minute), ErrExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, _ := k.Seal(Claims{IssuedMinute: MinuteOf(tt.issued)}, rand.Reader)
			if _, err := k.Open([]byte(u), now); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestNewKeyringErrors(t *testing.T) {
	tests := []struct {
		name string
		cur  Key
		acc  []Key
	}{
		{"id too large", Key{ID: 64, Secret: make([]byte, 32)}, nil},
		{"short secret", Key{ID: 1, Secret: make([]byte, 8)}, nil},
		{"duplicate id", testKey(1, 1), []Key{testKey(1, 2)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewKeyring(tt.cur, tt.acc...); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestOpenAllocatesNothing(t *testing.T) {
	k := mustKeyring(t, testKey(0, 1))
	k.MaxAge = time.Hour
	now := time.Now()
	u, _ := k.Seal(Claims{Cluster: 1, Transceiver: 2, IssuedMinute: MinuteOf(now)}, rand.Reader)
	good := []byte(u)
	bad := []byte(u)
	bad[3] ^= 1
	for _, b := range [][]byte{good, bad, []byte("xx")} {
		if n := testing.AllocsPerRun(1000, func() { _, _ = k.Open(b, now) }); n != 0 {
			t.Fatalf("Open(%q) allocates %v times", b, n)
		}
	}
}

func FuzzOpen(f *testing.F) {
	k, _ := NewKeyring(testKey(0, 1))
	u, _ := k.Seal(Claims{Cluster: 1, Transceiver: 2}, rand.Reader)
	f.Add([]byte(u))
	f.Add([]byte(""))
	f.Add([]byte(strings.Repeat("A", Len)))
	f.Add([]byte(u[:16] + "\r\n" + u[18:]))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := k.Open(b, time.Time{})
		if err != nil {
			return
		}
		// Anything that opens must be a canonical token that re-seals to the same claims.
		if len(b) != Len {
			t.Fatalf("opened a %d-byte token", len(b))
		}
		u2, err := k.Seal(c, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := k.Open([]byte(u2), time.Time{})
		if err != nil || c2 != c {
			t.Fatalf("re-seal: %+v %v, want %+v", c2, err, c)
		}
	})
}

func BenchmarkOpen(b *testing.B) {
	k, _ := NewKeyring(testKey(0, 1))
	u, _ := k.Seal(Claims{Cluster: 1, Transceiver: 2}, rand.Reader)
	ufrag := []byte(u)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Open(ufrag, now); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSeal(b *testing.B) {
	k, _ := NewKeyring(testKey(0, 1))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Seal(Claims{Cluster: 1, Transceiver: 2}, rand.Reader); err != nil {
			b.Fatal(err)
		}
	}
}
