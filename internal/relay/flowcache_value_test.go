package relay

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/token"
)

// FuzzParseCachedFlow: a value from the store (which anyone with access to
// it could have written) never panics the parser, is accepted only within
// maxCachedValue, and an accepted value re-encodes to one that parses to
// the same flow.
func FuzzParseCachedFlow(f *testing.F) {
	uf, _ := ufragWords(bytes.Repeat([]byte("A"), token.Len))
	for _, fl := range []flowInfo{
		{dst: netip.MustParseAddrPort("10.0.0.5:4000"), tr: 7, ufrag: uf},
		{dst: netip.MustParseAddrPort("[2001:db8::5]:4000"), tr: 1<<32 - 1},
		{dst: netip.MustParseAddrPort("10.0.0.5:4000"), tr: 7, ufrag: uf, via: netip.MustParseAddrPort("192.0.2.10:3479")},
	} {
		f.Add(appendCachedFlow(nil, &fl))
	}
	for _, v := range []string{"", "2", "2 10.0.0.5:4000 7 - 192.0.2.1:0", "1 10.0.0.5:4000 7 -", "2 [::ffff:10.0.0.5]:4000 7 - -"} {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		cf, ok := parseCachedFlow(v)
		if !ok {
			return
		}
		if len(v) > maxCachedValue {
			t.Fatalf("accepted %d bytes, more than %d", len(v), maxCachedValue)
		}
		if !cf.dst.IsValid() || cf.dst.Port() == 0 || cf.dst.Addr().Is4In6() || (cf.via.IsValid() && cf.via.Addr().Is4In6()) {
			t.Fatalf("%q: addresses %v via %v are not canonical and valid", v, cf.dst, cf.via)
		}
		words, ok := ufragWords(cf.ufrag)
		if cf.ufrag != nil && !ok {
			return // a ufrag outside the ICE alphabet: no flow has it, so it cannot be re-encoded
		}
		again, ok := parseCachedFlow(appendCachedFlow(nil, &flowInfo{dst: cf.dst, tr: cf.transceiver, ufrag: words, via: cf.via}))
		if !ok || again.dst != cf.dst || again.via != cf.via || again.transceiver != cf.transceiver || !bytes.Equal(again.ufrag, cf.ufrag) {
			t.Fatalf("%q → %+v, re-encoded → %+v (%v)", v, cf, again, ok)
		}
	})
}
