// Package trusted holds the address prefixes a component trusts (relays
// allowed to send hop datagrams, Global Relays allowed to send to a
// cluster relay's public socket, proxies whose X-Forwarded-For names the
// client) and the one rule for reading a client's address through such
// a proxy.
//
// Prefixes are CIDR notation (RFC 4632; RFC 4291 §2.3 for IPv6), stored
// masked. Addresses are matched with IPv4-mapped IPv6 addresses unmapped
// first, so ::ffff:10.0.0.1 is in 10.0.0.0/8.
package trusted

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Prefixes is a list of masked CIDR prefixes. The zero value holds none
// and contains no address. Matching allocates nothing.
type Prefixes []netip.Prefix

// Parse parses items, each one CIDR prefix such as 10.0.0.0/8 or
// 2001:db8::/32, and masks them (10.1.2.3/8 becomes 10.0.0.0/8). Items are
// taken as they are: lists from configuration are trimmed and checked
// for empty items before they get here (internal/config). The error names
// every bad item, as `entry "10.0.0.1" is not a CIDR prefix such as
// 10.0.0.0/8: …`, for the caller to prefix with the setting's name.
func Parse(items []string) (Prefixes, error) {
	if len(items) == 0 {
		return nil, nil
	}
	ps := make(Prefixes, 0, len(items))
	var errs []error
	for _, s := range items {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("entry %q is not a CIDR prefix such as 10.0.0.0/8: %w", s, err))
			continue
		}
		ps = append(ps, p.Masked())
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ps, nil
}

// Contains reports whether a, unmapped, is in one of ps.
func (ps Prefixes) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientAddr returns the address of the client that sent r: its peer
// address (r.RemoteAddr), or, when the peer is one of proxies (a director
// or load balancer), the last entry of the last X-Forwarded-For header,
// which that proxy appended; entries before it were written by whoever
// called the proxy and are not believed. A trusted peer with no usable
// X-Forwarded-For is taken as the client. The result is unmapped; it is
// invalid only when r.RemoteAddr is not an ip:port.
func ClientAddr(r *http.Request, proxies Prefixes) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	peer := ap.Addr().Unmap()
	if !proxies.Contains(peer) {
		return peer
	}
	xff := r.Header.Values("X-Forwarded-For")
	if len(xff) == 0 {
		return peer
	}
	last := xff[len(xff)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	if a, err := netip.ParseAddr(strings.TrimSpace(last)); err == nil {
		return a.Unmap()
	}
	return peer
}
