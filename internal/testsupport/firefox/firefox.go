// Package firefox runs headless Firefox ESR for tests and benchmarks: the
// binary, a profile whose preferences make a call without a prompt (a fake
// microphone, autoplay, nothing reaching out to the network) and a
// network namespace for it.
//
// Firefox needs the namespace: ESR 153 gathers no loopback candidate,
// whatever media.peerconnection.ice.loopback says, and does not pair its
// other candidates with a loopback remote one, so it cannot reach a server
// on 127.0.0.1. In the namespace its one interface faces the host end of a
// veth pair, where the servers it calls listen. Creating the namespace
// needs root and iproute2's ip.
//
// There is no remote-control protocol here: the page Firefox opens drives
// itself and reports over HTTP (internal/testsupport/e2e's interop page, bench/setup's
// call page).
package firefox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"time"
)

// ErrNotInstalled: no Firefox binary on PATH.
var ErrNotInstalled = errors.New("firefox: not installed (Debian: apt-get install firefox-esr, or scripts/deps.sh test)")

// ErrNoNetns: the namespace cannot be made here (not root, or no ip).
var ErrNoNetns = errors.New("firefox: a network namespace needs root and iproute2's ip")

// Path returns the Firefox binary (firefox-esr first), or ErrNotInstalled.
func Path() (string, error) {
	for _, name := range []string{"firefox-esr", "firefox"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNotInstalled
}

// Prefs make a headless Firefox ESR call on this machine: a fake
// microphone (a tone) granted without a prompt, even on an http:// origin
// that is not localhost, audio allowed to play, timers at full precision
// (a benchmark reads performance.timeOrigin), and nothing reaching out to
// the network on its own.
var Prefs = map[string]any{
	"media.navigator.streams.fake":               true,
	"media.navigator.permission.disabled":        true,
	"media.devices.insecure.enabled":             true,
	"media.getusermedia.insecure.enabled":        true,
	"media.autoplay.default":                     0,
	"media.autoplay.block-webaudio":              false,
	"privacy.reduceTimerPrecision":               false,
	"browser.shell.checkDefaultBrowser":          false,
	"browser.startup.homepage_override.mstone":   "ignore",
	"browser.aboutwelcome.enabled":               false,
	"app.update.auto":                            false,
	"app.update.enabled":                         false,
	"datareporting.policy.dataSubmissionEnabled": false,
	"datareporting.healthreport.uploadEnabled":   false,
	"toolkit.telemetry.enabled":                  false,
	"network.captive-portal-service.enabled":     false,
	"network.connectivity-service.enabled":       false,
	"browser.safebrowsing.malware.enabled":       false,
	"browser.safebrowsing.phishing.enabled":      false,
	"browser.safebrowsing.downloads.enabled":     false,
	"extensions.update.enabled":                  false,
	"extensions.getAddons.cache.enabled":         false,
	"services.settings.server":                   "http://127.0.0.1:9/",
	"network.dns.disablePrefetch":                true,
	"network.prefetch-next":                      false,
	"browser.newtabpage.enabled":                 false,
}

// Netns is a network namespace joined to this one by a veth pair: HostIP
// is this side's end (where servers the browser calls listen), ClientIP
// the namespace's.
type Netns struct {
	Name, HostIP, ClientIP string
}

var nsSeq atomic.Uint32

// NewNetns creates a namespace with a /30 on a veth pair, named after the
// process so that parallel runs do not collide. Close removes it.
func NewNetns() (*Netns, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNoNetns
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, ErrNoNetns
	}
	seq := nsSeq.Add(1)
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, seq)
	n := (os.Getpid() + int(seq)*37) % 250
	ns := &Netns{Name: "sbff" + id, HostIP: fmt.Sprintf("10.215.%d.1", n), ClientIP: fmt.Sprintf("10.215.%d.2", n)}
	host, peer := "sbfh"+id, "sbfc"+id
	steps := [][]string{
		{"netns", "add", ns.Name},
		{"link", "add", host, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", ns.Name},
		{"addr", "add", ns.HostIP + "/30", "dev", host},
		{"link", "set", host, "up"},
		{"-n", ns.Name, "addr", "add", ns.ClientIP + "/30", "dev", peer},
		{"-n", ns.Name, "link", "set", peer, "up"},
		{"-n", ns.Name, "link", "set", "lo", "up"},
	}
	for i, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			if i > 0 {
				ns.Close()
			}
			return nil, fmt.Errorf("firefox: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return ns, nil
}

// Close removes the namespace, and the veth pair with it.
func (ns *Netns) Close() { _ = exec.Command("ip", "netns", "del", ns.Name).Run() }

// Browser is one headless Firefox process.
type Browser struct {
	cmd     *exec.Cmd
	profile string
	done    chan struct{}
	// Version is `firefox --version`, e.g. "Mozilla Firefox 153.8.0esr".
	Version string
}

// Start runs headless Firefox in ns (nil: this namespace) on a fresh
// profile with Prefs, opening url; its output goes to out.
func Start(bin string, ns *Netns, url string, out io.Writer) (*Browser, error) {
	profile, err := os.MkdirTemp("", "firefox-profile-")
	if err != nil {
		return nil, err
	}
	var prefs strings.Builder
	for k, v := range Prefs {
		b, _ := json.Marshal(v)
		fmt.Fprintf(&prefs, "user_pref(%q, %s);\n", k, b)
	}
	if err := os.WriteFile(filepath.Join(profile, "user.js"), []byte(prefs.String()), 0o644); err != nil {
		_ = os.RemoveAll(profile)
		return nil, err
	}
	args := []string{bin, "--headless", "--no-remote", "--profile", profile, url}
	if ns != nil {
		// ip netns exec execs Firefox in place: killing the process
		// kills Firefox itself.
		args = append([]string{"ip", "netns", "exec", ns.Name}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "HOME="+profile, "MOZ_CRASHREPORTER_DISABLE=1")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(profile)
		return nil, err
	}
	b := &Browser{cmd: cmd, profile: profile, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(b.done)
	}()
	b.Version = "Firefox"
	if v, err := exec.Command(bin, "--version").Output(); err == nil {
		b.Version = strings.TrimSpace(string(v))
		if m := regexp.MustCompile(`[0-9]+\.[0-9.]+(esr)?`).FindString(b.Version); m != "" {
			b.Version = "Firefox " + m
		}
	}
	return b, nil
}

// Done is closed when the process has exited.
func (b *Browser) Done() <-chan struct{} { return b.done }

// Close kills Firefox, waits for it and removes its profile.
func (b *Browser) Close() {
	_ = b.cmd.Process.Kill()
	<-b.done
	_ = os.RemoveAll(b.profile)
}
