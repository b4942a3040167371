package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/chromium"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
)

var updateOffers = flag.Bool("update-offers", false, "write the offers the TakesAnswer tests receive to testdata/<client>-<version>-<round>.sdp")

// browserParams are the answer parameters of the client tests: a
// max-message-size the clients do not use themselves, so that their
// reading of it shows.
func browserParams() AnswerParams {
	p := testParams()
	p.MaxMessageSize = 131072
	p.Ptime = 20
	return p
}

// roundResult is what a client reports of one round (testdata/offer.html,
// testdata/gst_offer.py).
type roundResult struct {
	Name           string `json:"name"`
	OK             bool   `json:"ok"`
	Error          string `json:"error"`
	SignalingState string `json:"signalingState"`
	Transceivers   []struct {
		Mid              string `json:"mid"`
		Kind             string `json:"kind"`
		CurrentDirection string `json:"currentDirection"`
	} `json:"transceivers"`
	SCTPMaxMessageSize int      `json:"sctpMaxMessageSize"`
	TrackStreams       []string `json:"trackStreams"`
}

// exchange is the test server a client posts its offers to: it serves
// testdata/offer.html at /, answers POST /offer?round=NAME with Answer
// (400 and the error when ParseOffer refuses the offer), and takes the
// page's results at POST /result.
type exchange struct {
	srv     *httptest.Server
	results chan []roundResult

	mu      sync.Mutex
	offers  map[string]string // round → offer
	answers map[string]string // round → answer
}

func newExchange(t *testing.T) *exchange {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("testdata", "offer.html"))
	if err != nil {
		t.Fatal(err)
	}
	x := &exchange{results: make(chan []roundResult, 1), offers: map[string]string{}, answers: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /favicon.ico", http.NotFound)
	mux.HandleFunc("POST /offer", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		round := r.URL.Query().Get("round")
		x.mu.Lock()
		x.offers[round] = string(body)
		x.mu.Unlock()
		o, err := ParseOffer(string(body))
		if err != nil {
			http.Error(w, "ParseOffer: "+err.Error(), http.StatusBadRequest)
			return
		}
		answer, err := Answer(o, browserParams())
		if err != nil {
			http.Error(w, "Answer: "+err.Error(), http.StatusInternalServerError)
			return
		}
		x.mu.Lock()
		x.answers[round] = answer
		x.mu.Unlock()
		w.Header().Set("Content-Type", "application/sdp")
		_, _ = io.WriteString(w, answer)
	})
	mux.HandleFunc("POST /result", func(w http.ResponseWriter, r *http.Request) {
		var res []roundResult
		if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case x.results <- res:
		default:
		}
	})
	x.srv = httptest.NewServer(mux)
	t.Cleanup(x.srv.Close)
	return x
}

// wait returns the page's results, or fails the test after timeout (a
// client that never reports).
func (x *exchange) wait(t *testing.T, timeout time.Duration) []roundResult {
	t.Helper()
	select {
	case res := <-x.results:
		return res
	case <-time.After(timeout):
		t.Fatalf("no results from the client within %v", timeout)
		return nil
	}
}

// check checks a client's rounds: each took the answer, its audio is
// negotiated sendrecv (the answer's direction seen from the client) with
// our stream, video is rejected, and the data channel's
// max-message-size is ours. browser is false for GStreamer, which does not
// report the SCTP transport's size or tracks before media flows. With
// -update-offers it writes each round's offer to
// testdata/<client>-<round>.sdp.
func (x *exchange) check(t *testing.T, client string, rounds []roundResult, browser bool) {
	t.Helper()
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(rounds) != 2 {
		t.Fatalf("%d rounds reported, want 2: %+v", len(rounds), rounds)
	}
	p := browserParams()
	for _, r := range rounds {
		offer, answer := x.offers[r.Name], x.answers[r.Name]
		if !r.OK {
			t.Errorf("round %s: %s\noffer:\n%s\nanswer:\n%s", r.Name, r.Error, offer, answer)
			continue
		}
		if r.SignalingState != "stable" {
			t.Errorf("round %s: signaling state %q after the answer", r.Name, r.SignalingState)
		}
		o, err := ParseOffer(offer)
		if err != nil {
			t.Fatalf("round %s: %v", r.Name, err)
		}
		// The audio is negotiated sendrecv, the answer's direction seen
		// from the client. A rejected video transceiver is stopped with
		// its mid cleared (Firefox), or gone (Chromium removes stopped
		// transceivers, W3C WebRTC §4.4.1.6); webrtcbin 1.22 clears its mid
		// and leaves its current-direction as offered.
		var audio []string
		for _, tr := range r.Transceivers {
			switch {
			case tr.Kind == "audio":
				audio = append(audio, tr.Mid+":"+tr.CurrentDirection)
			case tr.Kind == "video" && r.Name == "video" && tr.Mid == "" && (!browser || tr.CurrentDirection == "stopped"):
			default:
				t.Errorf("round %s: transceiver %+v", r.Name, tr)
			}
		}
		if want := []string{o.Sections[o.Audio].Mid + ":sendrecv"}; !slices.Equal(audio, want) {
			t.Errorf("round %s: audio transceivers (mid:currentDirection) %q, want %q\nanswer:\n%s", r.Name, audio, want, answer)
		}
		if browser {
			if r.SCTPMaxMessageSize != p.MaxMessageSize {
				t.Errorf("round %s: the SCTP transport's maxMessageSize is %d, the answer's a=max-message-size %d", r.Name, r.SCTPMaxMessageSize, p.MaxMessageSize)
			}
			if want := []string{"audio:" + p.StreamID}; !slices.Equal(r.TrackStreams, want) {
				t.Errorf("round %s: tracks (kind:streams) %q, want %q (a=msid)", r.Name, r.TrackStreams, want)
			}
		}
		if *updateOffers {
			name := filepath.Join("testdata", client+"-"+r.Name+".sdp")
			if err := os.WriteFile(name, []byte(offer), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", name)
		}
	}
}

// requireTool returns the first of names found in PATH; without one the
// test is skipped, except in CI (CI set), where a missing tool is an error.
func requireTool(t *testing.T, what string, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := what + " is not installed (scripts/deps.sh test installs it)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "; CI is set, and in CI a missing tool is an error")
	}
	t.Skip(msg)
	return ""
}

// majorVersion returns the first number in out ("Chromium 156.0…" → "156",
// "Mozilla Firefox 153.8.0esr" → "153"), keeping minor numbers when minor.
func majorVersion(out string, minor bool) string {
	m := regexp.MustCompile(`(\d+)\.(\d+)`).FindStringSubmatch(out)
	switch {
	case m == nil:
		return "unknown"
	case minor:
		return m[1] + "." + m[2]
	default:
		return m[1]
	}
}

// TestChromiumTakesAnswer has headless Chromium make the offers of
// testdata/offer.html and set Answer's answers (setRemoteDescription).
func TestChromiumTakesAnswer(t *testing.T) {
	bin := requireTool(t, "chromium", "chromium", "/usr/bin/chromium")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	client := "chromium-" + majorVersion(string(out), false)
	wav := filepath.Join(t.TempDir(), "silence.wav")
	if err := (&speech.Script{Rate: 48000, Samples: make([]int16, 48000)}).WriteWAV(wav); err != nil {
		t.Fatal(err)
	}
	x := newExchange(t)
	var output logbuf.Buffer
	allocCtx, allocCancel := chromedp.NewExecAllocator(context.Background(), chromium.Options(bin, wav, &output)...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer func() {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_ = chromedp.Cancel(cctx)
		ccancel()
		cancel()
		allocCancel()
		if t.Failed() {
			t.Logf("chromium output (tail):\n%s", output.Tail(8<<10))
		}
	}()
	if err := chromedp.Do(ctx, chromedp.Navigate(x.srv.URL)); err != nil {
		t.Fatal(err)
	}
	x.check(t, client, x.wait(t, 60*time.Second), true)
}

// firefoxPrefs give headless Firefox a fake microphone granted without a
// prompt, and keep it from reaching out to the network on its own.
var firefoxPrefs = map[string]any{
	"media.navigator.streams.fake":               true,
	"media.navigator.permission.disabled":        true,
	"browser.shell.checkDefaultBrowser":          false,
	"browser.aboutwelcome.enabled":               false,
	"app.update.auto":                            false,
	"datareporting.policy.dataSubmissionEnabled": false,
	"datareporting.healthreport.uploadEnabled":   false,
	"toolkit.telemetry.enabled":                  false,
	"network.captive-portal-service.enabled":     false,
	"network.connectivity-service.enabled":       false,
	"browser.safebrowsing.malware.enabled":       false,
	"browser.safebrowsing.phishing.enabled":      false,
	"extensions.update.enabled":                  false,
	"services.settings.server":                   "http://127.0.0.1:9/",
	"network.dns.disablePrefetch":                true,
}

// TestFirefoxTakesAnswer has headless Firefox ESR make the offers of
// testdata/offer.html and set Answer's answers.
func TestFirefoxTakesAnswer(t *testing.T) {
	bin := requireTool(t, "Firefox ESR", "firefox-esr", "firefox")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	client := "firefox-esr-" + majorVersion(string(out), false)
	profile := t.TempDir()
	var prefs strings.Builder
	for k, v := range firefoxPrefs {
		b, _ := json.Marshal(v)
		fmt.Fprintf(&prefs, "user_pref(%q, %s);\n", k, b)
	}
	if err := os.WriteFile(filepath.Join(profile, "user.js"), []byte(prefs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	x := newExchange(t)
	ctx, cancel := context.WithCancel(context.Background())
	var output logbuf.Buffer
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-remote", "--profile", profile, x.srv.URL)
	cmd.Env = append(os.Environ(), "HOME="+profile, "MOZ_CRASHREPORTER_DISABLE=1")
	cmd.Stdout, cmd.Stderr = &output, &output
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("firefox output:\n%s", output.String())
		}
	}()
	x.check(t, client, x.wait(t, 90*time.Second), true)
}

// TestGStreamerTakesAnswer has GStreamer's webrtcbin make offers and set
// Answer's answers (testdata/gst_offer.py).
func TestGStreamerTakesAnswer(t *testing.T) {
	py := requireTool(t, "python3", "/usr/bin/python3", "python3")
	check := `import gi; gi.require_version("Gst", "1.0"); gi.require_version("GstWebRTC", "1.0"); gi.require_version("GstSdp", "1.0")`
	if out, err := exec.Command(py, "-c", check).CombinedOutput(); err != nil {
		msg := fmt.Sprintf("GStreamer's Python bindings with webrtcbin are not installed (scripts/deps.sh test): %s", bytes.TrimSpace(out))
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	x := newExchange(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var stderr logbuf.Buffer
	cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "gst_offer.py"), x.srv.URL)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res struct {
		GStreamer string        `json:"gstreamer"`
		Rounds    []roundResult `json:"rounds"`
	}
	if jerr := json.Unmarshal(out, &res); err != nil || jerr != nil {
		t.Fatalf("gst_offer.py: %v, output %q (%v)\n%s", err, out, jerr, stderr.String())
	}
	x.check(t, "gstreamer-"+majorVersion(res.GStreamer, true), res.Rounds, false)
	if t.Failed() {
		t.Logf("gst_offer.py's stderr:\n%s", stderr.String())
	}
}

// TestSavedOffers answers the offers captured from Chromium, Firefox ESR
// and GStreamer (testdata/*.sdp, see above) and checks each answer's
// structure: every m-section answered in order with its mid, audio and
// data in BUNDLE, video rejected, Opus at the client's payload type.
func TestSavedOffers(t *testing.T) {
	type savedOffer struct {
		file     string
		opusPT   uint8
		opusFmtp string
		maxMsg   int // the offer's a=max-message-size
		want     []string
	}
	cases := []savedOffer{
		{"chromium-156-audio.sdp", 111, "minptime=10;useinbandfec=1", 262144, []string{"audio sendrecv", "application"}},
		{"chromium-156-video.sdp", 111, "minptime=10;useinbandfec=1", 262144, []string{"audio sendrecv", "video rejected", "application"}},
		{"firefox-esr-153-audio.sdp", 109, "maxplaybackrate=48000;stereo=1;useinbandfec=1", 1073741823, []string{"audio sendrecv", "application"}},
		{"firefox-esr-153-video.sdp", 109, "maxplaybackrate=48000;stereo=1;useinbandfec=1", 1073741823, []string{"audio sendrecv", "video rejected", "application"}},
		// webrtcbin: max-bundle (data and video bundle-only at port 0),
		// OPUS/48000 without a channel count, no a=max-message-size, and
		// an a=fmtp only once the encoder's caps are known.
		{"gstreamer-1.22-audio.sdp", 111, "", 65536, []string{"audio sendrecv", "application"}},
		{"gstreamer-1.22-video.sdp", 111, "sprop-stereo=0;sprop-maxcapturerate=48000", 65536, []string{"audio sendrecv", "video rejected", "application"}},
	}
	files, err := filepath.Glob(filepath.Join("testdata", "*.sdp"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !slices.ContainsFunc(cases, func(c savedOffer) bool { return c.file == filepath.Base(f) }) {
			t.Errorf("%s has no case in TestSavedOffers", f)
		}
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			o, err := ParseOffer(string(b))
			if err != nil {
				t.Fatal(err)
			}
			a, d := o.Sections[o.Audio], o.Sections[o.Data]
			if a.OpusPT != tc.opusPT || a.OpusFmtp != tc.opusFmtp || d.MaxMessageSize != tc.maxMsg || d.SCTPPort != 5000 {
				t.Errorf("Opus %d %q, max-message-size %d, sctp-port %d; want Opus %d %q, %d, 5000",
					a.OpusPT, a.OpusFmtp, d.MaxMessageSize, d.SCTPPort, tc.opusPT, tc.opusFmtp, tc.maxMsg)
			}
			if o.Setup != "actpass" || len(o.Fingerprints) != 1 || o.Fingerprints[0].Hash != "sha-256" {
				t.Errorf("setup %q, fingerprints %v", o.Setup, o.Fingerprints)
			}
			p := testParams()
			answer, err := Answer(o, p)
			if err != nil {
				t.Fatal(err)
			}
			checkAnswer(t, o, p, answer, tc.want, true)
		})
	}
}
