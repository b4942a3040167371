package logbuf

import (
	"fmt"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConcurrentWriters(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				fmt.Fprintf(&b, "w%d line %d\n", i, j)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := b.Count("\n"); n != 800 {
		t.Fatalf("%d lines, want 800", n)
	}
	if n := b.Count("w3 line"); n != 100 {
		t.Fatalf("%d lines of writer 3, want 100", n)
	}
}

func TestMaxTailReset(t *testing.T) {
	b := Buffer{Max: 10}
	for _, s := range []string{"12345", "67890", "x"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := b.String(); got != "1234567890" {
		t.Fatalf("kept %q, want the first 10 bytes", got)
	}
	if got := b.Tail(4); got != "…7890" {
		t.Fatalf("Tail(4) = %q", got)
	}
	if got := b.Tail(40); got != "1234567890" {
		t.Fatalf("Tail(40) = %q", got)
	}
	b.Reset()
	if b.String() != "" {
		t.Fatal("Reset left bytes")
	}
}

func TestJSONField(t *testing.T) {
	var b Buffer
	if _, ok := b.JSONField("http listening", "addr"); ok {
		t.Fatal("found a field in an empty buffer")
	}
	_, _ = b.Write([]byte("plain text, not JSON\n" +
		`{"time":"t","level":"INFO","msg":"relay running","public":"127.0.0.1:5000","members":1}` + "\n" +
		`{"time":"t","level":"INFO","msg":"http listening","addr":"127.0.0.1:4001"}` + "\n" +
		`{"time":"t","level":"INFO","msg":"http listening","addr":"127.0.0.1:4002"}` + "\n"))
	for _, tt := range []struct {
		name, msg, key, want string
		ok                   bool
	}{
		{"first of two", "http listening", "addr", "127.0.0.1:4001", true},
		{"other record", "relay running", "public", "127.0.0.1:5000", true},
		{"not a string", "relay running", "members", "", false},
		{"no such field", "relay running", "internal", "", false},
		{"no such msg", "transceiver running", "hop", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got, ok := b.JSONField(tt.msg, tt.key); got != tt.want || ok != tt.ok {
				t.Errorf("JSONField(%q, %q) = %q, %v; want %q, %v", tt.msg, tt.key, got, ok, tt.want, tt.ok)
			}
		})
	}
}
