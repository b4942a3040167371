package trusted

import (
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		items   []string
		want    Prefixes
		wantErr []string // substrings of the error, one per bad item
	}{
		{name: "none", items: nil, want: nil},
		{name: "masked", items: []string{"10.1.2.3/8", "2001:db8::1/32"}, want: Prefixes{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}},
		{name: "address without bits", items: []string{"10.0.0.1"}, wantErr: []string{`entry "10.0.0.1" is not a CIDR prefix such as 10.0.0.0/8`}},
		{name: "every bad item named", items: []string{"director", "10.0.0.0/8", "10.0.0.0/99"}, wantErr: []string{`entry "director"`, `entry "10.0.0.0/99"`}},
		{name: "untrimmed", items: []string{" 10.0.0.0/8"}, wantErr: []string{`entry " 10.0.0.0/8"`}},
		{name: "empty", items: []string{""}, wantErr: []string{`entry ""`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.items)
			if len(tt.wantErr) == 0 {
				if err != nil || !slices.Equal(got, tt.want) {
					t.Fatalf("Parse(%q) = %v, %v; want %v", tt.items, got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse(%q) = %v, nil; want an error", tt.items, got)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Parse(%q) error %q, want it to contain %q", tt.items, err, w)
				}
			}
			if got != nil {
				t.Errorf("Parse(%q) = %v with an error, want nil", tt.items, got)
			}
		})
	}
}

func TestContains(t *testing.T) {
	ps, err := Parse([]string{"10.0.0.0/8", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		addr string
		want bool
	}{
		{"10.2.3.4", true},
		{"::ffff:10.2.3.4", true},
		{"11.0.0.1", false},
		{"2001:db8::5", true},
		{"2001:db9::5", false},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			if got := ps.Contains(netip.MustParseAddr(tt.addr)); got != tt.want {
				t.Errorf("Contains(%s) = %v, want %v", tt.addr, got, tt.want)
			}
		})
	}
	if Prefixes(nil).Contains(netip.MustParseAddr("10.0.0.1")) {
		t.Error("the zero Prefixes contains an address")
	}
	a := netip.MustParseAddr("192.0.2.1")
	if n := testing.AllocsPerRun(100, func() { ps.Contains(a) }); n != 0 {
		t.Errorf("Contains allocates %v times", n)
	}
}

func TestClientAddr(t *testing.T) {
	proxies, err := Parse([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		remote string
		xff    []string
		want   string // "" for the invalid address
	}{
		{name: "direct", remote: "198.51.100.7:5000", want: "198.51.100.7"},
		{name: "untrusted peer's header ignored", remote: "198.51.100.7:5000", xff: []string{"203.0.113.9"}, want: "198.51.100.7"},
		{name: "trusted proxy", remote: "10.0.0.2:5000", xff: []string{"203.0.113.9"}, want: "203.0.113.9"},
		{name: "last entry of the last header", remote: "10.0.0.2:5000", xff: []string{"192.0.2.1", "192.0.2.2, 203.0.113.9 "}, want: "203.0.113.9"},
		{name: "mapped", remote: "[::ffff:10.0.0.2]:5000", xff: []string{"::ffff:203.0.113.9"}, want: "203.0.113.9"},
		{name: "trusted proxy without header", remote: "10.0.0.2:5000", want: "10.0.0.2"},
		{name: "trusted proxy with garbage", remote: "10.0.0.2:5000", xff: []string{"203.0.113.9, unknown"}, want: "10.0.0.2"},
		{name: "bad remote", remote: "pipe", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/calls", nil)
			r.RemoteAddr = tt.remote
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got := ClientAddr(r, proxies)
			if tt.want == "" {
				if got.IsValid() {
					t.Errorf("ClientAddr = %v, want invalid", got)
				}
				return
			}
			if got != netip.MustParseAddr(tt.want) {
				t.Errorf("ClientAddr = %v, want %s", got, tt.want)
			}
		})
	}
}
