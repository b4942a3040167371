// Package membership holds a relay's membership table: the transceivers it
// may forward to, as transceiver id → internal-hop address.
//
// The table is the relay's only source of internal destinations (docs/design.md §3:
// "Nothing a client sends can make a relay send packets to an address outside
// the membership table"): a routing token names a transceiver id, Lookup
// resolves it, and Contains gates datagrams arriving on the internal socket.
//
// Readers never lock: the table is an atomic pointer to an immutable
// snapshot, and Set builds a new snapshot and swaps it in (copy-on-write).
// Lookup, Contains and ID allocate nothing. Whatever fills the table (static
// config, the Redis registry in redis.go, or Kubernetes EndpointSlices in
// kube.go) calls Set with the complete new membership.
package membership

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrInvalid is wrapped by every error about a bad entry.
var ErrInvalid = errors.New("membership: invalid entry")

// Table maps transceiver ids to internal addresses. The zero value is an
// empty table ready to use; a Table must not be copied after first use.
type Table struct {
	snap atomic.Pointer[snapshot]

	mu sync.Mutex // serializes Set, so that concurrent writers cannot lose updates
}

// snapshot is immutable once published.
type snapshot struct {
	byID map[uint32]netip.AddrPort
	// byAddr is the reverse of byID: for an address several ids share,
	// the smallest of them.
	byAddr map[netip.AddrPort]uint32
}

// NewTable returns a table holding entries (see Set).
func NewTable(entries map[uint32]netip.AddrPort) (*Table, error) {
	t := new(Table)
	if err := t.Set(entries); err != nil {
		return nil, err
	}
	return t, nil
}

// Set replaces the whole membership with entries. Addresses are
// canonicalized (IPv4-mapped IPv6 becomes IPv4); an invalid or unspecified
// address or a zero port is an error and leaves the table unchanged. Set does
// not retain entries. Several ids may share an address.
func (t *Table) Set(entries map[uint32]netip.AddrPort) error {
	s := &snapshot{
		byID:   make(map[uint32]netip.AddrPort, len(entries)),
		byAddr: make(map[netip.AddrPort]uint32, len(entries)),
	}
	for id, ap := range entries {
		ap, err := canonical(ap)
		if err != nil {
			return fmt.Errorf("%w: transceiver %d: %v", ErrInvalid, id, err)
		}
		s.byID[id] = ap
		if prev, ok := s.byAddr[ap]; !ok || id < prev {
			s.byAddr[ap] = id
		}
	}
	t.mu.Lock()
	t.snap.Store(s)
	t.mu.Unlock()
	return nil
}

func canonical(ap netip.AddrPort) (netip.AddrPort, error) {
	a := ap.Addr().Unmap()
	switch {
	case !a.IsValid():
		return ap, errors.New("no address")
	case a.IsUnspecified():
		return ap, fmt.Errorf("unspecified address %s", a)
	case ap.Port() == 0:
		return ap, fmt.Errorf("port 0 in %s", ap)
	}
	return netip.AddrPortFrom(a, ap.Port()), nil
}

// Lookup returns the internal address of transceiver id.
func (t *Table) Lookup(id uint32) (netip.AddrPort, bool) {
	s := t.snap.Load()
	if s == nil {
		return netip.AddrPort{}, false
	}
	ap, ok := s.byID[id]
	return ap, ok
}

// Contains reports whether addr is the internal address of some member.
// addr must already be canonical (see netip.Addr.Unmap); the relay
// canonicalizes every source address when it reads it.
func (t *Table) Contains(addr netip.AddrPort) bool {
	s := t.snap.Load()
	if s == nil {
		return false
	}
	_, ok := s.byAddr[addr]
	return ok
}

// ID returns the id of the member at internal address addr (canonical, as
// for Contains): the reverse of Lookup. When several ids share addr it
// returns the smallest, so the answer is the same for every reader of a
// snapshot. It is one map read, like Lookup.
func (t *Table) ID(addr netip.AddrPort) (uint32, bool) {
	s := t.snap.Load()
	if s == nil {
		return 0, false
	}
	id, ok := s.byAddr[addr]
	return id, ok
}

// Len returns the number of members.
func (t *Table) Len() int {
	s := t.snap.Load()
	if s == nil {
		return 0
	}
	return len(s.byID)
}

// Entries returns a copy of the current membership.
func (t *Table) Entries() map[uint32]netip.AddrPort {
	s := t.snap.Load()
	if s == nil {
		return map[uint32]netip.AddrPort{}
	}
	return maps.Clone(s.byID)
}

// Static parses a static membership list such as
//
//	1=127.0.0.1:4000,2=10.0.0.5:4000,3=[fd00::7]:4000
//
// Entries are separated by commas; spaces around entries and around '=' are
// ignored; an empty string is an empty membership. Ids are decimal uint32;
// addresses are literal IP:port (no host names: the table is resolved
// configuration, not a lookup). A repeated id is an error.
func Static(entries string) (map[uint32]netip.AddrPort, error) {
	out := make(map[uint32]netip.AddrPort)
	if strings.TrimSpace(entries) == "" {
		return out, nil
	}
	for i, e := range strings.Split(entries, ",") {
		e = strings.TrimSpace(e)
		idStr, addrStr, ok := strings.Cut(e, "=")
		if !ok {
			return nil, fmt.Errorf("%w: entry %d %q: want <id>=<ip>:<port>", ErrInvalid, i+1, e)
		}
		idStr, addrStr = strings.TrimSpace(idStr), strings.TrimSpace(addrStr)
		id, err := strconv.ParseUint(idStr, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d %q: transceiver id %q is not a decimal number from 0 to %d", ErrInvalid, i+1, e, idStr, uint32(1<<32-1))
		}
		ap, err := netip.ParseAddrPort(addrStr)
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d %q: address %q is not <ip>:<port> or [<ipv6>]:<port>", ErrInvalid, i+1, e, addrStr)
		}
		if ap, err = canonical(ap); err != nil {
			return nil, fmt.Errorf("%w: entry %d %q: %v", ErrInvalid, i+1, e, err)
		}
		if prev, dup := out[uint32(id)]; dup {
			return nil, fmt.Errorf("%w: entry %d %q: transceiver %d already given as %s", ErrInvalid, i+1, e, id, prev)
		}
		out[uint32(id)] = ap
	}
	return out, nil
}
