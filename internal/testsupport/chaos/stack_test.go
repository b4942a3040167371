package chaos

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// stackConfig shapes a stack of real processes on loopback.
type stackConfig struct {
	transceivers int
	// redis starts a redis-server: transceivers register in it (-redis)
	// and the relay reads its membership from it (-membership redis).
	redis bool
	// flowCache gives the relay -flow-cache (needs redis).
	flowCache bool
	// noRelearn runs the relay with -relearn=false.
	noRelearn bool
	// idleTimeout is the relay's -idle-timeout (0: its default, 60 s).
	idleTimeout time.Duration
	// proxyArgs, if set, runs an impairproxy with these flags in front of
	// the relay's public address; its address, not the relay's, is put
	// in answers.
	proxyArgs []string
	// trxArgs and relayArgs are extra flags.
	trxArgs, relayArgs []string
}

// stack is agent + transceivers + relay (+ redis), each its own process.
type stack struct {
	h   *harness
	cfg stackConfig

	agent     *proc
	agentAddr string
	redis     *proc
	redisAddr string
	trx       []*proc
	trxHTTP   []string // signaling, /metrics
	relay     *proc
	relayArgs []string
	public    string // relay public UDP address
	relayOps  string // relay /metrics
	proxy     *proc  // impairproxy, with stackConfig.proxyArgs
}

func startStack(t *testing.T, cfg stackConfig) *stack {
	t.Helper()
	if cfg.transceivers == 0 {
		cfg.transceivers = 1
	}
	s := &stack{h: newHarness(t), cfg: cfg}
	if cfg.redis || cfg.flowCache {
		s.startRedis(t)
	}
	// Every process binds port 0 and logs what it bound, except the
	// relay's public address: the transceivers advertise it (or a proxy
	// targets it) before the relay starts, since the relay needs their
	// hop addresses first. It is picked free beforehand, and if another
	// process takes it before the relay binds it, all of them but the
	// agent start again around another one.
	s.agent = s.h.start("agent", bins.switchboard, "agent", "-mode", "echo", "-listen", "127.0.0.1:0")
	s.agentAddr = s.agent.mustBind(t, "http listening", "addr")[0]
	for attempt := 1; !s.startRelayed(t); attempt++ {
		if attempt == 5 {
			t.Fatalf("the relay's public address was taken %d times", attempt)
		}
	}
	for _, a := range s.trxHTTP {
		waitHTTP(t, "http://"+a+"/ready", 20*time.Second)
	}
	waitHTTP(t, "http://"+s.relayOps+"/ready", 20*time.Second)
	if cfg.redis {
		// The relay routes only to transceivers it has read from Redis.
		want := float64(cfg.transceivers)
		if _, ok := waitFor(15*time.Second, func() bool {
			m, err := scrape(s.relayOps)
			return err == nil && m.sum("switchboard_relay_members") == want
		}); !ok {
			t.Fatalf("relay did not see %v transceivers in Redis", want)
		}
	}
	return s
}

// startRelayed starts the proxy (with proxyArgs), the transceivers and the
// relay around a public address picked free. If another process took it
// before the relay bound it, it stops them and reports false.
func (s *stack) startRelayed(t *testing.T) bool {
	t.Helper()
	cfg := s.cfg
	s.public = freeUDP(t)
	advertise := s.public
	if cfg.proxyArgs != nil {
		s.proxy = s.h.start("impairproxy", bins.impairproxy, append([]string{"-listen", "127.0.0.1:0", "-target", s.public}, cfg.proxyArgs...)...)
		advertise = s.proxy.mustBind(t, "impairproxy listening", "addr")[0]
	}
	var members []string
	s.trx, s.trxHTTP = nil, nil
	for i := range cfg.transceivers {
		args := []string{"transceiver", "-id", strconv.Itoa(i + 1), "-listen", "127.0.0.1:0", "-advertise", advertise,
			"-backend", "ws://" + s.agentAddr + "/v1/bridge", "-http", "127.0.0.1:0", "-pprof", "-drain-timeout", "1s"}
		if cfg.redis {
			args = append(args, "-redis", s.redisAddr)
		}
		args = append(args, cfg.trxArgs...)
		trx := s.h.start(fmt.Sprintf("transceiver %d", i+1), bins.switchboard, args...)
		a := trx.mustBind(t, "transceiver running", "hop", "http")
		s.trx = append(s.trx, trx)
		s.trxHTTP = append(s.trxHTTP, a[1])
		members = append(members, fmt.Sprintf("%d=%s", i+1, a[0]))
	}
	// Every client is 127.0.0.1 here, so the per-source caps on new flows
	// (docs/design.md §5.5, meant for one client per address) are lifted.
	s.relayArgs = []string{"relay", "-public", s.public, "-internal", "127.0.0.1:0", "-metrics", "127.0.0.1:0",
		"-workers", "2", "-pprof",
		"-new-flows-per-ip", "1000000", "-max-pending-per-ip", "1000000", "-new-flows-per-second", "1000000"}
	if cfg.redis {
		s.relayArgs = append(s.relayArgs, "-membership", "redis", "-redis", s.redisAddr)
	} else {
		s.relayArgs = append(s.relayArgs, "-members", strings.Join(members, ","))
	}
	if cfg.flowCache {
		s.relayArgs = append(s.relayArgs, "-flow-cache", s.redisAddr)
	}
	if cfg.noRelearn {
		s.relayArgs = append(s.relayArgs, "-relearn=false")
	}
	if cfg.idleTimeout > 0 {
		s.relayArgs = append(s.relayArgs, "-idle-timeout", cfg.idleTimeout.String())
	}
	s.relayArgs = append(s.relayArgs, cfg.relayArgs...)
	s.relay = s.h.start("relay", bins.switchboard, s.relayArgs...)
	a, busy := s.relay.bound(t, "relay running", "internal")
	if busy {
		for _, p := range append([]*proc{s.relay, s.proxy}, s.trx...) {
			if p != nil {
				p.stop()
			}
		}
		return false
	}
	s.relayOps = s.relay.mustBind(t, "http listening", "addr")[0]
	// A restarted relay takes the same addresses again.
	s.relayArgs[4], s.relayArgs[6] = a[0], s.relayOps
	return true
}

func (s *stack) startRedis(t *testing.T) {
	t.Helper()
	bin := requireRedis(t)
	// redis-server takes a port, not port 0: one picked free may be
	// taken before redis-server binds it. Then it exits ("Address already
	// in use") while the port's new owner might answer a dial, so
	// readiness is its own log line, and a lost port is picked again.
	for attempt := 1; ; attempt++ {
		s.redisAddr = freeTCP(t)
		_, port, _ := strings.Cut(s.redisAddr, ":")
		s.redis = s.h.start("redis-server", bin, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--protected-mode", "no")
		if _, ok := waitFor(10*time.Second, func() bool {
			return s.redis.exited() || s.redis.log.Count("Ready to accept connections") > 0
		}); !ok {
			t.Fatalf("redis-server on %s not ready in 10 s:\n%s", s.redisAddr, s.redis.log.Tail(4000))
		}
		if !s.redis.exited() {
			return
		}
		if !strings.Contains(s.redis.log.String(), "Address already in use") || attempt == 5 {
			t.Fatalf("redis-server on %s exited at start: %v\n%s", s.redisAddr, s.redis.err, s.redis.log.Tail(4000))
		}
	}
}

// freeTCP returns a loopback address that was free a moment ago.
func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// urls are the transceivers' signaling URLs.
func (s *stack) urls() string {
	var u []string
	for _, a := range s.trxHTTP {
		u = append(u, "http://"+a+"/v1/calls")
	}
	return strings.Join(u, ",")
}

// restartRelay starts a relay again with the same arguments (same ports)
// and returns how long it took until it answered /ready.
func (s *stack) restartRelay(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	s.relay = s.h.start("relay (restarted)", bins.switchboard, s.relayArgs...)
	waitHTTP(t, "http://"+s.relayOps+"/ready", 20*time.Second)
	return time.Since(start)
}

// cpu reports the CPU time of each of the stack's processes.
func (s *stack) cpu() string {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	var parts []string
	for _, p := range s.h.procs {
		parts = append(parts, fmt.Sprintf("%s %.1fs", p.name, p.cpu().Seconds()))
	}
	return strings.Join(parts, ", ")
}

// sessionReport is one session's line of `switchboard load
// -sessions-json`.
type sessionReport = callclient.SessionResult

func sessionID(session string) string {
	u, err := url.Parse(session)
	if err != nil {
		return ""
	}
	return path.Base(u.Path)
}

// driver is a running `switchboard load`, the suite's load generator, in
// a process of its own (built without the race detector), printing a line
// as each session connects and as each ends.
type driver struct {
	p *proc

	mu        sync.Mutex
	connected int
	sessions  []sessionReport
	summary   *callclient.LoadSummary
	finished  chan struct{} // closed at EOF on stdout
}

// runDriver starts `switchboard load` against s's transceivers with extra
// flags args (-sessions, -duration, -ramp, -vanish).
func (s *stack) runDriver(t *testing.T, args ...string) *driver {
	t.Helper()
	args = append([]string{"load", s.urls(), "-sessions-json", "-connected-json", "-progress", "0"}, args...)
	d := &driver{p: &proc{name: "switchboard load", args: args, log: &logbuf.Buffer{}, done: make(chan struct{})}, finished: make(chan struct{})}
	d.p.cmd = exec.Command(bins.switchboard, args...)
	d.p.cmd.Env = s.h.env
	d.p.cmd.Stderr = d.p.log
	d.p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := d.p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read all of stdout before Wait (StdoutPipe's rule): the reader
	// closes finished at EOF, and Wait runs after it.
	go func() {
		defer close(d.finished)
		dec := json.NewDecoder(stdout)
		for {
			var raw json.RawMessage
			if dec.Decode(&raw) != nil {
				return
			}
			d.line(raw)
		}
	}()
	go func() {
		<-d.finished
		d.p.err = d.p.cmd.Wait()
		close(d.p.done)
	}()
	s.h.mu.Lock()
	s.h.procs = append(s.h.procs, d.p)
	s.h.mu.Unlock()
	return d
}

// line takes one JSON value of the output: a connected event, a session's
// result, or the summary last.
func (d *driver) line(b []byte) {
	var probe struct {
		Event string          `json:"event"`
		URLs  json.RawMessage `json:"urls"`
	}
	if json.Unmarshal(b, &probe) != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case probe.Event == "connected":
		d.connected++
	case probe.URLs != nil:
		var sum callclient.LoadSummary
		if json.Unmarshal(b, &sum) == nil {
			d.summary = &sum
		}
	default:
		var r sessionReport
		if json.Unmarshal(b, &r) == nil {
			d.sessions = append(d.sessions, r)
		}
	}
}

// waitConnected waits until n sessions connected.
func (d *driver) waitConnected(t *testing.T, n int, timeout time.Duration) time.Duration {
	t.Helper()
	took, ok := waitFor(timeout, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.connected >= n || len(d.sessions) > 0
	})
	d.mu.Lock()
	defer d.mu.Unlock()
	if !ok || d.connected < n {
		t.Fatalf("%d of %d sessions connected after %v (%d ended early)\n%s", d.connected, n, took, len(d.sessions), d.p.log.String())
	}
	return took
}

// mark tells the driver a fault happens now (SIGUSR1: callclient.Load.Mark).
func (d *driver) mark(t *testing.T) time.Time {
	t.Helper()
	now := time.Now()
	if err := d.p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	return now
}

// wait waits for the driver to finish and returns its session reports, in
// start order. `switchboard load` exits 1 when a session failed, which a
// fault test may cause on purpose: the reports are for the test to judge,
// and only a run with no summary fails here.
func (d *driver) wait(t *testing.T, timeout time.Duration) []sessionReport {
	t.Helper()
	select {
	case <-d.p.done:
	case <-time.After(timeout):
		d.p.kill9()
		t.Fatalf("switchboard load did not finish within %v", timeout)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.summary == nil {
		t.Fatalf("switchboard load: %v, no summary\n%s", d.p.err, d.p.log.String())
	}
	rs := slices.Clone(d.sessions)
	slices.SortFunc(rs, func(a, b sessionReport) int { return a.I - b.I })
	return rs
}

// checkSessions fails the test for each session that did not live through
// to its end: not connected, errored, ICE failed, the peer connection
// failed or was closed by the server, audio that did not come back until
// the end, or a data channel ping at the end that did not come back.
func checkSessions(t *testing.T, rs []sessionReport, want int) {
	t.Helper()
	if len(rs) != want {
		t.Errorf("%d session reports, want %d", len(rs), want)
	}
	bad := 0
	for _, r := range rs {
		var why []string
		switch {
		case r.ConnectedNS == 0:
			why = append(why, "never connected: "+r.Failure+": "+r.Error)
		case r.Failure != "":
			why = append(why, "failed: "+r.Failure+" "+r.Error)
		}
		if r.ICEFailed || r.FailedNS != 0 {
			why = append(why, "ICE/peer connection failed")
		}
		if r.ClosedNS != 0 && r.ClosedNS < r.StreamEndNS {
			why = append(why, "closed by the server mid-call")
		}
		if r.LastRxNS < r.StreamEndNS-int64(2*time.Second) {
			why = append(why, fmt.Sprintf("audio stopped %.1fs before the end", float64(r.StreamEndNS-r.LastRxNS)/1e9))
		}
		if !r.DCEchoEnd {
			why = append(why, "final data channel ping not echoed")
		}
		if len(why) > 0 {
			bad++
			if bad <= 10 {
				t.Errorf("session %d (%s): %s", r.I, r.Session, strings.Join(why, "; "))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d sessions lost", bad, len(rs))
	}
}

func column(rs []sessionReport, f func(sessionReport) float64) []float64 {
	out := make([]float64, 0, len(rs))
	for _, r := range rs {
		out = append(out, f(r))
	}
	return out
}
