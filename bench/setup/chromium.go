package setupbench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/chromium"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// Clients.
const (
	ClientPion     = "pion"
	ClientChromium = "chromium"
	ClientFirefox  = "firefox"
	// ClientChromiumSPED is Chromium with its field trial
	// WebRTC-IceHandshakeDtls (chromium.SPEDFieldTrial): it offers SPED
	// and carries its DTLS handshake in its ICE checks.
	ClientChromiumSPED = "chromium-sped"
	// ClientChromiumSPEDNoPQ is ClientChromiumSPED without its
	// post-quantum key share (chromium.NoPQDTLS): a ClientHello of one
	// datagram, the case SPED saves its round trip in.
	ClientChromiumSPEDNoPQ = "chromium-sped-nopq"
)

// errNoChromium: no Chromium binary on PATH.
var errNoChromium = errors.New("setupbench: chromium not found on PATH")

// browser is one headless Chromium shared by all the calls of a run; each
// call gets a fresh tab.
type browser struct {
	ctx         context.Context // the first tab: keeps the browser up
	cancel      context.CancelFunc
	allocCancel context.CancelFunc
	dir         string // the fake microphone's WAV
	version     string
	output      *logbuf.Buffer
	log         *slog.Logger
}

// chromiumPath returns the Chromium binary, or errNoChromium.
func chromiumPath() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errNoChromium
}

// startBrowser starts headless Chromium with a fake microphone that plays
// the harness's tone, with the flags of the demo's browser test
// (internal/testsupport/e2e/browser_test.go), and extra options.
func startBrowser(log *slog.Logger, audio *callclient.WAV, extra ...chromedp.ExecAllocatorOption) (*browser, error) {
	bin, err := chromiumPath()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "setupbench-chromium-")
	if err != nil {
		return nil, err
	}
	wav := filepath.Join(dir, "tone.wav")
	if err := os.WriteFile(wav, encodeWAV(audio), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	b := &browser{dir: dir, output: &logbuf.Buffer{Max: 1 << 20}, log: log}
	opts := chromium.Options(bin, wav, b.output)
	opts = append(opts, extra...)
	allocCtx, allocCancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx,
		chromedp.WithErrorf(func(format string, args ...any) { log.Debug("chromedp error: " + fmt.Sprintf(format, args...)) }),
		chromedp.WithLogf(func(format string, args ...any) { log.Debug("chromedp: " + fmt.Sprintf(format, args...)) }),
	)
	b.ctx, b.cancel, b.allocCancel = ctx, cancel, allocCancel
	// The first Run starts the browser, tied to the context it gets: ctx
	// itself, cancelled on a timeout.
	timer := time.AfterFunc(30*time.Second, cancel)
	ua, err := chromedp.Run(ctx, chromedp.Evaluate[string](`navigator.userAgent`))
	timer.Stop()
	if err != nil {
		b.close()
		return nil, fmt.Errorf("setupbench: starting chromium: %w (output: %s)", err, b.output.Tail(2000))
	}
	// The user agent says 156.0.0.0 (reduced); --version has the build.
	b.version = "Chromium"
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		if m := regexp.MustCompile(`[0-9]+\.[0-9.]+`).Find(out); m != nil {
			b.version += " " + string(m)
		}
	} else if m := regexp.MustCompile(`Chrome/([0-9.]+)`).FindStringSubmatch(ua); m != nil {
		b.version += " " + m[1]
	}
	log.Debug("chromium started", "version", b.version)
	return b, nil
}

// close stops the browser gracefully, then every chromedp goroutine (the
// allocator's cancel waits for the process and the profile's removal).
func (b *browser) close() {
	cctx, ccancel := context.WithTimeout(b.ctx, 10*time.Second)
	if err := chromedp.Cancel(cctx); err != nil && !errors.Is(err, context.Canceled) {
		b.log.Debug("closing chromium", "err", err)
	}
	ccancel()
	b.cancel()
	b.allocCancel()
	_ = os.RemoveAll(b.dir)
}

// pageTiming is window.switchboard.timing (internal/web/index.html): ms
// from the POST start, null until the phase happened.
type pageTiming struct {
	PostStart       *float64 `json:"postStart"`
	GatheringMS     *float64 `json:"gatheringMs"`
	AnswerMS        *float64 `json:"answerMs"`
	ICEConnectedMS  *float64 `json:"iceConnectedMs"`
	DTLSConnectedMS *float64 `json:"dtlsConnectedMs"`
	ConnectedMS     *float64 `json:"connectedMs"`
	DataChannelMS   *float64 `json:"dataChannelMs"`
	FirstInboundMS  *float64 `json:"firstInboundMs"`
}

type pageResult struct {
	State    string     `json:"state"`
	Error    *string    `json:"error"`
	Location *string    `json:"location"`
	Timing   pageTiming `json:"timing"`
	TimedOut bool       `json:"timedOut"`
	Sent     int64      `json:"sent"`
	Received int64      `json:"received"`
}

// waitCallJS resolves when the call has its first inbound packet and an
// open data channel, has failed, or after %d ms.
const waitCallJS = `new Promise((resolve) => {
	const s = window.switchboard, until = performance.now() + %d;
	const done = (timedOut) => resolve({state: s.state, error: s.error, location: s.location, timing: s.timing,
		timedOut, sent: s.stats.packetsSent, received: s.stats.packetsReceived});
	const check = () => {
		const t = s.timing;
		if (s.error !== null || s.state === "failed" || s.state === "ended") return done(false);
		if (t && t.firstInboundMs !== null && t.dataChannelMs !== null && s.location) return done(false);
		if (performance.now() > until) return done(true);
		setTimeout(check, 10);
	};
	check();
})`

// callChromium runs one call on st in a fresh tab and returns its phases.
func (e *env) callChromium(ctx context.Context, st *stack, b *browser) (sample, error) {
	tctx, tcancel := chromedp.NewContext(b.ctx)
	defer func() {
		// Closes the tab.
		cctx, ccancel := context.WithTimeout(tctx, 5*time.Second)
		_ = chromedp.Cancel(cctx)
		ccancel()
		tcancel()
	}()
	// The first Run opens the tab, tied to the context it gets: tctx
	// itself, cancelled with ctx or on a timeout.
	stop := context.AfterFunc(ctx, tcancel)
	defer stop()
	timeout := e.opts.CallTimeout
	timer := time.AfterFunc(timeout+10*time.Second, tcancel)
	defer timer.Stop()
	cctx := tctx

	if err := chromedp.Do(cctx, chromedp.Navigate(st.page)); err != nil {
		return sample{}, fmt.Errorf("load %s: %w", st.page, err)
	}
	callOpts := map[string]any{"url": st.url}
	if len(st.iceServers) > 0 {
		var servers []map[string]any
		for _, s := range st.iceServers {
			servers = append(servers, map[string]any{"urls": s.URLs, "username": s.Username, "credential": s.Credential})
		}
		callOpts["iceServers"] = servers
	}
	if st.relayOnly {
		callOpts["iceTransportPolicy"] = "relay"
	}
	js, err := json.Marshal(callOpts)
	if err != nil {
		return sample{}, err
	}
	if err := chromedp.Do(cctx, chromedp.Evaluate[chromedp.Void](`void window.switchboard.call(`+string(js)+`)`)); err != nil {
		return sample{}, fmt.Errorf("call(): %w", err)
	}
	res, err := chromedp.Run(cctx, chromedp.Evaluate[pageResult](fmt.Sprintf(waitCallJS, timeout.Milliseconds()), chromedp.EvalAwaitPromise))
	if err != nil {
		return sample{}, fmt.Errorf("waiting for the call: %w", err)
	}
	// Map the backend's clock onto the page's: read performance.now()
	// between two readings of ours, keeping the tightest bracket.
	var (
		bestGap  = time.Hour
		goMid    time.Time
		pageAtGo float64
	)
	for range 5 {
		t0 := time.Now()
		now, err := chromedp.Run(cctx, chromedp.Evaluate[float64](`performance.now()`))
		t1 := time.Now()
		if err != nil {
			return sample{}, fmt.Errorf("reading the page clock: %w", err)
		}
		if gap := t1.Sub(t0); gap < bestGap {
			bestGap, goMid, pageAtGo = gap, t0.Add(gap/2), now
		}
	}
	if e.opts.Logger.Enabled(ctx, slog.LevelDebug) {
		text, _ := chromedp.Run(cctx, chromedp.Evaluate[string](`document.getElementById("log").textContent`))
		e.opts.Logger.Debug("chromium page log", "session", res.Location, "log", text)
	}
	// Hang up (DELETE, then close) before the tab goes.
	if err := chromedp.Do(cctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.hangup()`, chromedp.EvalAwaitPromise)); err != nil {
		e.log.Warn("hangup() failed", "err", err)
	}

	t := res.Timing
	val := func(p *float64) float64 {
		if p == nil {
			return 0
		}
		return *p
	}
	s := sample{
		signaling: val(t.AnswerMS),
		ice:       val(t.ICEConnectedMS),
		dtls:      val(t.DTLSConnectedMS),
		dc:        val(t.DataChannelMS),
		client:    val(t.FirstInboundMS),
		gathering: val(t.GatheringMS),
	}
	id := ""
	if res.Location != nil {
		id = path.Base(*res.Location)
	}
	if id != "" && t.PostStart != nil {
		// The backend has the first frame once the first echo is back; allow
		// a moment in case the wait ended on a failure.
		for range 20 {
			if at, ok := e.backend.firstAudio(id); ok {
				s.backend = pageAtGo + ms(at.Sub(goMid)) - *t.PostStart
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	var problems []string
	if res.Error != nil {
		problems = append(problems, "page error: "+*res.Error)
	}
	if res.TimedOut {
		problems = append(problems, fmt.Sprintf("timed out after %v in state %q", timeout, res.State))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"answer", s.signaling}, {"ICE connected", s.ice}, {"DTLS connected", s.dtls}, {"first audio at backend", s.backend}, {"first audio at client", s.client}} {
		if f.v <= 0 {
			problems = append(problems, "no "+f.name)
		}
	}
	if len(problems) > 0 {
		return s, fmt.Errorf("chromium, session %q: %s (packets sent %d, received %d)", id, strings.Join(problems, "; "), res.Sent, res.Received)
	}
	e.log.Debug("page clock", "bracket", bestGap)
	return s, nil
}

// encodeWAV encodes w as a 16-bit PCM WAV file.
func encodeWAV(w *callclient.WAV) []byte {
	data := len(w.Samples) * 2
	b := make([]byte, 44+data)
	copy(b[0:], "RIFF")
	binary.LittleEndian.PutUint32(b[4:], uint32(36+data))
	copy(b[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(b[16:], 16)
	binary.LittleEndian.PutUint16(b[20:], 1) // PCM
	binary.LittleEndian.PutUint16(b[22:], uint16(w.Channels))
	binary.LittleEndian.PutUint32(b[24:], uint32(w.SampleRate))
	binary.LittleEndian.PutUint32(b[28:], uint32(w.SampleRate*w.Channels*2))
	binary.LittleEndian.PutUint16(b[32:], uint16(w.Channels*2))
	binary.LittleEndian.PutUint16(b[34:], 16)
	copy(b[36:], "data")
	binary.LittleEndian.PutUint32(b[40:], uint32(data))
	for i, v := range w.Samples {
		binary.LittleEndian.PutUint16(b[44+2*i:], uint16(v))
	}
	return b
}
