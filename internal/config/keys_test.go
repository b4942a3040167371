package config

import (
	"strings"
	"testing"
	"time"
)

// TestKeyringMaxAge: -token-max-age reaches the keyring, so relays drop old tokens.
func TestKeyringMaxAge(t *testing.T) {
	key := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false},
		{"0", 0, false},
		{"24h", 24 * time.Hour, false},
		{"-1h", 0, true},
		{"soon", 0, true},
	} {
		k := Keys{Key: key, MaxAge: tc.in}
		kr, err := k.Keyring()
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), "-token-max-age") {
				t.Errorf("%q: err %v, want one naming -token-max-age", tc.in, err)
			}
			continue
		}
		if err != nil || kr.MaxAge != tc.want {
			t.Errorf("%q: MaxAge %v (%v), want %v", tc.in, kr.MaxAge, err, tc.want)
		}
	}
}
