package bridge

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestV2WireExample checks the example of docs/bridge.md §12.2 byte for
// byte, both ways.
func TestV2WireExample(t *testing.T) {
	want := []byte{0xAC, 0x02, 0x01, 0x0B, 0x01, 0x00, 0x00, 0x07, 0x00, 0x00, 0x03, 0xC0, 0xAA, 0xBB, 0xCC}
	got := AppendRecord(nil, 300, RecordBinary, AppendAudioFrame(nil, AudioFrame{Seq: 7, Timestamp: 960, Payload: []byte{0xAA, 0xBB, 0xCC}}))
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendRecord: % X, want % X (bridge.md §12.2)", got, want)
	}
	r, rest, err := ParseRecord(want)
	if err != nil || len(rest) != 0 || r.Session != 300 || r.Kind != RecordBinary {
		t.Fatalf("ParseRecord: %+v, %d left, %v", r, len(rest), err)
	}
	f, err := ParseAudioFrame(r.Payload)
	if err != nil || f.Seq != 7 || f.Timestamp != 960 || !bytes.Equal(f.Payload, []byte{0xAA, 0xBB, 0xCC}) {
		t.Fatalf("ParseAudioFrame: %+v, %v", f, err)
	}
}

// TestClosePayload checks the close record payload of docs/bridge.md
// §12.3: code big endian, then at most 123 bytes of UTF-8 reason, cut on
// a rune boundary when writing, bounded and made valid when reading.
func TestClosePayload(t *testing.T) {
	if got := appendClosePayload(nil, 1000, "session.end"); !bytes.Equal(got, append([]byte{0x03, 0xE8}, "session.end"...)) {
		t.Errorf("appendClosePayload(1000, session.end) = % X", got)
	}
	// 61 two-byte runes (122 bytes) then one more: the cut falls inside
	// the 62nd rune, which is left out whole.
	long := strings.Repeat("é", 62)
	p := appendClosePayload(nil, 4003, long)
	if len(p) != 2+122 {
		t.Errorf("close payload of a 124-byte reason: %d bytes, want 124", len(p))
	}
	code, reason := parseClosePayload(p)
	if code != 4003 || reason != strings.Repeat("é", 61) {
		t.Errorf("parseClosePayload = %d %q", code, reason)
	}
	for _, tc := range []struct {
		name string
		p    []byte
		code uint16
		want string
	}{
		{"empty", nil, 1005, ""},
		{"one byte", []byte{0x03}, 1005, ""},
		{"code only", []byte{0x03, 0xEA}, 1002, ""},
		{"invalid UTF-8", []byte{0x03, 0xE8, 'a', 0xFF, 'b'}, 1000, "a\uFFFDb"},
	} {
		code, reason := parseClosePayload(tc.p)
		if code != tc.code || reason != tc.want {
			t.Errorf("%s: parseClosePayload = %d %q, want %d %q", tc.name, code, reason, tc.code, tc.want)
		}
	}
	// A peer's oversized reason (legal bytes, illegal length) is cut.
	big := append([]byte{0x03, 0xE8}, strings.Repeat("x", 1<<20)...)
	if _, reason := parseClosePayload(big); len(reason) > maxCloseReason || !utf8.ValidString(reason) {
		t.Errorf("parseClosePayload of a 1 MiB reason: %d bytes", len(reason))
	}
}
