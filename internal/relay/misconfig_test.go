package relay

import (
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// TestRelayLogsMisconfiguration: a relay whose transceivers hold another
// token key, or that lacks a transceiver in its members, used to drop
// every check with nothing in any log (only drops_total moved), and the
// call timed out. It logs such drops, once at first and then at most once
// per interval with the count, naming the likely cause.
func TestRelayLogsMisconfiguration(t *testing.T) {
	var out logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	keys := testKeyring(t, 1, 0xAA)
	tr := udp(t)
	members, err := membership.NewTable(map[uint32]netip.AddrPort{7: addrOf(tr)})
	if err != nil {
		t.Fatal(err)
	}
	const every = 300 * time.Millisecond
	tune := defaultTuning
	tune.misconfigEvery = every
	r, err := start(Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: testCluster, Workers: 1,
		PendingTimeout: 40 * time.Millisecond}, keys, members, prometheus.NewRegistry(), log, tune)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	client := udp(t)
	lines := func(reason string) []string {
		var got []string
		for l := range strings.Lines(out.String()) {
			if strings.Contains(l, "reason="+reason) {
				got = append(got, l)
			}
		}
		return got
	}

	// The transceiver's key is another one: every token is forged.
	other := testKeyring(t, 1, 0xBB)
	for range 5 {
		send(t, client, binding(t, mint(t, other, testCluster, 7, time.Now())+":clnt"), r.PublicAddr())
	}
	eventually(t, "a token_forged log line", func() bool { return len(lines("token_forged")) == 1 })
	l := lines("token_forged")[0]
	for _, want := range []string{"level=WARN", "dropped=5", "-token-key the same on every relay and transceiver"} {
		if !strings.Contains(l, want) {
			t.Errorf("token_forged line %q lacks %q", l, want)
		}
	}
	// More of the same within the interval: no new line until it passes,
	// then one with the count since the last.
	for range 3 {
		send(t, client, binding(t, mint(t, other, testCluster, 7, time.Now())+":clnt"), r.PublicAddr())
	}
	time.Sleep(every / 3)
	if n := len(lines("token_forged")); n != 1 {
		t.Errorf("%d token_forged lines within the interval, want 1:\n%s", n, out.String())
	}
	eventually(t, "a second token_forged line after the interval", func() bool { return len(lines("token_forged")) == 2 })
	if l := lines("token_forged")[1]; !strings.Contains(l, "dropped=3") || !strings.Contains(l, "since=") {
		t.Errorf("second token_forged line %q, want dropped=3 and since=", l)
	}

	// A valid token for transceiver 9, which the relay's members lack.
	send(t, client, binding(t, mint(t, keys, testCluster, 9, time.Now())+":clnt"), r.PublicAddr())
	eventually(t, "an unknown_transceiver log line", func() bool { return len(lines("unknown_transceiver")) == 1 })
	l = lines("unknown_transceiver")[0]
	for _, want := range []string{"token_transceiver=9", `members="7=` + addrOf(tr).String() + `"`, "-members"} {
		if !strings.Contains(l, want) {
			t.Errorf("unknown_transceiver line %q lacks %q", l, want)
		}
	}
	// A valid token for a member creates a flow and logs nothing.
	send(t, client, binding(t, mint(t, keys, testCluster, 7, time.Now())+":clnt"), r.PublicAddr())
	recv(t, tr)
	time.Sleep(2 * every)
	if n := strings.Count(out.String(), "relay: dropping datagrams"); n != 3 {
		t.Errorf("%d drop lines, want 3:\n%s", n, out.String())
	}
}
