package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/demo"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/chromium"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// The browser test drives a real Chromium through the whole demo: the page
// gets the fake microphone (testdata/speech.wav), POSTs its offer to the
// transceiver, and ICE, DTLS, SCTP and SRTP all flow through the relay on
// loopback. The echo agent sends the speech back, so the page must receive
// audio with energy in it.

// screenshotEnv names a file for a PNG of the connected page, for looking at
// the page by hand; the test takes no screenshot when it is empty.
const screenshotEnv = "SWITCHBOARD_DEMO_SCREENSHOT"

func TestBrowserCall(t *testing.T) {
	chromium := chromiumPath(t)
	wav, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(wav); err != nil {
		t.Fatalf("fake microphone input: %v", err)
	}
	start := time.Now()

	// Cleanups run last-registered first, so the browser (registered below)
	// stops before the demo closes.
	d := startTestDemo(t, demo.Config{
		HTTPAddr:  "127.0.0.1:0",
		RelayAddr: "127.0.0.1:0",
		Agent:     agent.ModeEcho, // the test hears its own audio back
	}, slog.LevelDebug, nil)

	ctx := startBrowser(t, chromium, wav)
	if err := chromedp.Do(ctx, chromedp.Navigate(d.URL()+"/")); err != nil {
		t.Fatalf("navigate to %s: %v", d.URL(), err)
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`void window.switchboard.call()`)); err != nil {
		t.Fatalf("call(): %v", err)
	}

	s := waitPage(t, ctx, "peer connection connected", 20*time.Second, func(s pageState) bool {
		return s.State == "connected" && s.BodyState == "connected"
	})
	t.Logf("connected: setup (POST → connected) %.0f ms, session %s", deref(s.SetupMs), deref(s.Location))
	// The page pings as soon as its data channel opens.
	s = waitPage(t, ctx, "data-channel echo", 7*time.Second, func(s pageState) bool { return s.DCEcho })
	t.Logf("data-channel echo: %.1f ms", deref(s.EchoMs))
	// The echo has no turn detection: "Speaking now" follows the
	// microphone (it stayed on "nobody" for you), and the hint says what
	// the echo does.
	waitShown(t, ctx, `"Speaking now" naming you`, func(sh shown) bool { return strings.HasPrefix(sh.Speaking, "Speaking now: you") })
	if h, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("hint").textContent`)); err != nil || !strings.Contains(h, "comes straight back") {
		t.Errorf("echo hint %q (%v)", h, err)
	}
	if sh := readShown(t, ctx); sh.Agent != "echo" || sh.PingDisabled || !strings.HasSuffix(sh.Echo, " ms") {
		t.Errorf("echo page: agent %q, Ping disabled %v, data-channel echo row %q; want echo, false, a round trip", sh.Agent, sh.PingDisabled, sh.Echo)
	}
	s = waitPage(t, ctx, "echoed speech (inbound-rtp packetsReceived > 50, totalAudioEnergy > 0)", 20*time.Second, func(s pageState) bool {
		return s.Stats.PacketsReceived > 50 && s.Stats.TotalAudioEnergy > 0
	})
	t.Logf("page stats: sent %d, received %d, lost %d, jitter %.1f ms, rtt %.1f ms, audio level %.3f, total audio energy %.3f",
		s.Stats.PacketsSent, s.Stats.PacketsReceived, s.Stats.PacketsLost, deref(s.Stats.JitterMs), deref(s.Stats.RTTMs),
		s.Stats.AudioLevel, s.Stats.TotalAudioEnergy)
	if s.Stats.PacketsSent <= 50 {
		t.Errorf("outbound-rtp packetsSent = %d, want > 50", s.Stats.PacketsSent)
	}
	if s.State != "connected" {
		t.Errorf("state = %q after the media checks, want connected", s.State)
	}

	if path := os.Getenv(screenshotEnv); path != "" {
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Errorf("screenshot: %v", err)
		} else if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Errorf("screenshot: %v", err)
		} else {
			t.Logf("screenshot of the connected page in %s", path)
		}
	}

	// Everything the browser sent and received went through the relay, and
	// nothing reached the transceiver around it.
	rs := d.Relay().Stats()
	t.Logf("relay: flows %d, to transceiver %d packets, to client %d packets, drops %d",
		rs.Flows, rs.ToTransceiverPackets, rs.ToClientPackets, rs.Dropped())
	if rs.ToTransceiverPackets <= 50 || rs.ToClientPackets <= 50 {
		t.Errorf("relay forwarded %d packets to the transceiver and %d to the client, want > 50 each",
			rs.ToTransceiverPackets, rs.ToClientPackets)
	}
	hs := d.Transceiver().HopStats()
	t.Logf("transceiver hop: %+v", hs)
	if hs.DroppedNotHop != 0 {
		t.Errorf("transceiver dropped %d datagrams without a hop header, want 0 (something bypassed the relay)", hs.DroppedNotHop)
	}
	if n := d.Transceiver().Sessions(); n != 1 {
		t.Errorf("transceiver has %d sessions during the call, want 1", n)
	}

	// ICE restart from the page (RFC 9725 PATCH): Chromium's own restart
	// gets a fresh token ufrag, and audio and the data channel carry on.
	before := s.Stats.PacketsReceived
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.restartIce()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("restartIce(): %v", err)
	}
	s = waitPage(t, ctx, "ICE connected again after restartIce()", 10*time.Second, func(s pageState) bool {
		if s.Restart.Error != nil {
			t.Fatalf("restartIce(): %s", *s.Restart.Error)
		}
		return s.Restart.Count == 1 && s.Restart.ConnectedMs != nil
	})
	t.Logf("ICE restart: PATCH answered and applied in %.1f ms, ICE connected again after %.1f ms, ETag %s",
		deref(s.Restart.PatchMs), deref(s.Restart.ConnectedMs), deref(s.ETag))
	if !strings.HasSuffix(deref(s.ETag), `/2"`) {
		t.Errorf("ETag after one restart is %s, want generation 2", deref(s.ETag))
	}
	s = waitPage(t, ctx, "audio after the ICE restart", 10*time.Second, func(s pageState) bool {
		return s.Stats.PacketsReceived > before+50
	})
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.dcEcho = false; window.switchboard.ping()`)); err != nil {
		t.Fatalf("ping(): %v", err)
	}
	waitPage(t, ctx, "data-channel echo after the ICE restart", 5*time.Second, func(s pageState) bool { return s.DCEcho })
	if got := metricLines(ctx, `switchboard_transceiver_ice_restarts_total{result="ok"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("metrics: %s, want 1 ICE restart ok", got)
	}

	// hangup() DELETEs the session URL, then closes the peer connection.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.hangup()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("hangup(): %v", err)
	}
	waitSessions(t, d, 0, "after hangup")
	checkHungUp(t, ctx)
	pageLog, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("log").textContent`))
	if err != nil {
		t.Fatalf("read the page log: %v", err)
	}
	if m := deleteStatus.FindStringSubmatch(pageLog); m == nil || m[1] != "204" {
		t.Errorf("hangup: want the page's DELETE to answer 204; page log:\n%s", pageLog)
	}

	// So that the DELETE itself is what ends a live session, call again from
	// the same page and DELETE while the peer connection is still up.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`void window.switchboard.call()`)); err != nil {
		t.Fatalf("second call(): %v", err)
	}
	s = waitPage(t, ctx, "second call connected", 20*time.Second, func(s pageState) bool {
		return s.State == "connected" && s.Location != nil
	})
	waitSessions(t, d, 1, "during the second call")
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](
		`fetch(window.switchboard.location, {method: "DELETE"}).then((r) => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("DELETE %s: %v", deref(s.Location), err)
	}
	if status != 204 {
		t.Errorf("DELETE of a live session answered %d, want 204", status)
	}
	waitSessions(t, d, 0, "after the DELETE")
	// The server tells the page it ended the call (a switchboard.session.end
	// event on oai-events, then DTLS close_notify) and the page shows it.
	waitPage(t, ctx, "the page shows the call ended by the server", 5*time.Second, func(s pageState) bool {
		return s.State == "ended"
	})
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.hangup()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("hangup() after DELETE: %v", err)
	}
	t.Logf("call, checks and hangup took %v", time.Since(start).Round(time.Millisecond))
}

// deleteStatus finds the status the page logs for its DELETE.
var deleteStatus = regexp.MustCompile(`DELETE (\d{3})`)

// chromiumPath returns Chromium's path. Without it the test is skipped, except
// in CI (CI set), where a missing tool is an error.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "chromium is not installed (Debian: apt-get install chromium); the browser end-to-end test needs it"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "; CI is set, and in CI a missing tool is an error")
	}
	t.Skip(msg)
	return ""
}

// startBrowser starts a headless Chromium whose microphone plays wav, and
// returns a chromedp context for its one tab. A cleanup stops Chromium and
// every goroutine of chromedp, and on failure logs the page's console,
// exceptions, on-page log and Chromium's own output.
func startBrowser(t *testing.T, chromiumBin, wav string, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	ctx, _ := startBrowserConsole(t, chromiumBin, wav, extra...)
	return ctx
}

// startBrowserConsole is startBrowser that also returns a func giving
// the browser's console messages, exceptions and log entries so far.
func startBrowserConsole(t *testing.T, chromiumBin, wav string, extra ...chromedp.ExecAllocatorOption) (context.Context, func() []string) {
	t.Helper()
	var (
		output   logbuf.Buffer // Chromium's stdout and stderr
		mu       sync.Mutex
		messages []string // console messages, exceptions, browser log entries, chromedp errors
	)
	note := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		messages = append(messages, fmt.Sprintf(format, args...))
	}

	opts := append(append(chromium.Options(chromiumBin, wav, &output), chromedp.WindowSize(900, 1000)), extra...)
	allocCtx, allocCancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx,
		chromedp.WithErrorf(func(format string, args ...any) { note("chromedp error: "+format, args...) }),
		chromedp.WithLogf(func(format string, args ...any) { note("chromedp: "+format, args...) }),
	)

	// Console starts the browser and subscribes before the page loads.
	console := chromedp.Console(ctx)
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		for m, err := range console {
			if err != nil {
				return
			}
			if m.URL != "" {
				note("console %s (%s:%d)", m, m.URL, m.Line+1)
			} else {
				note("console %s", m)
			}
		}
	}()

	t.Cleanup(func() {
		if t.Failed() {
			lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
			if text, err := chromedp.Run(lctx, chromedp.Evaluate[string](`document.getElementById("log")?.innerText ?? "(no page)"`)); err == nil {
				t.Logf("page log:\n%s", text)
			}
			lcancel()
		}
		// Close the browser gracefully, then tear down everything: the
		// allocator's cancel waits for the process, its output reader and the
		// profile's removal, so goleak sees no chromedp goroutine.
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		if err := chromedp.Cancel(cctx); err != nil {
			t.Logf("closing chromium: %v", err)
		}
		ccancel()
		cancel()
		allocCancel()
		<-consoleDone
		if t.Failed() {
			mu.Lock()
			t.Logf("browser console and errors (%d):\n%s", len(messages), strings.Join(messages, "\n"))
			mu.Unlock()
			t.Logf("chromium output (tail):\n%s", output.Tail(8<<10))
		}
	})
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(messages)
	}
}

// pageState is what the test reads of window.switchboard.
type pageState struct {
	State     string   `json:"state"`
	BodyState string   `json:"bodyState"`
	DCEcho    bool     `json:"dcEcho"`
	SetupMs   *float64 `json:"setupMs"`
	EchoMs    *float64 `json:"echoMs"`
	Location  *string  `json:"location"`
	ETag      *string  `json:"etag"`
	Error     *string  `json:"error"`
	Restart   struct {
		Count       int      `json:"count"`
		PatchMs     *float64 `json:"patchMs"`
		ConnectedMs *float64 `json:"connectedMs"`
		Error       *string  `json:"error"`
	} `json:"restart"`
	Talk  talkState `json:"talk"`
	Stats struct {
		PacketsSent      int64    `json:"packetsSent"`
		PacketsReceived  int64    `json:"packetsReceived"`
		PacketsLost      int64    `json:"packetsLost"`
		JitterMs         *float64 `json:"jitterMs"`
		RTTMs            *float64 `json:"rttMs"`
		AudioLevel       float64  `json:"audioLevel"`
		TotalAudioEnergy float64  `json:"totalAudioEnergy"`
	} `json:"stats"`
}

// pageStateJS copies the fields of window.switchboard (which also holds
// functions) into a plain object that returns by value.
const pageStateJS = `(() => {
	const s = window.switchboard;
	return {state: s.state, bodyState: document.body.dataset.state, dcEcho: s.dcEcho,
		setupMs: s.setupMs, echoMs: s.echoMs, location: s.location, etag: s.etag, error: s.error,
		stats: s.stats, restart: s.restart, talk: s.talk};
})()`

// waitPage polls the page until cond holds, and fails the test when the call
// fails or timeout passes first.
func waitPage(t *testing.T, ctx context.Context, what string, timeout time.Duration, cond func(pageState) bool) pageState {
	t.Helper()
	s, ok := pollPage(t, ctx, timeout, cond)
	if !ok {
		t.Fatalf("no %s within %v; page state %+v", what, timeout, s)
	}
	return s
}

// pollPage polls the page until cond holds or timeout passes, and reports
// which. It fails the test when the page cannot be read or the call failed.
func pollPage(t *testing.T, ctx context.Context, timeout time.Duration, cond func(pageState) bool) (pageState, bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](pageStateJS))
		if err != nil {
			t.Fatalf("read window.switchboard: %v", err)
		}
		if cond(s) {
			return s, true
		}
		if s.State == "failed" || s.Error != nil {
			t.Fatalf("the call failed: state %q, error %q", s.State, deref(s.Error))
		}
		if time.Now().After(deadline) {
			return s, false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// metricLines returns the demo's /metrics lines for the metric name, fetched
// by the page (so the test opens no HTTP connection of its own).
func metricLines(ctx context.Context, name string) string {
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch("/metrics").then((r) => r.text())`, chromedp.EvalAwaitPromise))
	if err != nil {
		return "metrics: " + err.Error()
	}
	var lines []string
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, name) {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	if lines == nil {
		return "no " + name
	}
	return strings.Join(lines, ", ")
}

// waitSessions waits up to 5 s for the transceiver to hold n sessions.
func waitSessions(t *testing.T, d *demo.Demo, n int, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for d.Transceiver().Sessions() != n {
		if time.Now().After(deadline) {
			t.Fatalf("transceiver has %d sessions 5 s %s, want %d", d.Transceiver().Sessions(), when, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shownJS reads what the page shows of a call: the connection rows, the
// data-channel echo row, the Ping button, and the widths of the two level
// meters (yours and the agent's).
const shownJS = `(() => {
	const text = (id) => document.getElementById(id).textContent;
	const width = (el) => el.style.width;
	return {ice: text("ice"), dtls: text("dtls"), pc: text("pcstate"), echo: text("echo"), speaking: text("speaking"),
		pingDisabled: document.getElementById("ping").disabled, agent: window.switchboard.agent,
		meters: [width(document.querySelector("#you-meter > div")), width(document.querySelector("#agent-meter > div"))]};
})()`

// shown is what shownJS returns.
type shown struct {
	ICE, DTLS, PC, Echo, Speaking string
	PingDisabled                  bool
	Agent                         string
	Meters                        []string
}

// waitShown polls what the page shows until cond holds, for 10 s.
func waitShown(t *testing.T, ctx context.Context, what string, cond func(shown) bool) shown {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := readShown(t, ctx)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never showed %s: %+v", what, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readShown(t *testing.T, ctx context.Context) shown {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[shown](shownJS))
	if err != nil {
		t.Fatalf("read the page: %v", err)
	}
	return s
}

// checkHungUp checks that the page, after hangup(), shows the call closed
// and its meters empty, not the last moment of the call: ICE, DTLS and the
// peer connection "closed" (close() fires no state events), every level
// meter at 0, nobody speaking. It reads the page twice, 700 ms apart, so
// that a stats poll or a level sample still in flight at the hang-up would
// show.
func checkHungUp(t *testing.T, ctx context.Context) {
	t.Helper()
	for range 2 {
		s := readShown(t, ctx)
		if s.ICE != "closed" || s.DTLS != "closed" || s.PC != "closed" {
			t.Errorf("after hang-up the page shows ICE %q, DTLS %q, peer connection %q; want closed", s.ICE, s.DTLS, s.PC)
		}
		for i, w := range s.Meters {
			if w != "0" && w != "0%" && w != "0px" {
				t.Errorf("after hang-up level meter %d is %q wide, want 0", i, w)
			}
		}
		if s.Speaking != "Speaking now: nobody" {
			t.Errorf("after hang-up the page says %q", s.Speaking)
		}
		time.Sleep(700 * time.Millisecond)
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// startTestDemo starts the demo with cfg, its log at level kept in a
// buffer and shown only if the test fails (its goroutines must not call
// t.Log once the test has returned). A cleanup closes it, then runs after
// (if not nil), then shows the log.
func startTestDemo(t *testing.T, cfg demo.Config, level slog.Level, after func()) *demo.Demo {
	t.Helper()
	var serverLog logbuf.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&serverLog, &slog.HandlerOptions{Level: level}))
	d, err := demo.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("demo close: %v", err)
		}
		if after != nil {
			after()
		}
		if t.Failed() {
			t.Logf("demo log:\n%s", serverLog.String())
		}
	})
	return d
}
