package demo

import (
	"net"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/relay"
)

// restartRelay closes the demo's relay and starts a new one on the same
// addresses (UDP, TCP and the internal hop) with an empty flow table, as
// a relay pod that restarts does, and returns when it closed the old one.
// The new relay registers no metrics.
func (d *Demo) restartRelay(t *testing.T) time.Time {
	t.Helper()
	cfg := d.rcfg
	cfg.PublicAddr, cfg.InternalAddr = d.relay.PublicAddr().String(), d.relay.InternalAddr().String()
	if a := d.relay.TCPAddr(); a.IsValid() {
		cfg.TCPAddr = a.String()
	}
	_ = d.relay.Close()
	killed := time.Now()
	for {
		r, err := relay.New(cfg, d.keys, d.members, nil, d.log)
		if err == nil {
			d.relay = r
			return killed
		}
		if time.Since(killed) > 2*time.Second {
			t.Fatalf("restart the relay: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestChromiumTCPRelayRestart: Chromium on a network that drops UDP is in a
// call over ICE-TCP when the relay restarts. The restart closes its TCP
// connection; Chromium reconnects (libwebrtc reconnects an active ICE-TCP
// connection that was writable when it is next used), its first frame on
// the new connection is a check, which the new relay routes by its token,
// and the call goes on. The audio gap is reported.
func TestChromiumTCPRelayRestart(t *testing.T) {
	chromiumBin := chromiumPath(t)
	wav, err := filepath.Abs(filepath.Join("..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	ns, hostIP, _ := clientNetns(t)
	dropUDP(t, ns)
	d := startInteropDemo(t, hostIP)
	page, results := startInteropPageOn(t, net.JoinHostPort(hostIP, "0"))
	runChromiumIn(t, ns, chromiumBin, wav, page, page+"/?shape=complete&hold=12000&api="+url.QueryEscape(d.URL()+"/v1/calls"))
	deadline := time.Now().Add(60 * time.Second)
	for d.Relay().Stats().TCP.ToClientFrames < 300 {
		if time.Now().After(deadline) {
			t.Fatalf("the call did not get going over TCP: %+v", d.Relay().Stats().TCP)
		}
		time.Sleep(20 * time.Millisecond)
	}
	killed := d.restartRelay(t)
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
	t.Logf("relay restarted: media back over TCP %v after; the page's longest audio gap %.0f ms, connection %s, transport %s; new relay: %d TCP connections, %d frames in, %d out, closed %v",
		back.Round(time.Millisecond), r.MaxGapMs, r.ConnectionState, r.Transport, st.TCP.Accepted, st.TCP.ToTransceiverFrames, st.TCP.ToClientFrames, st.TCP.Closed)
	if back == 0 || r.ConnectionState != "connected" || r.Transport != "tcp" {
		t.Fatalf("the call did not come back over TCP after the relay restart")
	}
	if st.TCP.ToTransceiverFrames < 100 || st.TCP.ToClientFrames < 100 {
		t.Fatalf("the new relay carried %d frames in and %d out, want ≥ 100 each", st.TCP.ToTransceiverFrames, st.TCP.ToClientFrames)
	}
}
