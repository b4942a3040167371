package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// ICE-TCP with real browsers: headless Chromium and Firefox ESR, each in
// a network namespace of its own (clientNetns) whose outgoing UDP is
// dropped by nftables, as on a network that lets only TCP out, complete a
// call with the demo (audio both ways and a data-channel echo) over the
// relay's ICE-TCP port; with UDP open, the same browsers select UDP, the
// TCP candidate's priority being lower.

// dropUDP makes the namespace ns drop every UDP datagram it sends.
func dropUDP(t *testing.T, ns string) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		const msg = "needs nft from nftables (Debian: apt-get install nftables, or scripts/deps.sh test)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI is set, and in CI a missing tool is an error")
		}
		t.Skip(msg)
	}
	const rules = `table inet sbnoudp {
	chain out {
		type filter hook output priority 0; policy accept;
		meta l4proto udp counter drop
	}
}
`
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
}

// udpDropped returns how many datagrams the namespace's rule dropped.
func udpDropped(ns string) string {
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "chain", "inet", "sbnoudp", "out").CombinedOutput()
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "counter") {
			return strings.TrimSpace(l)
		}
	}
	return "?"
}

// runChromiumIn starts headless Chromium in namespace ns on page u, its
// microphone playing wav, without a remote-control protocol: the page
// reports its result itself. origin is treated as secure (getUserMedia
// needs it off localhost).
func runChromiumIn(t *testing.T, ns, bin, wav, origin, u string) {
	t.Helper()
	profile := t.TempDir()
	args := []string{"netns", "exec", ns, bin,
		"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
		"--disable-quic", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-default-apps", "--disable-extensions", "--disable-breakpad", "--disable-dev-shm-usage",
		"--password-store=basic", "--use-mock-keychain",
		"--disable-background-timer-throttling", "--disable-renderer-backgrounding", "--disable-backgrounding-occluded-windows",
		"--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream", "--use-file-for-fake-audio-capture=" + wav,
		"--autoplay-policy=no-user-gesture-required",
		"--unsafely-treat-insecure-origin-as-secure=" + origin,
		"--user-data-dir=" + profile,
		u}
	runIn(t, "chromium", exec.Command("ip", args...), profile)
}

// runFirefoxIn starts headless Firefox ESR in namespace ns on page u.
func runFirefoxIn(t *testing.T, ns, bin, u string) {
	t.Helper()
	profile := t.TempDir()
	var prefs strings.Builder
	for k, v := range firefoxPrefs {
		b, _ := json.Marshal(v)
		fmt.Fprintf(&prefs, "user_pref(%q, %s);\n", k, b)
	}
	if err := os.WriteFile(filepath.Join(profile, "user.js"), []byte(prefs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runIn(t, "firefox", exec.Command("ip", "netns", "exec", ns, bin, "--headless", "--no-remote", "--profile", profile, u), profile)
}

// runIn starts cmd (ip netns exec, which execs the browser in place) and
// stops it when the test ends, logging its output on failure.
func runIn(t *testing.T, name string, cmd *exec.Cmd, home string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	c.Env = append(os.Environ(), "HOME="+home, "MOZ_CRASHREPORTER_DISABLE=1")
	var output logbuf.Buffer
	c.Stdout, c.Stderr = &output, &output
	c.WaitDelay = 5 * time.Second
	if err := c.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = c.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, output.String())
		}
	})
}

func TestBrowsersOverTCP(t *testing.T) {
	chromiumBin := chromiumPath(t)
	firefoxBin := firefoxPath(t)
	wav, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	for _, browser := range []string{"chromium", "firefox"} {
		for _, udp := range []bool{false, true} {
			name := browser + map[bool]string{false: "/udp-dropped", true: "/udp-open"}[udp]
			t.Run(name, func(t *testing.T) {
				ns, hostIP, _ := clientNetns(t)
				if !udp {
					dropUDP(t, ns)
				}
				d := startInteropDemo(t, hostIP, "")
				if !d.RelayTCPAddr().IsValid() {
					t.Fatal("the demo's relay has no ICE-TCP listener")
				}
				page, results := startInteropPageOn(t, net.JoinHostPort(hostIP, "0"))
				u := page + "/?shape=complete&api=" + url.QueryEscape(d.URL()+"/v1/calls")
				if browser == "chromium" {
					runChromiumIn(t, ns, chromiumBin, wav, page, u)
				} else {
					runFirefoxIn(t, ns, firefoxBin, u)
				}
				r := waitInterop(t, d, results, 90*time.Second)
				rs := d.Relay().Stats()
				t.Logf("%s: transport %q, connected in %.0f ms; relay UDP %d in / %d out, TCP %d connections, %d frames in / %d out; namespace UDP drop rule: %s",
					name, r.Transport, r.ConnectedMs, rs.ToTransceiverPackets, rs.ToClientPackets, rs.TCP.Accepted,
					rs.TCP.ToTransceiverFrames, rs.TCP.ToClientFrames, udpDropped(ns))
				want := map[bool]string{false: "tcp", true: "udp"}[udp]
				if r.Transport != want {
					t.Errorf("selected transport %q, want %s", r.Transport, want)
				}
				if udp {
					if rs.ToTransceiverPackets <= 50 || rs.ToClientPackets <= 50 {
						t.Errorf("UDP open: the relay forwarded %d UDP datagrams in and %d out, want > 50 each", rs.ToTransceiverPackets, rs.ToClientPackets)
					}
					return
				}
				if rs.ToTransceiverPackets != 0 || rs.ToClientPackets != 0 {
					t.Errorf("UDP dropped, yet the relay forwarded %d UDP datagrams in and %d out", rs.ToTransceiverPackets, rs.ToClientPackets)
				}
				if rs.TCP.ToTransceiverFrames <= 50 || rs.TCP.ToClientFrames <= 50 {
					t.Errorf("the relay forwarded %d TCP frames in and %d out, want > 50 each", rs.TCP.ToTransceiverFrames, rs.TCP.ToClientFrames)
				}
			})
		}
	}
}
