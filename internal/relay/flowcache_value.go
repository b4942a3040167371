package relay

import (
	"bytes"
	"net/netip"
	"strconv"

	"github.com/switchboard-rtc/switchboard/internal/token"
)

// Cached values (docs/relay.md, "Flow cache"), ASCII, fields separated by
// one space:
//
//	2 <transceiver ip:port> <transceiver id> <server ufrag or -> <via ip:port or ->
//
// e.g. "2 10.0.0.5:4000 7 AbCd… -" (the ufrag is token.Len characters of
// the ICE alphabet; "-" for a flow relearned from a transceiver's traffic,
// which has none; via is the Global Relay the client's traffic arrives
// through, "-" for a client sending directly).

// appendCachedFlow appends f's encoding to b.
func appendCachedFlow(b []byte, f *flowInfo) []byte {
	b = append(b, cacheValueVersion...)
	b = append(b, ' ')
	b = f.dst.AppendTo(b)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(f.tr), 10)
	b = append(b, ' ')
	if f.ufrag == ([token.Len / 8]uint64{}) {
		b = append(b, '-')
	} else {
		b = append(b, ufragBytes(&f.ufrag)...)
	}
	b = append(b, ' ')
	if !f.via.IsValid() {
		return append(b, '-')
	}
	return f.via.AppendTo(b)
}

// cachedFlow is a decoded value.
type cachedFlow struct {
	dst         netip.AddrPort
	via         netip.AddrPort // invalid: direct
	transceiver uint32
	ufrag       []byte // nil or token.Len bytes
}

// parseCachedFlow decodes a value; ok is false for anything malformed.
func parseCachedFlow(v []byte) (cf cachedFlow, ok bool) {
	if len(v) > maxCachedValue {
		return cf, false
	}
	f := bytes.Split(v, []byte{' '})
	if len(f) != 5 || string(f[0]) != cacheValueVersion {
		return cf, false
	}
	dst, ok := parseAddrPort(f[1])
	if !ok {
		return cf, false
	}
	tr, err := strconv.ParseUint(string(f[2]), 10, 32)
	if err != nil {
		return cf, false
	}
	switch {
	case string(f[3]) == "-":
	case len(f[3]) == token.Len:
		cf.ufrag = f[3]
	default:
		return cf, false
	}
	if string(f[4]) != "-" {
		if cf.via, ok = parseAddrPort(f[4]); !ok {
			return cf, false
		}
	}
	cf.dst, cf.transceiver = dst, uint32(tr)
	return cf, true
}

// parseAddrPort parses a canonical ip:port with a non-zero port.
func parseAddrPort(b []byte) (netip.AddrPort, bool) {
	ap, err := netip.ParseAddrPort(string(b))
	if err != nil || !ap.Addr().IsValid() || ap.Port() == 0 {
		return netip.AddrPort{}, false
	}
	return canonical(ap), true
}
