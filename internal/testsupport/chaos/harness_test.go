package chaos

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

var (
	flagFull     = flag.Bool("chaos.full", false, "run the lengths docs/reliability.md records: 3 min impaired network, 500 restart rounds")
	flagDuration = flag.Duration("chaos.duration", 0, "impaired-network run length (default 30s; 3m with -chaos.full)")
	flagRounds   = flag.Int("chaos.rounds", 0, "restart-loop rounds (default 100; 500 with -chaos.full)")
	flagSessions = flag.Int("chaos.sessions", 100, "concurrent sessions of each media test")
)

func impairedDuration() time.Duration {
	switch {
	case *flagDuration > 0:
		return *flagDuration
	case *flagFull:
		return 3 * time.Minute
	}
	return 30 * time.Second
}

func restartRounds() int {
	switch {
	case *flagRounds > 0:
		return *flagRounds
	case *flagFull:
		return 500
	}
	return 100
}

// bins are the binaries TestMain builds, without the race detector.
var bins struct {
	switchboard, impairproxy string
	flowCache                bool // the relay has -flow-cache
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "switchboard-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins.switchboard = filepath.Join(dir, "switchboard")
	bins.impairproxy = filepath.Join(dir, "impairproxy")
	for bin, pkg := range map[string]string{
		bins.switchboard: "github.com/switchboard-rtc/switchboard/cmd/switchboard",
		bins.impairproxy: "github.com/switchboard-rtc/switchboard/internal/testsupport/impair/impairproxy",
	} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, out)
			return 1
		}
	}
	help, _ := exec.Command(bins.switchboard, "relay", "-h").CombinedOutput()
	bins.flowCache = bytes.Contains(help, []byte("-flow-cache"))
	return m.Run()
}

// proc is one child process.
type proc struct {
	name string
	args []string
	cmd  *exec.Cmd
	log  *logbuf.Buffer
	done chan struct{}
	err  error // after done
}

// harness owns a test's processes: it stops them when the test ends and
// prints the tail of their logs if it failed.
type harness struct {
	t     *testing.T
	env   []string
	mu    sync.Mutex
	procs []*proc
}

func newHarness(t *testing.T) *harness {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	h := &harness{t: t, env: append(os.Environ(), "SWITCHBOARD_TOKEN_KEY="+base64.StdEncoding.EncodeToString(secret))}
	t.Cleanup(func() {
		h.mu.Lock()
		procs := slices.Clone(h.procs)
		h.mu.Unlock()
		for _, p := range procs {
			p.stop()
		}
		if !t.Failed() {
			return
		}
		for _, p := range procs {
			lines := strings.Split(strings.TrimRight(p.log.String(), "\n"), "\n")
			if len(lines) > 40 {
				lines = lines[len(lines)-40:]
			}
			t.Logf("---- %s %s (%v), last lines:\n%s", p.name, strings.Join(p.args, " "), p.err, strings.Join(lines, "\n"))
		}
	})
	return h
}

// start runs bin with args until the test ends.
func (h *harness) start(name, bin string, args ...string) *proc {
	h.t.Helper()
	p := &proc{name: name, args: args, log: &logbuf.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = h.env
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		h.t.Fatalf("start %s: %v", name, err)
	}
	h.track(p)
	return p
}

func (h *harness) track(p *proc) {
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
}

// kill9 sends SIGKILL and waits for the process to be gone.
func (p *proc) kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGINT, then SIGKILL after 10 s.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill9()
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// cpu is the CPU time the process used so far (user + system).
func (p *proc) cpu() time.Duration {
	if p.exited() {
		return p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces): utime and
	// stime are the 14th and 15th fields overall.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return time.Duration((u + s) / 100 * float64(time.Second)) // USER_HZ is 100 on Linux
}

// jsonLines decodes the process's JSON log lines whose msg is msg.
func (p *proc) jsonLines(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.log.String(), "\n") {
		if !strings.Contains(line, `"msg":"`+msg+`"`) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// logTime parses the slog JSON "time" field of a log line.
func logTime(m map[string]any) time.Time {
	s, _ := m["time"].(string)
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// freeUDP returns a loopback address that was free a moment ago.
func freeUDP(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

// bound waits for the process's JSON start-up log line msg and returns its
// fields keys, in order: the addresses it bound when given port 0. busy
// reports instead that it exited because an address it was given was in
// use (another process took it after the harness picked it); the test
// fails on any other exit.
func (p *proc) bound(t *testing.T, msg string, keys ...string) (addrs []string, busy bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if a, ok := p.log.JSONField(msg, keys[0]); ok {
			addrs = append(addrs, a)
			for _, k := range keys[1:] {
				a, _ := p.log.JSONField(msg, k)
				addrs = append(addrs, a)
			}
			return addrs, false
		}
		if p.exited() {
			if strings.Contains(strings.ToLower(p.log.String()), "address already in use") {
				return nil, true
			}
			t.Fatalf("%s exited before it logged %q: %v\n%s", p.name, msg, p.err, p.log.Tail(4000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q in 20 s:\n%s", p.name, msg, p.log.Tail(4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mustBind is bound for a process given only port 0, which cannot find
// its address taken.
func (p *proc) mustBind(t *testing.T, msg string, keys ...string) []string {
	t.Helper()
	addrs, busy := p.bound(t, msg, keys...)
	if busy {
		t.Fatalf("%s: address in use on port 0:\n%s", p.name, p.log.Tail(4000))
	}
	return addrs
}

// metrics is one /metrics scrape: series (name and labels as exposed) →
// value.
type metrics map[string]float64

// sum adds every series of name, whatever its labels.
func (m metrics) sum(name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}

// scrapeClient opens a connection per request, so that no idle
// keep-alive connection (a goroutine in the server) counts against a
// process's goroutine baseline.
var scrapeClient = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func scrape(addr string) (metrics, error) {
	resp, err := scrapeClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	m := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// mustScrape scrapes addr, failing the test on error.
func mustScrape(t *testing.T, addr string) metrics {
	t.Helper()
	m, err := scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// gc makes the process at addr (with -pprof) collect garbage, twice so
// that sync.Pools are emptied too.
func gc(t *testing.T, addr string) {
	t.Helper()
	for range 2 {
		resp, err := scrapeClient.Get("http://" + addr + "/debug/pprof/heap?gc=1")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// goroutineDump returns the process's goroutines, grouped by stack.
func goroutineDump(addr string) string {
	resp, err := scrapeClient.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// waitFor polls cond every 100 ms until it holds or timeout passes, and
// returns how long it took and whether it held.
func waitFor(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitHTTP(t *testing.T, url string, timeout time.Duration) {
	t.Helper()
	if _, ok := waitFor(timeout, func() bool {
		resp, err := scrapeClient.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode/100 == 2
	}); !ok {
		t.Fatalf("%s not ready after %v", url, timeout)
	}
}

// pct returns the p-th percentile (nearest rank) of xs.
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// dist formats p50, p99 and max of xs.
func dist(xs []float64, unit string) string {
	return fmt.Sprintf("p50 %.0f%s, p99 %.0f%s, max %.0f%s (n=%d)", pct(xs, 50), unit, pct(xs, 99), unit, pct(xs, 100), unit, len(xs))
}

// requireRedis fails under CI, and skips elsewhere, without redis-server.
func requireRedis(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatal("redis-server not found and CI is set: scripts/deps.sh test installs it")
	}
	t.Skip("needs redis-server (scripts/deps.sh test installs it)")
	return ""
}
