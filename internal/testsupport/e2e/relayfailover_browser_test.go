package e2e

import (
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/demo"

	"github.com/switchboard-rtc/switchboard/internal/relay"
)

// failoverRelay stands in for a relay pod that dies behind the VIP while
// another relay keeps serving it: it starts a second relay on new ports
// (with an empty flow table), has the client's namespace send new TCP
// connections for the old relay's TCP address to the new one (a DNAT rule
// in its output hook, as kube-proxy sends a Service's new connections to
// the endpoints that are left), then closes the old relay, and returns
// when it closed it (demo.FailOverRelay). Connections the old relay held
// are reset; only new connections reach the new relay. The new relay
// registers no metrics.
//
// A relay restarted in place is not what a client behind a VIP sees:
// Chromium reconnects a closed ICE-TCP connection at once, and a port
// that refuses that attempt ends its TCP path.
func failoverRelay(t *testing.T, d *demo.Demo, ns string) time.Time {
	t.Helper()
	vip := d.Relay().TCPAddr()
	err := d.FailOverRelay(func(r *relay.Relay) error {
		rules := fmt.Sprintf(`table ip sbvip {
	chain out {
		type nat hook output priority -100; policy accept;
		ip daddr %s tcp dport %d counter dnat to %s
	}
}
`, vip.Addr(), vip.Port(), r.TCPAddr())
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft: %v\n%s", err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// TestChromiumTCPRelayRestart: Chromium on a network that drops UDP is in a
// call over ICE-TCP when its relay dies and another relay behind the same
// VIP takes its connections (failoverRelay). The dead relay's TCP
// connection is reset; Chromium reconnects to the VIP, its first frame on
// the new connection is a check, which the other relay routes by its
// token, and the call goes on. The audio gap is reported.
func TestChromiumTCPRelayRestart(t *testing.T) {
	chromiumBin := chromiumPath(t)
	wav, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	ns, hostIP, _ := clientNetns(t)
	dropUDP(t, ns)
	d := startInteropDemo(t, hostIP, "")
	page, results := startInteropPageOn(t, net.JoinHostPort(hostIP, "0"))
	runChromiumIn(t, ns, chromiumBin, wav, page, page+"/?shape=complete&hold=12000&api="+url.QueryEscape(d.URL()+"/v1/calls"))
	deadline := time.Now().Add(60 * time.Second)
	for d.Relay().Stats().TCP.ToClientFrames < 300 {
		if time.Now().After(deadline) {
			t.Fatalf("the call did not get going over TCP: %+v", d.Relay().Stats().TCP)
		}
		time.Sleep(20 * time.Millisecond)
	}
	killed := failoverRelay(t, d, ns)
	var back time.Duration
	for time.Since(killed) < 15*time.Second {
		if st := d.Relay().Stats(); st.TCP.ToClientFrames > 0 && st.TCP.ToTransceiverFrames > 0 {
			back = time.Since(killed)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := waitInterop(t, d, results, 60*time.Second)
	st := d.Relay().Stats()
	t.Logf("relay failed over: media back over TCP %v after; the page's longest audio gap %.0f ms, connection %s, transport %s; new relay: %d TCP connections, %d frames in, %d out, closed %v",
		back.Round(time.Millisecond), r.MaxGapMs, r.ConnectionState, r.Transport, st.TCP.Accepted, st.TCP.ToTransceiverFrames, st.TCP.ToClientFrames, st.TCP.Closed)
	if back == 0 || r.ConnectionState != "connected" || r.Transport != "tcp" {
		t.Fatalf("the call did not come back over TCP after the relay failed over")
	}
	if st.TCP.ToTransceiverFrames < 100 || st.TCP.ToClientFrames < 100 {
		t.Fatalf("the new relay carried %d frames in and %d out, want ≥ 100 each", st.TCP.ToTransceiverFrames, st.TCP.ToClientFrames)
	}
}
