package relay

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// srcN returns client address n: source IP 198.51.100.<ip>, port 10000+n.
func srcN(ip byte, n int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, ip}), uint16(10000+n))
}

// TestLimitPerIPRate: a source creates its burst of flows at once; beyond
// it, clients are given turns one rate interval apart, in arrival order, up
// to a second ahead, and refused beyond that. A client's retransmission
// before its turn is delayed again; at its turn it creates the flow.
func TestLimitPerIPRate(t *testing.T) {
	f := newFixture(t, Config{NewFlowsPerIP: 5, MaxPendingPerIP: 100}) // burst 5, one flow per 200 ms
	start := f.now
	at := func(d time.Duration) { f.now = start.Add(d) }
	for i := range 5 {
		if _, _, drop := f.pub(srcN(1, i), f.good(7)); drop != dropNone {
			t.Fatalf("flow %d: %v", i, drop)
		}
	}
	// Clients 5-9 are given turns at 200, 400, ..., 1000 ms; client 10's
	// would be 1.2 s away: refused.
	for i := 5; i < 10; i++ {
		if _, _, drop := f.pub(srcN(1, i), f.good(7)); drop != DropSourceRateDelayed {
			t.Fatalf("client %d over the burst: %v, want %v", i, drop, DropSourceRateDelayed)
		}
	}
	if _, _, drop := f.pub(srcN(1, 10), f.good(7)); drop != DropSourceRateLimit {
		t.Fatalf("client 10, a turn 1.2 s away: %v, want %v", drop, DropSourceRateLimit)
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
	// Retransmissions: before its turn a client waits, at its turn it
	// gets its flow; the next client's turn is still to come.
	at(100 * time.Millisecond)
	if _, _, drop := f.pub(srcN(1, 5), f.good(7)); drop != DropSourceRateDelayed {
		t.Fatalf("client 5 before its turn: %v, want %v", drop, DropSourceRateDelayed)
	}
	at(200 * time.Millisecond)
	if _, _, drop := f.pub(srcN(1, 5), f.good(7)); drop != dropNone {
		t.Fatalf("client 5 at its turn: %v", drop)
	}
	if _, _, drop := f.pub(srcN(1, 6), f.good(7)); drop != DropSourceRateDelayed {
		t.Fatalf("client 6 before its turn: %v, want %v", drop, DropSourceRateDelayed)
	}
	// A newcomer queues behind the turns already given (after client 9's
	// at 1 s), so it waits for them rather than overtaking.
	if _, _, drop := f.pub(srcN(1, 11), f.good(7)); drop != DropSourceRateDelayed {
		t.Fatalf("a newcomer at 200 ms: %v, want %v", drop, DropSourceRateDelayed)
	}
	at(1000 * time.Millisecond)
	for i := 6; i < 10; i++ {
		if _, _, drop := f.pub(srcN(1, i), f.good(7)); drop != dropNone {
			t.Fatalf("client %d after its turn: %v", i, drop)
		}
	}
	if _, _, drop := f.pub(srcN(1, 11), f.good(7)); drop != DropSourceRateDelayed {
		t.Fatalf("the newcomer before its turn (1.2 s): %v, want %v", drop, DropSourceRateDelayed)
	}
	at(1200 * time.Millisecond)
	if _, _, drop := f.pub(srcN(1, 11), f.good(7)); drop != dropNone {
		t.Fatalf("the newcomer at its turn: %v", drop)
	}
	if s := f.r.Stats(); s.Flows != 12 {
		t.Fatalf("%d flows, want 12", s.Flows)
	}
	// A turn nobody takes expires; the table forgets it.
	if _, _, drop := f.pub(srcN(1, 20), f.good(7)); drop != DropSourceRateDelayed {
		t.Fatalf("client 20: %v", drop)
	}
	f.r.sweep(start.Add(10 * time.Second))
	if n := f.r.flows.lim.waiting.Load(); n != 0 {
		t.Fatalf("%d turns outstanding after they expired", n)
	}
	// A source idle for a while has its whole burst again.
	at(20 * time.Second)
	for i := range 5 {
		if _, _, drop := f.pub(srcN(1, 30+i), f.good(7)); drop != dropNone {
			t.Fatalf("flow %d after a pause: %v", i, drop)
		}
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
		name    string
		cfg     Config
		oneIP   bool // all flows from one source IP, else one IP each
		delayed int  // requests given a turn before the refusals
		want    DropReason
	}{
		{"max flows", Config{MaxFlows: 4}, false, 0, DropFlowTableFull},
		{"per-ip rate", Config{NewFlowsPerIP: 4}, true, 4, DropSourceRateLimit},
		{"per-ip pending", Config{MaxPendingPerIP: 2}, true, 0, DropSourcePendingLimit},
		{"overall rate", Config{NewFlowsPerSecond: 4}, false, 0, DropNewFlowRateLimit},
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
				want := tc.want
				if i < 4+tc.delayed {
					want = DropSourceRateDelayed
				}
				if _, _, drop := f.pub(src(i), f.good(7)); drop != want {
					t.Fatalf("flow %d: %v, want %v", i, drop, want)
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
	l := newLimiter(8, 1000, 1000, 1<<30)
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
	if c.MaxPendingPerIP != DefaultMaxPendingPerIP || c.NewFlowsPerIP != DefaultNewFlowsPerIP || c.NewFlowsPerSecond != DefaultNewFlowsPerSecond ||
		c.NewFlowBurstPerIP != DefaultNewFlowBurstPerIP {
		t.Fatalf("defaults not filled: %+v", c)
	}
	c = base()
	c.NewFlowsPerIP = 7
	if err := c.Validate(); err != nil || c.NewFlowBurstPerIP != 7 {
		t.Fatalf("burst %d (%v), want NewFlowsPerIP's 7", c.NewFlowBurstPerIP, err)
	}
	for _, tc := range []struct {
		name string
		set  func(*Config)
	}{
		{"MaxPendingPerIP", func(c *Config) { c.MaxPendingPerIP = -1 }},
		{"MaxPendingPerIP", func(c *Config) { c.MaxPendingPerIP = maxLimit + 1 }},
		{"NewFlowsPerIP", func(c *Config) { c.NewFlowsPerIP = -1 }},
		{"NewFlowsPerSecond", func(c *Config) { c.NewFlowsPerSecond = -5 }},
		{"NewFlowBurstPerIP", func(c *Config) { c.NewFlowBurstPerIP = maxLimit + 1 }},
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
	fmt.Println(c.MaxPendingPerIP, c.NewFlowsPerIP, c.NewFlowBurstPerIP, c.NewFlowsPerSecond)
	// Output: 16 20 64 20000
}

// TestLimitDelaysRetryingClients: fifty clients behind one IP start within
// one second, each retransmitting its first check every 200 ms and giving
// up after eight (1.4 s, about a Pion client's patience). With the default
// rate and the burst it had before DefaultNewFlowBurstPerIP (20), every
// one of them gets its flow before giving up, without the waiting room
// (wait.go; handler tests have none): a client over its source's rate is
// given a turn, which its retransmission then takes; it is delayed, never
// refused.
func TestLimitDelaysRetryingClients(t *testing.T) {
	f := newFixture(t, Config{NewFlowBurstPerIP: DefaultNewFlowsPerIP})
	const clients, retries = 50, 8
	const every = 200 * time.Millisecond
	start := f.now
	type attempt struct {
		at     time.Duration
		client int
	}
	var queue []attempt
	for c := range clients {
		for k := range retries {
			queue = append(queue, attempt{time.Duration(c)*time.Second/clients + time.Duration(k)*every, c})
		}
	}
	slices.SortStableFunc(queue, func(a, b attempt) int { return cmp.Compare(a.at, b.at) })
	admitted := make([]time.Duration, clients)
	for i := range admitted {
		admitted[i] = -1
	}
	delayed := 0
	for _, a := range queue {
		if admitted[a.client] >= 0 {
			continue
		}
		f.now = start.Add(a.at)
		src := srcN(1, a.client)
		switch _, _, drop := f.pub(src, f.good(7)); drop {
		case dropNone:
			admitted[a.client] = a.at - time.Duration(a.client)*time.Second/clients
			// The transceiver answers at once: the flow is confirmed.
			if _, _, drop := f.internal(t7, src, []byte{1}); drop != dropNone {
				t.Fatalf("client %d: answer: %v", a.client, drop)
			}
		case DropSourceRateDelayed:
			delayed++
		default:
			t.Fatalf("client %d at %v: refused outright (%v)", a.client, a.at, drop)
		}
	}
	var worst time.Duration
	for c, d := range admitted {
		if d < 0 {
			t.Errorf("client %d never got a flow", c)
		}
		worst = max(worst, d)
	}
	t.Logf("%d clients, %d checks delayed, longest wait %v", clients, delayed, worst)
	if delayed == 0 {
		t.Fatal("no client was delayed: the test does not exercise the rate cap")
	}
}

// TestLimitTurnsBounded: sources over their rate hold turns in a fixed
// table; when their bucket of it is full, further clients are refused
// outright (source_rate_limit), and the table never holds more than
// waitSlots turns. Expired turns leave it.
func TestLimitTurnsBounded(t *testing.T) {
	f := newFixture(t, Config{NewFlowsPerIP: 1, MaxPendingPerIP: maxLimit, NewFlowsPerSecond: 1 << 30}) // burst 1, a turn a second
	counts := map[DropReason]int{}
	const sources = 3 * waitSlots
	for i := range sources {
		ip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		for port := range 3 { // admitted, given a turn, refused (its turn would be 2 s away)
			_, _, drop := f.pub(netip.AddrPortFrom(ip, uint16(1000+port)), f.good(7))
			counts[drop]++
		}
	}
	n := f.r.flows.lim.waiting.Load()
	t.Logf("%d sources: %v; %d turns outstanding", sources, counts, n)
	if n > waitSlots || n < waitSlots/2 {
		t.Fatalf("%d turns outstanding, want at most the table's %d (and most of it used)", n, waitSlots)
	}
	// Sources that share a limiter slot share its budget (limits.go), so
	// about a tenth of the first requests are delayed or refused too.
	if counts[dropNone] < sources*8/10 || counts[DropSourceRateDelayed] != int(n) ||
		counts[dropNone]+counts[DropSourceRateDelayed]+counts[DropSourceRateLimit] != 3*sources {
		t.Fatalf("drops %v with %d turns, want about %d admitted, %d delayed and the rest refused", counts, n, sources, n)
	}
	f.r.sweep(f.now.Add(5 * time.Second))
	if n := f.r.flows.lim.waiting.Load(); n != 0 {
		t.Fatalf("%d turns left after they expired", n)
	}
}
