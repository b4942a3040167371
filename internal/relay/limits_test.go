package relay

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// srcN returns client address n: source IP 198.51.100.<ip>, port 10000+n.
func srcN(ip byte, n int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, ip}), uint16(10000+n))
}

func TestLimitPerIPRate(t *testing.T) {
	f := newFixture(t, Config{NewFlowsPerIP: 5, MaxPendingPerIP: 100})
	for i := range 5 {
		if _, _, drop := f.pub(srcN(1, i), f.good(7)); drop != dropNone {
			t.Fatalf("flow %d: %v", i, drop)
		}
	}
	if _, _, drop := f.pub(srcN(1, 5), f.good(7)); drop != DropSourceRateLimit {
		t.Fatalf("6th flow in a second: %v, want %v", drop, DropSourceRateLimit)
	}
	// Another source is not affected.
	if _, _, drop := f.pub(srcN(2, 0), f.good(7)); drop != dropNone {
		t.Fatalf("other source: %v", drop)
	}
	// Existing flows of the limited source keep forwarding, STUN included.
	for i := range 5 {
		for _, pkt := range [][]byte{{0x80, 1}, f.good(7)} {
			if to, _, drop := f.pub(srcN(1, i), pkt); drop != dropNone || to != t7 {
				t.Fatalf("flow %d after the cap: (%v, %v)", i, to, drop)
			}
		}
	}
	// The next window admits again.
	f.now = f.now.Add(time.Second)
	if _, _, drop := f.pub(srcN(1, 5), f.good(7)); drop != dropNone {
		t.Fatalf("next second: %v", drop)
	}
	if s := f.r.Stats(); s.Flows != 7 {
		t.Fatalf("%d flows, want 7", s.Flows)
	}
}

func TestLimitPendingPerIP(t *testing.T) {
	f := newFixture(t, Config{MaxPendingPerIP: 3, NewFlowsPerIP: 1000, PendingTimeout: time.Second})
	for i := range 3 {
		if _, _, drop := f.pub(srcN(1, i), f.good(7)); drop != dropNone {
			t.Fatal(drop)
		}
	}
	if _, _, drop := f.pub(srcN(1, 3), f.good(7)); drop != DropSourcePendingLimit {
		t.Fatalf("4th pending flow: %v, want %v", drop, DropSourcePendingLimit)
	}
	k := keyOf(srcN(1, 0))
	if n := f.r.flows.lim.pendingOf(k); n != 3 {
		t.Fatalf("pending count %d, want 3", n)
	}
	// A confirmation gives the unit back.
	if _, _, drop := f.internal(t7, srcN(1, 0), []byte{1}); drop != dropNone {
		t.Fatal(drop)
	}
	if n := f.r.flows.lim.pendingOf(k); n != 2 {
		t.Fatalf("pending count %d after a confirmation, want 2", n)
	}
	if _, _, drop := f.pub(srcN(1, 3), f.good(7)); drop != dropNone {
		t.Fatalf("after a confirmation: %v", drop)
	}
	// Expiry gives the units back; the confirmed flow stays.
	f.r.sweep(f.now.Add(1500 * time.Millisecond))
	if n := f.r.flows.lim.pendingOf(k); n != 0 {
		t.Fatalf("pending count %d after expiry, want 0", n)
	}
	if s := f.r.Stats(); s.Flows != 1 || s.PendingFlows != 0 {
		t.Fatalf("stats %+v, want the confirmed flow only", s)
	}
	// Removing a confirmed flow does not touch the count.
	f.r.flows.remove(srcN(1, 0))
	if n := f.r.flows.lim.pendingOf(k); n != 0 {
		t.Fatalf("pending count %d after removing a confirmed flow", n)
	}
}

func TestLimitIPv6Prefix(t *testing.T) {
	f := newFixture(t, Config{MaxPendingPerIP: 2, NewFlowsPerIP: 1000})
	a := netip.MustParseAddrPort("[2001:db8:1:2::1]:1000")
	b := netip.MustParseAddrPort("[2001:db8:1:2:ffff::9]:1000") // same /64
	c := netip.MustParseAddrPort("[2001:db8:1:3::1]:1000")      // next /64
	for _, ap := range []netip.AddrPort{a, b} {
		if _, _, drop := f.pub(ap, f.good(7)); drop != dropNone {
			t.Fatal(drop)
		}
	}
	if _, _, drop := f.pub(netip.MustParseAddrPort("[2001:db8:1:2::77]:5"), f.good(7)); drop != DropSourcePendingLimit {
		t.Fatalf("third flow from one /64: %v, want %v", drop, DropSourcePendingLimit)
	}
	ka, kc := keyOf(a), keyOf(c)
	if f.r.flows.lim.slotOf(&ka) == f.r.flows.lim.slotOf(&kc) {
		t.Skip("the two /64s share a limiter slot under this seed (probability 2^-16)")
	}
	if _, _, drop := f.pub(c, f.good(7)); drop != dropNone {
		t.Fatalf("another /64: %v", drop)
	}
}

func TestLimitOverallRate(t *testing.T) {
	f := newFixture(t, Config{NewFlowsPerSecond: 4})
	for i := range 4 {
		if _, _, drop := f.pub(srcN(byte(i), 0), f.good(7)); drop != dropNone {
			t.Fatal(drop)
		}
	}
	over := srcN(9, 0)
	if _, _, drop := f.pub(over, f.good(7)); drop != DropNewFlowRateLimit {
		t.Fatalf("5th flow in a second: %v, want %v", drop, DropNewFlowRateLimit)
	}
	// The refused flow holds no pending unit of its source.
	if n := f.r.flows.lim.pendingOf(keyOf(over)); n != 0 {
		t.Fatalf("refused source holds %d pending units", n)
	}
	f.now = f.now.Add(time.Second)
	if _, _, drop := f.pub(over, f.good(7)); drop != dropNone {
		t.Fatalf("next second: %v", drop)
	}
}

// TestLimitSourceOverItsCapSpendsNoGlobalBudget: a source refused by its own
// cap does not consume the overall budget.
func TestLimitSourceOverItsCapSpendsNoGlobalBudget(t *testing.T) {
	f := newFixture(t, Config{NewFlowsPerIP: 2, NewFlowsPerSecond: 3})
	for i := range 100 {
		f.pub(srcN(1, i), f.good(7))
	}
	if _, _, drop := f.pub(srcN(2, 0), f.good(7)); drop != dropNone {
		t.Fatalf("another source after a flood from one: %v", drop)
	}
	s := f.r.Stats()
	if s.Flows != 3 {
		t.Fatalf("%d flows, want 3", s.Flows)
	}
}

// TestCapsNeverEvict fills every cap and checks that the confirmed flows keep
// forwarding both ways.
func TestCapsNeverEvict(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		oneIP bool // all flows from one source IP, else one IP each
		want  DropReason
	}{
		{"max flows", Config{MaxFlows: 4}, false, DropFlowTableFull},
		{"per-ip rate", Config{NewFlowsPerIP: 4}, true, DropSourceRateLimit},
		{"per-ip pending", Config{MaxPendingPerIP: 2}, true, DropSourcePendingLimit},
		{"overall rate", Config{NewFlowsPerSecond: 4}, false, DropNewFlowRateLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.cfg)
			src := func(i int) netip.AddrPort {
				if tc.oneIP {
					return srcN(1, i)
				}
				return srcN(byte(i), 0)
			}
			// Two confirmed flows, then two pending ones: every cap is reached at 4 flows.
			for i := range 4 {
				if _, _, drop := f.pub(src(i), f.good(7)); drop != dropNone {
					t.Fatalf("flow %d: %v", i, drop)
				}
				if i < 2 {
					f.internal(t7, src(i), []byte{1})
				}
			}
			for i := 4; i < 50; i++ {
				if _, _, drop := f.pub(src(i), f.good(7)); drop != tc.want {
					t.Fatalf("flow %d: %v, want %v", i, drop, tc.want)
				}
			}
			if s := f.r.Stats(); s.Flows != 4 || s.PendingFlows != 2 {
				t.Fatalf("stats %+v, want 4 flows, 2 pending", s)
			}
			for i := range 4 {
				if to, _, drop := f.pub(src(i), []byte{0x80, 0}); drop != dropNone || to != t7 {
					t.Fatalf("flow %d after the cap: (%v, %v)", i, to, drop)
				}
				if to, _, drop := f.internal(t7, src(i), []byte{1}); drop != dropNone || to != src(i) {
					t.Fatalf("reply to flow %d after the cap: (%v, %v)", i, to, drop)
				}
			}
		})
	}
}

// TestLimiterConcurrent hammers one source's slot from several goroutines:
// the counts never exceed the caps and every unit comes back.
func TestLimiterConcurrent(t *testing.T) {
	l := newLimiter(8, 1000, 1<<30)
	k := keyOf(srcN(1, 0))
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				if l.acquire(&k, int64(g)) == dropNone {
					if p := l.pendingOf(k); p > 8 {
						t.Errorf("pending %d above the cap", p)
					}
					mu.Lock()
					admitted++
					mu.Unlock()
					if i%2 == 0 {
						l.release(&k)
					} else {
						defer l.release(&k)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := l.pendingOf(k); n != 0 {
		t.Fatalf("pending %d after every release", n)
	}
	if admitted > 1000 {
		t.Fatalf("%d admitted in one window, cap 1000", admitted)
	}
}

func TestConfigValidateLimits(t *testing.T) {
	base := func() Config { return Config{PublicAddr: ":1", InternalAddr: ":0"} }
	c := base()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.MaxPendingPerIP != DefaultMaxPendingPerIP || c.NewFlowsPerIP != DefaultNewFlowsPerIP || c.NewFlowsPerSecond != DefaultNewFlowsPerSecond {
		t.Fatalf("defaults not filled: %+v", c)
	}
	for _, tc := range []struct {
		name string
		set  func(*Config)
	}{
		{"MaxPendingPerIP", func(c *Config) { c.MaxPendingPerIP = -1 }},
		{"MaxPendingPerIP", func(c *Config) { c.MaxPendingPerIP = maxLimit + 1 }},
		{"NewFlowsPerIP", func(c *Config) { c.NewFlowsPerIP = -1 }},
		{"NewFlowsPerSecond", func(c *Config) { c.NewFlowsPerSecond = -5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.set(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.name) {
				t.Fatalf("err = %v, want one naming %s", err, tc.name)
			}
		})
	}
}

func ExampleConfig_limits() {
	c := Config{PublicAddr: "0.0.0.0:3478", InternalAddr: "0.0.0.0:3479"}
	_ = c.Validate()
	fmt.Println(c.MaxPendingPerIP, c.NewFlowsPerIP, c.NewFlowsPerSecond)
	// Output: 16 20 20000
}
