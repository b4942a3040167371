package e2e

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/demo"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/chromium"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// Interop tests: real clients other than the demo page call the demo, each
// completing a call through the relay with audio and a data-channel echo
// (docs/interop.md). A page on its own origin (testdata/interop.html, served
// by the test) runs the browser calls and reports to the test's server, so
// the same page drives any browser without a remote-control protocol.

//go:embed testdata/interop.html
var interopPage []byte

// interopResult is what testdata/interop.html reports.
type interopResult struct {
	OK              bool     `json:"ok"`
	Error           string   `json:"error"`
	UserAgent       string   `json:"userAgent"`
	Shape           string   `json:"shape"`
	Steps           []string `json:"steps"`
	OfferCandidates int      `json:"offerCandidates"`
	Status          int      `json:"status"`
	ConnectedMs     float64  `json:"connectedMs"`
	DCEcho          bool     `json:"dcEcho"`
	PacketsReceived int      `json:"packetsReceived"`
	PeakLevel       float64  `json:"peakLevel"`
	// TotalAudioEnergy is inbound-rtp's (W3C webrtc-stats), where reported.
	TotalAudioEnergy float64 `json:"totalAudioEnergy"`
	// Transport is the selected candidate pair's local protocol, "udp" or
	// "tcp" (webrtc-stats), empty if the browser did not say.
	Transport string `json:"transport"`
	// MaxGapMs and ConnectionState are reported after a hold=MS call: the
	// longest time no audio packet came, and the state at its end.
	MaxGapMs        float64 `json:"maxGapMs"`
	ConnectionState string  `json:"connectionState"`
}

// startInteropPage serves the interop page on an origin of its own (so the
// signaling calls are cross-origin, as from a developer's site) and returns
// its URL and the channel its result arrives on.
func startInteropPage(t *testing.T) (string, <-chan interopResult) {
	t.Helper()
	return startInteropPageOn(t, "127.0.0.1:0")
}

// startInteropPageOn is startInteropPage listening on addr.
func startInteropPageOn(t *testing.T, addr string) (string, <-chan interopResult) {
	t.Helper()
	results := make(chan interopResult, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(interopPage)
	})
	mux.HandleFunc("POST /result", func(w http.ResponseWriter, r *http.Request) {
		var res interopResult
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err := json.Unmarshal(b, &res); err != nil {
			res = interopResult{Error: fmt.Sprintf("bad result %q: %v", b, err)}
		}
		select {
		case results <- res:
		default:
		}
	})
	mux.HandleFunc("GET /favicon.ico", http.NotFound)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(mux)
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, results
}

// startInteropDemo starts the demo on ip (HTTP and relay), its
// transceiver negotiating DTLS up to version ("1.2", "1.3"; "": the
// default), with its log kept for failures.
func startInteropDemo(t *testing.T, ip, version string) *demo.Demo {
	t.Helper()
	return startTestDemo(t, demo.Config{
		HTTPAddr:    net.JoinHostPort(ip, "0"),
		RelayAddr:   net.JoinHostPort(ip, "0"),
		Agent:       agent.ModeEcho, // the clients check they hear their audio back
		DTLSVersion: version,
	}, slog.LevelDebug, nil)
}

// dtlsVersions are the transceiver's DTLS settings every interop client
// is tried with, and the version each client then negotiates: Chromium 156
// and Firefox ESR 153 take DTLS 1.3 when it is offered; GStreamer's
// webrtcbin (OpenSSL's DTLS, 1.2 only) and Pion (pion/dtls v3) stay on 1.2.
var dtlsVersions = []string{"1.2", "1.3"}

// negotiated is the DTLS version a client negotiates with a transceiver
// whose highest version is setting: the lower of the two.
func negotiated(setting, clientMax string) string { return min(setting, clientMax) }

// waitInterop waits for the page's result and checks the call: connected,
// data-channel echo, more than 50 audio packets back with sound in them,
// and the relay forwarding both ways.
func waitInterop(t *testing.T, d *demo.Demo, results <-chan interopResult, timeout time.Duration) interopResult {
	t.Helper()
	var r interopResult
	select {
	case r = <-results:
	case <-time.After(timeout):
		t.Fatalf("no result from the page in %v", timeout)
	}
	t.Logf("%s (%s): %s", r.UserAgent, r.Shape, strings.Join(r.Steps, "; "))
	if !r.OK {
		rs := d.Relay().Stats()
		drops := map[string]uint64{}
		for i, n := range rs.Drops {
			if n > 0 {
				drops[relay.DropReason(i).String()] = n
			}
		}
		t.Fatalf("call failed: %s\nrelay: flows %d, to transceiver %d, to client %d, drops %v, TCP %+v; transceiver hop %+v",
			r.Error, rs.Flows, rs.ToTransceiverPackets, rs.ToClientPackets, drops, rs.TCP, d.Transceiver().HopStats())
	}
	if !r.DCEcho || r.PacketsReceived <= 50 || (r.PeakLevel <= 0.01 && r.TotalAudioEnergy <= 0) {
		t.Fatalf("data-channel echo %v, %d audio packets back, peak level %.3f, total audio energy %.4f; want an echo, > 50 packets and sound",
			r.DCEcho, r.PacketsReceived, r.PeakLevel, r.TotalAudioEnergy)
	}
	rs := d.Relay().Stats()
	// UDP datagrams and ICE-TCP frames alike.
	if in, out := rs.ToTransceiverPackets+rs.TCP.ToTransceiverFrames, rs.ToClientPackets+rs.TCP.ToClientFrames; in <= 50 || out <= 50 {
		t.Errorf("relay forwarded %d packets to the transceiver and %d to the client, want > 50 each", in, out)
	}
	if hs := d.Transceiver().HopStats(); hs.DroppedNotHop != 0 {
		t.Errorf("transceiver dropped %d datagrams without a hop header (something bypassed the relay)", hs.DroppedNotHop)
	}
	return r
}

// dtlsHandshakes returns the demo's switchboard_transceiver_dtls_handshakes_total
// that are not 0, by their labels ("1.3" or "1.3 in_stun"), from /metrics.
func dtlsHandshakes(t *testing.T, d *demo.Demo) map[string]int {
	t.Helper()
	resp, err := http.Get(d.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^switchboard_transceiver_dtls_handshakes_total\{in_stun="(\w+)",version="([\d.]+)"\} (\d+)$`)
	got := map[string]int{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.Atoi(m[3])
		if n == 0 {
			continue
		}
		k := m[2]
		if m[1] == "true" {
			k += " in_stun"
		}
		got[k] += n
	}
	return got
}

// checkDTLS checks that every DTLS handshake of the demo negotiated want
// ("1.2", "1.3", or "1.3 in_stun" for SPED), and logs what they did.
func checkDTLS(t *testing.T, d *demo.Demo, client, want string) {
	t.Helper()
	got := dtlsHandshakes(t, d)
	t.Logf("%s: DTLS handshakes by version negotiated: %v", client, got)
	if len(got) != 1 || got[want] == 0 {
		t.Errorf("%s: DTLS handshakes %v, want all %s", client, got, want)
	}
}

// TestOpenAISnippetChromium runs, in Chromium, a call shaped exactly as
// OpenAI's Realtime browser snippet makes it: the offer is POSTed right
// after setLocalDescription, before any candidate is gathered, to
// …/realtime/calls?model=…, with a Bearer header (a CORS preflight from the
// page's origin). The server learns the client's address from its checks.
func TestOpenAISnippetChromium(t *testing.T) {
	for _, v := range dtlsVersions {
		t.Run("dtls"+v, func(t *testing.T) { testOpenAISnippetChromium(t, v) })
	}
}

func testOpenAISnippetChromium(t *testing.T, version string) {
	chromiumBin := chromiumPath(t)
	wav, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	d := startInteropDemo(t, "127.0.0.1", version)
	page, results := startInteropPage(t)
	ctx := startBrowser(t, chromiumBin, wav)
	u := page + "/?shape=openai&api=" + url.QueryEscape(d.URL()+"/v1/realtime/calls")
	if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
		t.Fatalf("navigate to %s: %v", u, err)
	}
	r := waitInterop(t, d, results, 60*time.Second)
	checkDTLS(t, d, "chromium", negotiated(version, "1.3"))
	if r.OfferCandidates != 0 {
		t.Errorf("the offer carried %d candidates; the snippet's shape has none", r.OfferCandidates)
	}
}

// TestChromiumSPED runs the OpenAI snippet's call from Chromium with its
// field trial WebRTC-IceHandshakeDtls, which offers
// a=ice-options:sped googspedv1 and carries the DTLS handshake in the ICE
// checks: the answer has the options (a=setup:passive, the transceiver the
// DTLS server), the handshake is DTLS 1.3 and the client's datagrams came
// inside its checks (internal/peer sped.go). Chromium 156's ClientHello
// carries a post-quantum key share and spans two datagrams; without it
// (--disable-features=WebRtcPqcForDtls) the transceiver's whole first
// flight rides the response to the first check. With the transceiver's
// SPED off (NoSPED) the same browser gets a plain handshake.
func TestChromiumSPED(t *testing.T) {
	for _, tc := range []struct {
		name  string
		off   bool
		extra []chromedp.ExecAllocatorOption
	}{
		{"sped", false, nil},
		{"sped without post-quantum key share", false, []chromedp.ExecAllocatorOption{chromium.NoPQDTLS()}},
		{"sped off", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chromiumBin := chromiumPath(t)
			wav, err := filepath.Abs(filepath.Join("..", "..", "testdata", "speech.wav"))
			if err != nil {
				t.Fatal(err)
			}
			d := startTestDemo(t, demo.Config{
				HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Agent: agent.ModeEcho,
				NoSPED: tc.off,
			}, slog.LevelDebug, nil)
			page, results := startInteropPage(t)
			ctx := startBrowser(t, chromiumBin, wav, append(tc.extra, chromium.FieldTrials(chromium.SPEDFieldTrial))...)
			u := page + "/?shape=openai&api=" + url.QueryEscape(d.URL()+"/v1/realtime/calls")
			if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
				t.Fatalf("navigate to %s: %v", u, err)
			}
			waitInterop(t, d, results, 60*time.Second)
			in, out := spedDatagrams(t, d)
			t.Logf("DTLS datagrams in the checks: %d from the client, %d to it in Binding responses", in, out)
			switch {
			case tc.off:
				checkDTLS(t, d, "chromium, SPED off", "1.3")
				if in+out != 0 {
					t.Errorf("SPED off, yet %d datagrams rode the checks", in+out)
				}
			default:
				checkDTLS(t, d, "chromium with WebRTC-IceHandshakeDtls", "1.3 in_stun")
				if in == 0 {
					t.Error("no DTLS datagram of the client's came in a check")
				}
				if tc.extra != nil && out == 0 {
					t.Error("the transceiver's first flight rode no Binding response")
				}
			}
		})
	}
}

// spedDatagrams returns the demo's switchboard_transceiver_sped_datagrams_total
// from_client and to_client, from /metrics.
func spedDatagrams(t *testing.T, d *demo.Demo) (in, out int) {
	t.Helper()
	resp, err := http.Get(d.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^switchboard_transceiver_sped_datagrams_total\{direction="(\w+)"\} (\d+)$`).FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.Atoi(m[2])
		if m[1] == "from_client" {
			in = n
		} else {
			out = n
		}
	}
	return in, out
}

// firefoxPrefs make a headless Firefox ESR call on this machine: a fake
// microphone (a tone) granted without a prompt, even on an http:// origin
// that is not localhost, audio allowed to play, and nothing reaching out to
// the network on its own.
var firefoxPrefs = map[string]any{
	"media.navigator.streams.fake":               true,
	"media.navigator.permission.disabled":        true,
	"media.devices.insecure.enabled":             true,
	"media.getusermedia.insecure.enabled":        true,
	"media.autoplay.default":                     0,
	"media.autoplay.block-webaudio":              false,
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

func firefoxPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"firefox-esr", "firefox"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "Firefox is not installed (Debian: apt-get install firefox-esr, or scripts/deps.sh test)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "; CI is set, and in CI a missing tool is an error")
	}
	t.Skip(msg)
	return ""
}

// netnsCount numbers the namespaces clientNetns makes.
var netnsCount atomic.Int32

// clientNetns creates a network namespace for a client, joined to this one
// by a veth pair, and returns its name and the two ends' addresses: the
// host end (where the demo listens) and the client's. It is removed when
// the test ends.
//
// Firefox needs it: ESR 153 gathers no loopback candidate, whatever
// media.peerconnection.ice.loopback says (its ICE log lists only the
// machine's other interfaces), and does not pair its other candidates with
// a loopback remote one, so it cannot reach a relay on 127.0.0.1. In the
// namespace, its one interface faces the demo's address on the veth pair.
func clientNetns(t *testing.T) (ns, hostIP, clientIP string) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root (a network namespace for the client)"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "needs ip from iproute2"
	}
	if why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s, and CI is set: run as root with iproute2 installed (scripts/deps.sh test)", why)
		}
		t.Skip(why)
	}
	n, k := os.Getpid()%200, netnsCount.Add(1)%64 // a test may make several, one /30 each
	ns = fmt.Sprintf("sbinterop%d-%d", os.Getpid(), k)
	host, peer := fmt.Sprintf("sbih%d-%d", os.Getpid(), k), fmt.Sprintf("sbic%d-%d", os.Getpid(), k)
	hostIP, clientIP = fmt.Sprintf("10.214.%d.%d", n, 4*k+1), fmt.Sprintf("10.214.%d.%d", n, 4*k+2)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() }) // takes the veth pair with it
	ip("link", "add", host, "type", "veth", "peer", "name", peer)
	ip("link", "set", peer, "netns", ns)
	ip("addr", "add", hostIP+"/30", "dev", host)
	ip("link", "set", host, "up")
	ip("-n", ns, "addr", "add", clientIP+"/30", "dev", peer)
	ip("-n", ns, "link", "set", peer, "up")
	ip("-n", ns, "link", "set", "lo", "up")
	return ns, hostIP, clientIP
}

// TestFirefoxCall runs a call from headless Firefox ESR, in a network
// namespace of its own (clientNetns), with the offer after ICE gathering,
// as a WHIP client sends it, to /v1/calls.
func TestFirefoxCall(t *testing.T) {
	for _, v := range dtlsVersions {
		t.Run("dtls"+v, func(t *testing.T) { testFirefoxCall(t, v) })
	}
}

func testFirefoxCall(t *testing.T, version string) {
	bin := firefoxPath(t)
	ns, hostIP, _ := clientNetns(t)
	d := startInteropDemo(t, hostIP, version)
	page, results := startInteropPageOn(t, net.JoinHostPort(hostIP, "0"))
	profile := t.TempDir()
	var prefs strings.Builder
	for k, v := range firefoxPrefs {
		b, _ := json.Marshal(v)
		fmt.Fprintf(&prefs, "user_pref(%q, %s);\n", k, b)
	}
	if err := os.WriteFile(filepath.Join(profile, "user.js"), []byte(prefs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	u := page + "/?shape=complete&api=" + url.QueryEscape(d.URL()+"/v1/calls")
	ctx, cancel := context.WithCancel(context.Background())
	var output logbuf.Buffer
	// ip netns exec execs Firefox in place: cancel kills Firefox itself.
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "--headless", "--no-remote", "--profile", profile, u)
	cmd.Env = append(os.Environ(), "HOME="+profile, "MOZ_CRASHREPORTER_DISABLE=1")
	cmd.Stdout, cmd.Stderr = &output, &output
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("firefox output:\n%s", output.String())
		}
	})
	waitInterop(t, d, results, 90*time.Second)
	checkDTLS(t, d, "firefox", negotiated(version, "1.3"))
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		t.Logf("%s", strings.TrimSpace(string(out)))
	}
}

// gstPython returns a Python 3 that has GStreamer's GObject bindings with
// webrtcbin's typelibs (Debian's python3-gst-1.0, gir1.2-gst-plugins-bad-1.0).
func gstPython(t *testing.T) string {
	t.Helper()
	check := `import gi; gi.require_version("Gst", "1.0"); gi.require_version("GstWebRTC", "1.0"); gi.require_version("GstSdp", "1.0")
from gi.repository import Gst; Gst.init(None); assert Gst.ElementFactory.find("webrtcbin") and Gst.ElementFactory.find("nicesrc")`
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", check).Run() == nil {
			return py
		}
	}
	const msg = "GStreamer webrtcbin with libnice and its Python bindings are not installed (scripts/deps.sh test)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "; CI is set, and in CI a missing tool is an error")
	}
	t.Skip(msg)
	return ""
}

// TestGStreamerCall runs a call from GStreamer's webrtcbin with libnice
// (testdata/gst_call.py): a complete offer to /v1/calls, a tone as Opus,
// and a ping on oai-events. libnice gathers no loopback candidate unless
// told to, so the script adds 127.0.0.1 to its agent (README, "Other
// clients on the same host").
func TestGStreamerCall(t *testing.T) {
	for _, v := range dtlsVersions {
		t.Run("dtls"+v, func(t *testing.T) { testGStreamerCall(t, v) })
	}
}

func testGStreamerCall(t *testing.T, version string) {
	py := gstPython(t)
	d := startInteropDemo(t, "127.0.0.1", version)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "gst_call.py"), d.URL()+"/v1/calls",
		"--add-local-ip", "127.0.0.1", "--seconds", "30")
	var stderr logbuf.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res struct {
		GStreamer    string  `json:"gstreamer"`
		Connected    bool    `json:"connected"`
		DCEcho       bool    `json:"dc_echo"`
		AudioBuffers int     `json:"audio_buffers"`
		PeakDB       float64 `json:"peak_db"`
		Status       int     `json:"status"`
		Error        string  `json:"error"`
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("gst_call.py: %v, output %q (%v)\n%s", err, out, jerr, stderr.String())
	}
	t.Logf("%s: %+v", res.GStreamer, res)
	if err != nil || !res.Connected || !res.DCEcho || res.AudioBuffers <= 50 || res.PeakDB <= -60 {
		t.Fatalf("call from webrtcbin: %v %s; want connected, a data-channel echo, > 50 audio buffers back, peak above -60 dB\n%s",
			err, res.Error, stderr.String())
	}
	rs := d.Relay().Stats()
	if rs.ToTransceiverPackets <= 50 || rs.ToClientPackets <= 50 {
		t.Errorf("relay forwarded %d packets to the transceiver and %d to the client, want > 50 each",
			rs.ToTransceiverPackets, rs.ToClientPackets)
	}
	checkDTLS(t, d, "gstreamer", "1.2") // OpenSSL's DTLS: 1.2 only
}
