package membership

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStatic(t *testing.T) {
	ap := netip.MustParseAddrPort
	tests := []struct {
		name    string
		in      string
		want    map[uint32]netip.AddrPort
		wantErr string
	}{
		{"empty", "", map[uint32]netip.AddrPort{}, ""},
		{"blank", "  ", map[uint32]netip.AddrPort{}, ""},
		{"two", "1=127.0.0.1:4000,2=10.0.0.5:4000", map[uint32]netip.AddrPort{1: ap("127.0.0.1:4000"), 2: ap("10.0.0.5:4000")}, ""},
		{"spaces", " 1 = 127.0.0.1:4000 , 7=[fd00::7]:9 ", map[uint32]netip.AddrPort{1: ap("127.0.0.1:4000"), 7: ap("[fd00::7]:9")}, ""},
		{"mapped canonicalized", "3=[::ffff:10.0.0.1]:5", map[uint32]netip.AddrPort{3: ap("10.0.0.1:5")}, ""},
		{"max id", "4294967295=127.0.0.1:1", map[uint32]netip.AddrPort{1<<32 - 1: ap("127.0.0.1:1")}, ""},
		{"missing =", "1:127.0.0.1:4000", nil, `entry 1 "1:127.0.0.1:4000": want <id>=<ip>:<port>`},
		{"bad id", "x=127.0.0.1:4000", nil, `transceiver id "x" is not a decimal number`},
		{"id too big", "4294967296=127.0.0.1:4000", nil, "transceiver id"},
		{"negative id", "-1=127.0.0.1:4000", nil, "transceiver id"},
		{"host name", "1=localhost:4000", nil, `address "localhost:4000" is not`},
		{"no port", "1=127.0.0.1", nil, "is not <ip>:<port>"},
		{"port 0", "1=127.0.0.1:0", nil, "port 0"},
		{"unspecified", "1=0.0.0.0:4000", nil, "unspecified address"},
		{"duplicate id", "1=127.0.0.1:4000,1=127.0.0.1:4001", nil, "entry 2 \"1=127.0.0.1:4001\": transceiver 1 already given as 127.0.0.1:4000"},
		{"trailing comma", "1=127.0.0.1:4000,", nil, "entry 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Static(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("err = %v, want one containing %q wrapping ErrInvalid", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTable(t *testing.T) {
	var tab Table // zero value is usable
	if _, ok := tab.Lookup(1); ok || tab.Contains(netip.MustParseAddrPort("127.0.0.1:1")) || tab.Len() != 0 {
		t.Fatal("zero table is not empty")
	}
	a := netip.MustParseAddrPort("127.0.0.1:4000")
	b := netip.MustParseAddrPort("[fd00::1]:4000")
	if err := tab.Set(map[uint32]netip.AddrPort{1: a, 2: netip.MustParseAddrPort("[::ffff:127.0.0.1]:4001"), 3: b, 4: b}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		id   uint32
		want netip.AddrPort
		ok   bool
	}{
		{"v4", 1, a, true},
		{"mapped unmapped", 2, netip.MustParseAddrPort("127.0.0.1:4001"), true},
		{"v6", 3, b, true},
		{"shared address", 4, b, true},
		{"absent", 5, netip.AddrPort{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tab.Lookup(tt.id)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("Lookup(%d) = %v, %v", tt.id, got, ok)
			}
			if ok && !tab.Contains(got) {
				t.Fatalf("Contains(%v) = false", got)
			}
		})
	}
	if tab.Contains(netip.MustParseAddrPort("127.0.0.1:4002")) {
		t.Fatal("Contains a non-member")
	}
	// A bad Set leaves the table as it was.
	if err := tab.Set(map[uint32]netip.AddrPort{9: netip.MustParseAddrPort("127.0.0.1:0")}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
	if err := tab.Set(map[uint32]netip.AddrPort{9: {}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
	if tab.Len() != 4 {
		t.Fatal("failed Set changed the table")
	}
	// Set does not retain its argument.
	m := map[uint32]netip.AddrPort{1: a}
	if err := tab.Set(m); err != nil {
		t.Fatal(err)
	}
	m[2] = b
	if _, ok := tab.Lookup(2); ok || tab.Contains(b) {
		t.Fatal("table aliases the map given to Set, or kept old members")
	}
	e := tab.Entries()
	e[3] = b
	if tab.Len() != 1 {
		t.Fatal("Entries is not a copy")
	}
}

// TestTableID: ID is the reverse of Lookup (the relay's relearn path uses
// it to record a member's real id), the smallest id for a shared address,
// and follows Set.
func TestTableID(t *testing.T) {
	var tab Table
	a := netip.MustParseAddrPort("127.0.0.1:4000")
	b := netip.MustParseAddrPort("[fd00::1]:4000")
	if _, ok := tab.ID(a); ok {
		t.Fatal("zero table has an id")
	}
	if err := tab.Set(map[uint32]netip.AddrPort{7: a, 9: b, 4: b, 12: b}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		addr netip.AddrPort
		id   uint32
		ok   bool
	}{
		{a, 7, true},
		{b, 4, true},
		{netip.MustParseAddrPort("127.0.0.1:4001"), 0, false},
	} {
		if id, ok := tab.ID(tt.addr); id != tt.id || ok != tt.ok {
			t.Fatalf("ID(%v) = %d, %v; want %d, %v", tt.addr, id, ok, tt.id, tt.ok)
		}
		if tt.ok {
			if got, _ := tab.Lookup(tt.id); got != tt.addr {
				t.Fatalf("Lookup(ID(%v)) = %v", tt.addr, got)
			}
		}
	}
	// A mapped address is canonicalized by Set, like for Lookup.
	if err := tab.Set(map[uint32]netip.AddrPort{3: netip.MustParseAddrPort("[::ffff:127.0.0.1]:4000")}); err != nil {
		t.Fatal(err)
	}
	if id, ok := tab.ID(a); id != 3 || !ok {
		t.Fatalf("after Set: ID(%v) = %d, %v", a, id, ok)
	}
	if _, ok := tab.ID(b); ok {
		t.Fatal("ID kept a removed member")
	}
}

func TestConcurrentReadersAndWriters(t *testing.T) {
	tab, err := NewTable(map[uint32]netip.AddrPort{1: netip.MustParseAddrPort("127.0.0.1:1")})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				if w == 0 {
					_ = tab.Set(map[uint32]netip.AddrPort{1: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(i%100+1))})
					continue
				}
				ap, ok := tab.Lookup(1)
				if !ok {
					t.Error("member 1 vanished")
					return
				}
				_ = tab.Contains(ap)
				_, _ = tab.ID(ap)
			}
		})
	}
	wg.Wait()
}

func TestAllocatesNothing(t *testing.T) {
	tab, _ := NewTable(map[uint32]netip.AddrPort{1: netip.MustParseAddrPort("127.0.0.1:4000"), 2: netip.MustParseAddrPort("[fd00::1]:4000")})
	hit := netip.MustParseAddrPort("[fd00::1]:4000")
	n := testing.AllocsPerRun(1000, func() {
		_, _ = tab.Lookup(1)
		_, _ = tab.Lookup(99)
		_ = tab.Contains(hit)
		_ = tab.Contains(netip.MustParseAddrPort("127.0.0.1:1"))
		_, _ = tab.ID(hit)
	})
	if n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

func BenchmarkLookup(b *testing.B) {
	m := map[uint32]netip.AddrPort{}
	for i := range 1000 {
		m[uint32(i)] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 4000)
	}
	tab, _ := NewTable(m)
	ap := m[500]
	b.ReportAllocs()
	for b.Loop() {
		_, _ = tab.Lookup(500)
		_ = tab.Contains(ap)
	}
}
