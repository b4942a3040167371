package setupbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/firefox"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// Headless Firefox ESR as the client.
//
// Firefox runs in a network namespace of the run's own
// (internal/testsupport/firefox: it will not call a server on loopback),
// and the stacks' proxies listen on the host end of its veth pair. With no
// remote-control protocol, the page drives itself: Firefox opens the run's
// control server's /next, which redirects it to the next call's page when
// the harness asks for one; that page is the demo page (internal/web), from
// the stack's signaling server (the same origin as the offer, as for
// Chromium), with a script added that calls window.switchboard.call, waits
// as waitCallJS does, hangs up, POSTs what it saw to the control server's
// /result and goes back to /next. Times are the page's, from its POST
// start; first audio at the backend is mapped onto them through the wall
// clock (performance.timeOrigin, at full precision by Prefs), which
// Firefox and the harness share on this machine.

// callPagePath is the call page on every stack's signaling server.
const callPagePath = "/bench-call"

// callPageScript drives one call from the page's query (ctl, url, id,
// timeout, ice, policy) and reports it.
const callPageScript = `<script>
(async () => {
  const q = new URLSearchParams(location.search);
  const ctl = q.get("ctl"), id = q.get("id"), timeout = Number(q.get("timeout"));
  const opts = { url: q.get("url") };
  if (q.get("ice")) opts.iceServers = JSON.parse(q.get("ice"));
  if (q.get("policy")) opts.iceTransportPolicy = q.get("policy");
  const s = window.switchboard, until = performance.now() + timeout;
  let timedOut = false;
  void s.call(opts);
  for (;;) {
    const t = s.timing;
    if (s.error !== null || s.state === "failed" || s.state === "ended") break;
    if (t && t.firstInboundMs !== null && t.dataChannelMs !== null && s.location) break;
    if (performance.now() > until) { timedOut = true; break; }
    await new Promise((r) => setTimeout(r, 10));
  }
  const t = s.timing || {};
  const res = { id, state: s.state, error: s.error, location: s.location, timing: t, timedOut,
    sent: s.stats.packetsSent, received: s.stats.packetsReceived,
    postStartEpoch: t.postStart === null || t.postStart === undefined ? null : performance.timeOrigin + t.postStart,
    userAgent: navigator.userAgent };
  try { await s.hangup(); } catch (e) {}
  try { await fetch(ctl + "/result", { method: "POST", mode: "no-cors", body: JSON.stringify(res) }); } catch (e) {}
  location.href = ctl + "/next";
})();
</script>
`

// callPage is the demo page with callPageScript, made once.
var callPage struct {
	once sync.Once
	html []byte
}

// serveCallPage serves the demo page, from demo, with callPageScript.
func serveCallPage(w http.ResponseWriter, demo http.Handler) {
	callPage.once.Do(func() {
		rec := httptest.NewRecorder()
		demo.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		html := rec.Body.Bytes()
		i := bytes.LastIndex(html, []byte("</body>"))
		if i < 0 {
			i = len(html)
		}
		callPage.html = append(append(append([]byte{}, html[:i]...), callPageScript...), html[i:]...)
	})
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(callPage.html)
}

// firefoxResult is what the call page reports.
type firefoxResult struct {
	pageResult
	ID             string   `json:"id"`
	PostStartEpoch *float64 `json:"postStartEpoch"` // ms since 1970
	UserAgent      string   `json:"userAgent"`
}

// firefoxDriver is the run's Firefox: its namespace, process and control
// server.
type firefoxDriver struct {
	ns      *firefox.Netns
	b       *firefox.Browser
	ctl     *http.Server
	ctlURL  string
	next    chan string // the next call page's URL, taken by /next
	results chan firefoxResult
	output  *logbuf.Buffer
	version string
	seq     int
	log     *slog.Logger
	wg      sync.WaitGroup
}

// startFirefox makes the namespace, the control server on its host end,
// and Firefox on /next.
func startFirefox(log *slog.Logger) (*firefoxDriver, error) {
	bin, err := firefox.Path()
	if err != nil {
		return nil, err
	}
	ns, err := firefox.NewNetns()
	if err != nil {
		return nil, err
	}
	d := &firefoxDriver{ns: ns, next: make(chan string), results: make(chan firefoxResult, 4), output: &logbuf.Buffer{Max: 1 << 20}, log: log}
	ln, err := net.Listen("tcp", net.JoinHostPort(ns.HostIP, "0"))
	if err != nil {
		ns.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /next", d.handleNext)
	mux.HandleFunc("POST /result", d.handleResult)
	mux.HandleFunc("GET /favicon.ico", http.NotFound)
	d.ctl = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	d.ctlURL = "http://" + ln.Addr().String()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		_ = d.ctl.Serve(ln)
	}()
	if d.b, err = firefox.Start(bin, ns, d.ctlURL+"/next", d.output); err != nil {
		d.close()
		return nil, err
	}
	d.version = d.b.Version
	log.Debug("firefox started", "version", d.version, "netns", ns.Name, "host", ns.HostIP)
	return d, nil
}

// handleNext redirects Firefox to the next call's page once the harness
// asks for one; after 20 s without, the page reloads itself.
func (d *firefoxDriver) handleNext(w http.ResponseWriter, r *http.Request) {
	select {
	case u := <-d.next:
		http.Redirect(w, r, u, http.StatusFound)
	case <-time.After(20 * time.Second):
		w.Header().Set("Content-Type", "text/html")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = io.WriteString(w, `<meta http-equiv="refresh" content="0">waiting for a call`)
	case <-r.Context().Done():
	}
}

func (d *firefoxDriver) handleResult(w http.ResponseWriter, r *http.Request) {
	var res firefoxResult
	b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err := json.Unmarshal(b, &res); err != nil {
		d.log.Warn("bad result from the firefox page", "err", err, "body", string(b))
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	select {
	case d.results <- res:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
}

// close stops Firefox, the control server and the namespace.
func (d *firefoxDriver) close() {
	if d.b != nil {
		d.b.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = d.ctl.Shutdown(ctx)
	cancel()
	d.wg.Wait()
	d.ns.Close()
}

// callFirefox runs one call on st in Firefox and returns its phases.
func (e *env) callFirefox(ctx context.Context, st *stack) (sample, error) {
	d := e.firefox
	d.seq++
	id := strconv.Itoa(d.seq)
	timeout := e.opts.CallTimeout
	q := url.Values{"ctl": {d.ctlURL}, "url": {st.url}, "id": {id}, "timeout": {strconv.FormatInt(timeout.Milliseconds(), 10)}}
	if len(st.iceServers) > 0 {
		var servers []map[string]any
		for _, s := range st.iceServers {
			servers = append(servers, map[string]any{"urls": s.URLs, "username": s.Username, "credential": s.Credential})
		}
		js, err := json.Marshal(servers)
		if err != nil {
			return sample{}, err
		}
		q.Set("ice", string(js))
	}
	if st.relayOnly {
		q.Set("policy", "relay")
	}
	page := strings.TrimSuffix(st.page, "/") + callPagePath + "?" + q.Encode()
	select {
	case d.next <- page:
	case <-d.b.Done():
		return sample{}, fmt.Errorf("firefox exited (output: %s)", d.output.Tail(2000))
	case <-time.After(60 * time.Second):
		return sample{}, errors.New("firefox did not ask for the next call within 60 s")
	case <-ctx.Done():
		return sample{}, ctx.Err()
	}
	var res firefoxResult
	wait := time.After(timeout + 30*time.Second)
	for res.ID != id {
		select {
		case res = <-d.results:
		case <-d.b.Done():
			return sample{}, fmt.Errorf("firefox exited (output: %s)", d.output.Tail(2000))
		case <-wait:
			return sample{}, fmt.Errorf("no result from the firefox page for call %s", id)
		case <-ctx.Done():
			return sample{}, ctx.Err()
		}
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
	sid := ""
	if res.Location != nil {
		sid = path.Base(*res.Location)
	}
	if sid != "" && res.PostStartEpoch != nil {
		for range 20 {
			if at, ok := e.backend.firstAudio(sid); ok {
				s.backend = float64(at.UnixNano())/1e6 - *res.PostStartEpoch
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
		return s, fmt.Errorf("firefox, session %q: %s (packets sent %d, received %d)", sid, strings.Join(problems, "; "), res.Sent, res.Received)
	}
	return s, nil
}

// firefoxSkip says why Firefox cannot run here, outside CI, or "".
func firefoxSkip(err error) string {
	if os.Getenv("CI") != "" {
		return ""
	}
	switch {
	case errors.Is(err, firefox.ErrNotInstalled):
		return "skipped: Firefox is not installed (Debian: apt-get install firefox-esr)"
	case errors.Is(err, firefox.ErrNoNetns):
		return "skipped: Firefox needs a network namespace, which needs root and iproute2"
	}
	return ""
}
