package hop

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHeaderRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		client  netip.AddrPort
		wantLen int
		want    netip.AddrPort
	}{
		{"ipv4", netip.MustParseAddrPort("203.0.113.7:50000"), HeaderLenV4, netip.MustParseAddrPort("203.0.113.7:50000")},
		{"ipv6", netip.MustParseAddrPort("[2001:db8::1]:3478"), HeaderLenV6, netip.MustParseAddrPort("[2001:db8::1]:3478")},
		{"ipv4-mapped is written as ipv4", netip.MustParseAddrPort("[::ffff:198.51.100.2]:1"), HeaderLenV4, netip.MustParseAddrPort("198.51.100.2:1")},
		{"max port", netip.MustParseAddrPort("127.0.0.1:65535"), HeaderLenV4, netip.MustParseAddrPort("127.0.0.1:65535")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := []byte{0x00, 0x01, 0x02}
			b := append(AppendHeader(nil, TypeData, tt.client), payload...)
			if got := len(b) - len(payload); got != tt.wantLen || HeaderLen(tt.client.Addr()) != tt.wantLen {
				t.Fatalf("header length %d, want %d", got, tt.wantLen)
			}
			typ, client, p, err := ParseHeader(b)
			if err != nil {
				t.Fatal(err)
			}
			if typ != TypeData || client != tt.want || !bytes.Equal(p, payload) {
				t.Fatalf("got %v %v %x", typ, client, p)
			}
		})
	}
}

func TestParseHeaderRejects(t *testing.T) {
	good := AppendHeader(nil, TypeData, netip.MustParseAddrPort("192.0.2.1:9"))
	mut := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrShort},
		{"short", good[:9], ErrShort},
		{"magic", mut(0, 0x00), ErrMagic},
		{"version", mut(1, 0x21), ErrVersion},
		{"type", mut(1, 0x1f), ErrType},
		{"type 0", mut(1, 0x10), ErrType},
		{"type 3", mut(1, 0x13), ErrType},
		{"family", mut(2, 5), ErrFamily},
		{"short v6", mut(2, 6), ErrShort},
		{"port zero", mut(5, 0), ErrAddress},
		{"unspecified", append([]byte{Magic, 0x11, 4, 0, 0, 9}, 0, 0, 0, 0), ErrAddress},
		{"ipv4-mapped in an ipv6 header", append([]byte{Magic, 0x11, 6, 0, 0, 9}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1), ErrAddress},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, _, err := ParseHeader(tt.b); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestHeaderAllocatesNothing(t *testing.T) {
	client := netip.MustParseAddrPort("[2001:db8::1]:3478")
	b := make([]byte, 64)
	if n := testing.AllocsPerRun(1000, func() {
		n := PutHeader(b, TypeData, client)
		_, _, _, _ = ParseHeader(b[:n+10])
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func FuzzParseHeader(f *testing.F) {
	f.Add(AppendHeader(nil, TypeData, netip.MustParseAddrPort("192.0.2.1:9")))
	f.Add(AppendHeader([]byte{}, TypeData, netip.MustParseAddrPort("[2001:db8::1]:3478")))
	f.Add([]byte{Magic, 0x11, 6, 0, 0, 1})
	f.Add(append(AppendHeader(nil, TypeDataTCP, netip.MustParseAddrPort("192.0.2.1:9")), 0x00, 0x01))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, client, payload, err := ParseHeader(b)
		if err != nil {
			return
		}
		// Property: what parses re-encodes to a header of the length consumed,
		// carrying the same client, followed by the same payload.
		n := len(b) - len(payload)
		re := AppendHeader(nil, typ, client)
		if len(re) != n {
			t.Fatalf("re-encoded header is %d bytes, parsed %d", len(re), n)
		}
		typ2, client2, _, err := ParseHeader(append(re, payload...))
		if err != nil || typ2 != typ || client2 != client {
			t.Fatalf("round trip: %v %v %v", typ2, client2, err)
		}
	})
}

func BenchmarkParseHeader(b *testing.B) {
	pkt := append(AppendHeader(nil, TypeData, netip.MustParseAddrPort("192.0.2.1:9")), make([]byte, 160)...)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, err := ParseHeader(pkt); err != nil {
			b.Fatal(err)
		}
	}
}
