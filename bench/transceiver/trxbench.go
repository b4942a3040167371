// Package trxbench is `bench transceiver`: what one voice session costs a
// transceiver. The echo agent, the relay and the transceiver run as
// separate processes of one switchboard binary, the transceiver pinned
// alone to its own core (taskset); a load generator, `switchboard load`
// in a process of its own on the other core, drives N real sessions
// through the relay (ICE, DTLS, SRTP, the oai-events data channel, 50
// packets a second each way, echoed by the agent). It measures each of
// Options.Formats, the bridge format the echo agent asks for: Opus
// passthrough (opus/48000/2: the transceiver forwards Opus frames and
// paces them) and PCM (pcm16/24000/1: each session also decodes the
// client's Opus, resamples, and encodes the agent's PCM back to Opus
// before pacing it). For each N, once every session is up, it measures
// over a window:
//
//   - the transceiver's CPU (utime+stime from /proc/PID/stat) as cores
//     used, and sessions per fully busy core = N ÷ cores used;
//   - its memory: RSS (/proc/PID/status) and Go heap in use (its /metrics),
//     as a slope per session between two N;
//   - its goroutines per session, (goroutines at N − at 0) ÷ N;
//   - the delay a packet spends inside it, from its
//     switchboard_transceiver_media_delay_seconds histogram over the
//     window (hop socket in → bridge write; paced send on the playout
//     tick → hop socket out, which leaves out the wait in the playout
//     queue);
//   - from the generator's summary: setup failures, setup time, and the
//     packets of audio that did not come back (counted by RTP sequence
//     number, not matched by payload: the transceiver numbers its paced
//     packets itself and a PCM session re-encodes them);
//   - the generator's own CPU: when it is near one full core, the
//     generator, not the transceiver, is the limit, and the row says so.
//
// Each run starts fresh processes for each format in turn, so that both
// formats see the same machine; figures are medians over Options.Runs, and
// the ratio of PCM to Opus CPU per session is taken within each run first.
package trxbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
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
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
)

// httpc serves every scrape and probe; without keep-alives, so that no
// idle connection outlives a run.
var httpc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// ErrOptions wraps invalid options.
var ErrOptions = errors.New("trxbench: invalid options")

// Options configures Run.
type Options struct {
	// Bin is the switchboard binary every process runs. Required.
	Bin string
	// Steps are the session counts N, measured in rising order within
	// one set of processes. Default 50, 100, 200.
	Steps []int
	// Formats are the bridge audio formats to measure, each with its own
	// processes (the echo agent's -format): bridge.FormatOpus (Opus
	// passthrough), bridge.FormatPCM24k or bridge.FormatPCM16k. Default
	// Opus then PCM 24 kHz.
	Formats []string
	// Runs is the number of fresh runs; figures are medians. Default 3.
	Runs int
	// Window is how long CPU and delay are measured at each N once every
	// session is up. Default 10 s.
	Window time.Duration
	// Ramp is the delay between two session starts. Default 20 ms.
	Ramp time.Duration
	// TrxCPU is the core the transceiver is pinned to; GenCPU the core of
	// the generator, the relay and the agent. Defaults 1 and 0; -1 does
	// not pin. Pinning is skipped when taskset is missing.
	TrxCPU, GenCPU int
	// ProfileDir, if set, receives a CPU profile over the window, a heap
	// profile and a goroutine dump (grouped by stack, as text) of the
	// transceiver at the largest N of the first run, per format
	// (trx-cpu-opus-48000-2-N.pprof, trx-heap-…, trx-goroutine-…txt).
	ProfileDir string
	// TrxArgs are extra transceiver flags.
	TrxArgs []string
	// AgentArgs are extra flags of the echo agent, such as
	// -turn-detection (turn detection and input cleaning, whose cost a
	// run with and one without them compares).
	AgentArgs []string
	// GenArgs are extra flags of the load generator (switchboard load),
	// such as -audio speech.wav: the sessions then send speech instead of
	// counter payloads (which a PCM session decodes to a noise that
	// repeats every packet, and whose echo an echo canceller finds in
	// the input at every 20 ms of lag).
	GenArgs []string
	// Log receives progress lines; nil discards.
	Log io.Writer
}

// Step is one N's figures for one format (medians over runs).
type Step struct {
	Format string `json:"format"`
	N      int    `json:"n"`
	// TrxCores is the transceiver's CPU over the window, in cores.
	TrxCores float64 `json:"trx_cores"`
	// PerCore is N ÷ TrxCores: sessions per fully busy core.
	PerCore float64 `json:"sessions_per_core"`
	// Carried is the audio the transceiver passed to the backend over the
	// window, in sessions' worth (packets per second ÷ 50, from the delay
	// probe's sample count × its sampling rate); below N when packets
	// were lost on the way in. PerCoreCarried is Carried ÷ TrxCores, the
	// figure to read when the machine was too busy to deliver every
	// packet.
	Carried        float64 `json:"carried_sessions"`
	PerCoreCarried float64 `json:"carried_sessions_per_core"`
	// RSSKiB and HeapKiB are the transceiver's resident set and Go heap
	// in use at N, KiB.
	RSSKiB  float64 `json:"rss_kib"`
	HeapKiB float64 `json:"heap_kib"`
	// LiveKiB is the live Go heap after a forced GC at N, KiB: the
	// steadiest memory figure (RSS and heap in use move with the GC
	// cycle).
	LiveKiB float64 `json:"live_kib"`
	// LivePerSession is its slope, KiB per session.
	LivePerSession float64 `json:"live_kib_per_session"`
	// RSSPerSession and HeapPerSession are slopes from the previous step
	// (from 0 sessions for the first), KiB per session.
	RSSPerSession  float64 `json:"rss_kib_per_session"`
	HeapPerSession float64 `json:"heap_kib_per_session"`
	// Goroutines per session, above the idle count.
	GoroutinesPerSession float64 `json:"goroutines_per_session"`
	// Delay inside the transceiver, milliseconds.
	ToBackendP50, ToBackendP99 float64
	ToClientP50, ToClientP99   float64
	// From the generator.
	SetupFailures int `json:"setup_failures"` // sessions that did not connect (summed over runs)
	Failures      int `json:"failures"`       // sessions with any failure (summed over runs)
	// Loss is 1 − packets back ÷ packets sent over the round trip, worst
	// run: packets counted by distinct RTP sequence number, not matched
	// by payload (see callclient.Load).
	Loss       float64 `json:"loss"`
	SetupP50MS float64 `json:"setup_p50_ms"`
	SetupP99MS float64 `json:"setup_p99_ms"`
	// GenCores is the CPU of the generator's core (generator, relay and
	// agent together), in cores; GenBound is set when it was at least 0.9,
	// the generator's side then being the limit.
	GenCores float64 `json:"gen_cores"`
	GenBound bool    `json:"gen_bound"`
	// Runs is how many runs reached this N.
	Runs int `json:"runs"`
}

// Result is the outcome of Run.
type Result struct {
	// Steps holds every format's steps, formats in Options.Formats order,
	// N rising within each.
	Steps []Step `json:"steps"`
	// Idle figures at 0 sessions (medians), by format.
	IdleRSSKiB     map[string]float64 `json:"idle_rss_kib"`
	IdleGoroutines map[string]float64 `json:"idle_goroutines"`
	// Spread is, per step (as Steps), the largest relative deviation of a
	// run's sessions-per-core from the median: how noisy the machine was.
	Spread []float64 `json:"spread"`
	// PCMRatio is, per N, the transceiver's CPU per carried session (see
	// Step.Carried: a session whose audio did not all reach the backend
	// counts for the part that did) with the first PCM format of
	// Options.Formats divided by that with Opus passthrough, taken within
	// each run and then the median; nil unless both were measured.
	PCMRatio []Ratio `json:"pcm_ratio,omitempty"`
	Runs     int     `json:"runs"`
	Window   time.Duration
	Started  time.Time
}

// Ratio is the median over runs of PCM ÷ Opus CPU per carried session at
// N.
type Ratio struct {
	N     int     `json:"n"`
	Ratio float64 `json:"ratio"`
	Runs  int     `json:"runs"` // runs in which both formats reached N
}

// sample is one run's raw figures at one N.
type sample struct {
	n                          int
	trxCores, genCores         float64
	carried                    float64 // sessions' worth of audio to the backend
	rssKiB, heapKiB, liveKiB   float64
	goroutines                 float64
	toBackend, toClient        [2]float64 // p50, p99 ms
	summary                    callclient.LoadSummary
	idleRSSKiB, idleGoroutines float64
	idleHeapKiB, idleLiveKiB   float64
}

// Run runs the benchmark.
func Run(ctx context.Context, opt Options) (Result, error) {
	if opt.Bin == "" {
		return Result{}, fmt.Errorf("%w: Bin is required", ErrOptions)
	}
	if len(opt.Steps) == 0 {
		opt.Steps = []int{50, 100, 200}
	}
	if !slices.IsSorted(opt.Steps) || opt.Steps[0] <= 0 {
		return Result{}, fmt.Errorf("%w: steps must be positive and rising, got %v", ErrOptions, opt.Steps)
	}
	if opt.Runs <= 0 {
		opt.Runs = 3
	}
	if len(opt.Formats) == 0 {
		opt.Formats = []string{bridge.FormatOpus, bridge.FormatPCM24k}
	}
	for _, f := range opt.Formats {
		switch f {
		case bridge.FormatOpus, bridge.FormatPCM24k, bridge.FormatPCM16k:
		default:
			return Result{}, fmt.Errorf("%w: format %q is none of %s, %s, %s", ErrOptions, f, bridge.FormatOpus, bridge.FormatPCM24k, bridge.FormatPCM16k)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(opt.Formats)))) != len(opt.Formats) {
		return Result{}, fmt.Errorf("%w: format listed twice in %v", ErrOptions, opt.Formats)
	}
	if opt.Window <= 0 {
		opt.Window = 10 * time.Second
	}
	if opt.Ramp <= 0 {
		opt.Ramp = 20 * time.Millisecond
	}
	if opt.TrxCPU == 0 && opt.GenCPU == 0 {
		opt.TrxCPU = 1
	}
	if opt.Log == nil {
		opt.Log = io.Discard
	}
	res := Result{Runs: opt.Runs, Window: opt.Window, Started: time.Now(),
		IdleRSSKiB: map[string]float64{}, IdleGoroutines: map[string]float64{}}
	// all[format][run] holds one run's samples, a step each.
	all := map[string][][]sample{}
	for run := range opt.Runs {
		for _, f := range opt.Formats {
			fmt.Fprintf(opt.Log, "trxbench: run %d/%d, %s\n", run+1, opt.Runs, f)
			ss, err := runOnce(ctx, opt, f, run == 0)
			if err != nil {
				return res, fmt.Errorf("run %d, %s: %w", run+1, f, err)
			}
			all[f] = append(all[f], ss)
		}
	}
	for _, f := range opt.Formats {
		steps, spread := aggregate(opt, f, all[f])
		res.IdleRSSKiB[f] = median(col(all[f], 0, func(s sample) float64 { return s.idleRSSKiB }))
		res.IdleGoroutines[f] = median(col(all[f], 0, func(s sample) float64 { return s.idleGoroutines }))
		res.Steps = append(res.Steps, steps...)
		res.Spread = append(res.Spread, spread...)
	}
	pcm := slices.IndexFunc(opt.Formats, func(f string) bool { return f != bridge.FormatOpus })
	if pcm >= 0 && slices.Contains(opt.Formats, bridge.FormatOpus) {
		res.PCMRatio = ratios(opt.Steps, all[bridge.FormatOpus], all[opt.Formats[pcm]])
	}
	return res, nil
}

// ratios returns, per N, the median over runs of b's CPU per carried
// session ÷ a's, each run's a and b measured one after the other.
func ratios(steps []int, a, b [][]sample) []Ratio {
	var out []Ratio
	for i, n := range steps {
		var xs []float64
		for run := range min(len(a), len(b)) {
			x, y := a[run], b[run]
			if i < len(x) && i < len(y) && x[i].trxCores > 0 && y[i].carried > 0 {
				xs = append(xs, (y[i].trxCores/y[i].carried)/(x[i].trxCores/x[i].carried))
			}
		}
		if len(xs) == 0 {
			break
		}
		out = append(out, Ratio{N: n, Ratio: median(xs), Runs: len(xs)})
	}
	return out
}

// aggregate turns one format's samples (per run, per step) into steps of
// medians and their spreads.
func aggregate(opt Options, format string, all [][]sample) ([]Step, []float64) {
	var steps []Step
	var spreads []float64
	for i, n := range opt.Steps {
		var rows []sample
		for _, ss := range all {
			if i < len(ss) {
				rows = append(rows, ss[i])
			}
		}
		if len(rows) == 0 {
			break
		}
		m := func(f func(s sample) float64) float64 {
			xs := make([]float64, len(rows))
			for j, r := range rows {
				xs[j] = f(r)
			}
			return median(xs)
		}
		// Slopes within each run, then the median.
		slope := func(f, idle func(s sample) float64) float64 {
			var xs []float64
			for _, ss := range all {
				if i >= len(ss) {
					continue
				}
				prevN, prev := 0, idle(ss[i])
				if i > 0 {
					prevN, prev = ss[i-1].n, f(ss[i-1])
				}
				xs = append(xs, (f(ss[i])-prev)/float64(n-prevN))
			}
			return median(xs)
		}
		st := Step{Format: format, N: n, Runs: len(rows)}
		st.TrxCores = m(func(s sample) float64 { return s.trxCores })
		st.PerCore = m(func(s sample) float64 { return float64(s.n) / s.trxCores })
		st.Carried = m(func(s sample) float64 { return s.carried })
		st.PerCoreCarried = m(func(s sample) float64 { return s.carried / s.trxCores })
		st.RSSKiB = m(func(s sample) float64 { return s.rssKiB })
		st.HeapKiB = m(func(s sample) float64 { return s.heapKiB })
		st.RSSPerSession = slope(func(s sample) float64 { return s.rssKiB }, func(s sample) float64 { return s.idleRSSKiB })
		st.LiveKiB = m(func(s sample) float64 { return s.liveKiB })
		st.LivePerSession = slope(func(s sample) float64 { return s.liveKiB }, func(s sample) float64 { return s.idleLiveKiB })
		st.HeapPerSession = slope(func(s sample) float64 { return s.heapKiB }, func(s sample) float64 { return s.idleHeapKiB })
		st.GoroutinesPerSession = m(func(s sample) float64 { return (s.goroutines - s.idleGoroutines) / float64(s.n) })
		st.ToBackendP50 = m(func(s sample) float64 { return s.toBackend[0] })
		st.ToBackendP99 = m(func(s sample) float64 { return s.toBackend[1] })
		st.ToClientP50 = m(func(s sample) float64 { return s.toClient[0] })
		st.ToClientP99 = m(func(s sample) float64 { return s.toClient[1] })
		st.SetupP50MS = m(func(s sample) float64 { return s.summary.SetupMS.P50 })
		st.SetupP99MS = m(func(s sample) float64 { return s.summary.SetupMS.P99 })
		st.GenCores = m(func(s sample) float64 { return s.genCores })
		st.GenBound = st.GenCores >= 0.9
		var spread float64
		for _, r := range rows {
			st.SetupFailures += r.summary.Sessions - r.summary.Connected
			st.Failures += r.summary.Sessions - r.summary.OK
			st.Loss = max(st.Loss, r.summary.Loss)
			if st.PerCore > 0 {
				spread = max(spread, math.Abs(float64(r.n)/r.trxCores-st.PerCore)/st.PerCore)
			}
		}
		steps = append(steps, st)
		spreads = append(spreads, spread)
	}
	return steps, spreads
}

func col(all [][]sample, i int, f func(sample) float64) []float64 {
	var xs []float64
	for _, ss := range all {
		if i < len(ss) {
			xs = append(xs, f(ss[i]))
		}
	}
	return xs
}

// proc is a child process with its output in a file.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func start(opt Options, dir, name string, cpu int, env []string, args ...string) (*proc, error) {
	argv := append([]string{opt.Bin}, args...)
	if path, err := exec.LookPath("taskset"); err == nil && cpu >= 0 {
		argv = append([]string{path, "-c", strconv.Itoa(cpu)}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	if name != "load" {
		cmd.Stdout = logf
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	if name == "load" {
		cmd.Stdout = &strings.Builder{}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

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
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func freeAddr(network string) (string, error) {
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		defer c.Close()
		return c.LocalAddr().String(), nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// stack is the echo agent, the relay and the transceiver, each a process
// of Options.Bin, with their logs in a temporary directory.
type stack struct {
	format   string // the agent's bridge format
	opt      Options
	dir      string
	env      []string
	procs    []*proc // agent, relay, transceiver, then load generators
	trxHTTP  string  // signaling, /metrics, /debug/pprof
	relayOps string
}

// startStack starts the processes, the echo agent asking for format, and
// waits until they are ready.
//
// They run at -log-level warn (the transceiver's per-session lines would
// cost CPU the bench measures), without the start-up lines that name the
// addresses a process bound on port 0; so they get addresses picked free
// beforehand. Another process may take one before the child binds it:
// the child then exits saying so, and the whole stack starts again on
// other addresses.
func startStack(ctx context.Context, opt Options, format string) (*stack, error) {
	for attempt := 1; ; attempt++ {
		st, err := startStackOnce(ctx, opt, format)
		if !errors.Is(err, errAddrTaken) || attempt == 5 {
			return st, err
		}
	}
}

// errAddrTaken is startStackOnce's error when a process exited because an
// address picked for it had been taken meanwhile.
var errAddrTaken = errors.New("an address picked free was taken before the process bound it")

// startStackOnce is one attempt of startStack.
func startStackOnce(ctx context.Context, opt Options, format string) (st *stack, err error) {
	dir, err := os.MkdirTemp("", "trxbench-")
	if err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	st = &stack{format: format, opt: opt, dir: dir, env: []string{"SWITCHBOARD_TOKEN_KEY=" + base64.StdEncoding.EncodeToString(key)}}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	var addrs [6]string // agent, public, internal, relay ops, hop, trx http
	for i, nw := range []string{"tcp", "udp", "udp", "tcp", "udp", "tcp"} {
		if addrs[i], err = freeAddr(nw); err != nil {
			return st, err
		}
	}
	agentAddr, public, internal, hop := addrs[0], addrs[1], addrs[2], addrs[4]
	st.relayOps, st.trxHTTP = addrs[3], addrs[5]
	if _, err := st.start("agent", opt.GenCPU, append([]string{"agent", "-mode", "echo", "-listen", agentAddr, "-format", format, "-log-level", "warn"}, opt.AgentArgs...)...); err != nil {
		return st, err
	}
	// Every client is 127.0.0.1: lift the relay's per-source caps.
	if _, err := st.start("relay", opt.GenCPU, "relay", "-public", public, "-internal", internal, "-metrics", st.relayOps,
		"-workers", "1", "-members", "1="+hop, "-log-level", "warn",
		"-new-flows-per-ip", "1000000", "-max-pending-per-ip", "1000000", "-new-flows-per-second", "1000000"); err != nil {
		return st, err
	}
	// And the transceiver's cap on sessions not yet connected per client
	// address: at a 10–20 ms ramp on a busy machine more than its default
	// 64 are between the answer and DTLS, and it would answer 429.
	if _, err := st.start("transceiver", opt.TrxCPU, append([]string{"transceiver", "-id", "1", "-listen", hop, "-advertise", public,
		"-backend", "ws://" + agentAddr + "/v1/bridge", "-http", st.trxHTTP, "-pprof", "-drain-timeout", "1s",
		"-max-pending-per-client", "1000000"}, opt.TrxArgs...)...); err != nil {
		return st, err
	}
	for _, u := range []string{"http://" + st.trxHTTP + "/ready", "http://" + st.relayOps + "/ready"} {
		if err := st.waitReady(ctx, u, 20*time.Second); err != nil {
			return st, err
		}
	}
	// A process that lost an address exits as it starts; one still
	// running once the others answered holds its addresses (the answer
	// came from it, not from the address's other owner).
	return st, st.running()
}

// waitReady is waitHTTP that gives up as soon as a process of the stack
// has exited.
func (st *stack) waitReady(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := st.running(); err != nil {
			return err
		}
		err := waitHTTP(ctx, url, 100*time.Millisecond)
		if err == nil || ctx.Err() != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v", url, timeout)
		}
	}
}

// running reports the first process of the stack that has exited, with
// errAddrTaken if its log says an address was in use.
func (st *stack) running() error {
	for _, p := range st.procs {
		select {
		case <-p.done:
		default:
			continue
		}
		log, _ := os.ReadFile(filepath.Join(st.dir, p.name+".log"))
		if bytes.Contains(log, []byte("address already in use")) {
			return fmt.Errorf("%s: %w: %s", p.name, errAddrTaken, bytes.TrimSpace(log))
		}
		return fmt.Errorf("%s exited at start (%v): %s", p.name, p.err, bytes.TrimSpace(log))
	}
	return nil
}

// start starts one more process of the stack.
func (st *stack) start(name string, cpu int, args ...string) (*proc, error) {
	p, err := start(st.opt, st.dir, name, cpu, st.env, args...)
	if err == nil {
		st.procs = append(st.procs, p)
	}
	return p, err
}

// trxPID is the transceiver's pid (taskset execs it: the same process).
func (st *stack) trxPID() int { return st.procs[2].cmd.Process.Pid }

// others are the pids of the agent and the relay.
func (st *stack) others() []int {
	return []int{st.procs[0].cmd.Process.Pid, st.procs[1].cmd.Process.Pid}
}

// waitSessions waits until the transceiver has n live sessions.
func (st *stack) waitSessions(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if m, err := scrape(st.trxHTTP); err == nil && m.value("switchboard_transceiver_sessions", "") == float64(n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("transceiver not at %d sessions after %v", n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// close stops every process, last started first, and removes the logs.
func (st *stack) close() {
	for _, p := range slices.Backward(st.procs) {
		p.stop()
	}
	_ = os.RemoveAll(st.dir)
}

// runOnce starts the processes for format and measures every step.
func runOnce(ctx context.Context, opt Options, format string, profile bool) ([]sample, error) {
	st, err := startStack(ctx, opt, format)
	if err != nil {
		return nil, err
	}
	defer st.close()
	trxHTTP := st.trxHTTP
	pid := st.trxPID()
	// Idle figures, after the first GC cycles of start-up settle.
	time.Sleep(2 * time.Second)
	idleLive, err := liveKiB(trxHTTP)
	if err != nil {
		return nil, err
	}
	idle, err := scrape(trxHTTP)
	if err != nil {
		return nil, err
	}
	idleRSS, err := rssKiB(pid)
	if err != nil {
		return nil, err
	}
	var out []sample
	for i, n := range opt.Steps {
		s := sample{n: n, idleRSSKiB: idleRSS, idleGoroutines: idle.value("go_goroutines", ""),
			idleHeapKiB: idle.value("go_memstats_heap_inuse_bytes", "") / 1024, idleLiveKiB: idleLive}
		prof := ""
		if profile && opt.ProfileDir != "" && i == len(opt.Steps)-1 {
			prof = opt.ProfileDir
		}
		if err := step(ctx, st, &s, prof); err != nil {
			return out, fmt.Errorf("with %d sessions: %w", n, err)
		}
		fmt.Fprintf(opt.Log, "trxbench: %s N=%d: transceiver %.3f cores (%.0f sessions/core, %.0f carried), RSS %.0f KiB, live heap %.0f KiB, %.0f goroutines, generator %.2f cores, to_backend p50 %.3f ms p99 %.3f ms, failures %v, not back %.4f\n",
			format, n, s.trxCores, float64(n)/s.trxCores, s.carried, s.rssKiB, s.liveKiB, s.goroutines, s.genCores, s.toBackend[0], s.toBackend[1], s.summary.Failures, s.summary.Loss)
		out = append(out, s)
	}
	return out, nil
}

// step runs N sessions and measures them.
func step(ctx context.Context, st *stack, s *sample, profileDir string) error {
	opt, trxHTTP, pid, n := st.opt, st.trxHTTP, st.trxPID(), s.n
	rampTime := time.Duration(n) * opt.Ramp
	settle := 3 * time.Second
	dur := rampTime + settle + opt.Window + 2*time.Second
	gen, err := st.start("load", opt.GenCPU, append([]string{"load", "http://" + trxHTTP + "/v1/calls",
		"-sessions", strconv.Itoa(n), "-duration", dur.String(), "-ramp", opt.Ramp.String(), "-progress", "0"}, opt.GenArgs...)...)
	if err != nil {
		return err
	}
	// Wait for every session to be up at the transceiver.
	deadline := time.Now().Add(rampTime + 30*time.Second)
	for {
		m, err := scrape(trxHTTP)
		if err == nil && m.value("switchboard_transceiver_sessions", "") >= float64(n) {
			break
		}
		if time.Now().After(deadline) {
			break // measure what is up; the summary counts the failures
		}
		select {
		case <-gen.done:
			return fmt.Errorf("generator exited early: %v: %s", gen.err, gen.cmd.Stdout)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	time.Sleep(settle)
	m0, err := scrape(trxHTTP)
	if err != nil {
		return err
	}
	c0, err := cpuTicks(pid)
	if err != nil {
		return err
	}
	// taskset execs the binary: the pid is the generator's.
	side := append([]int{gen.cmd.Process.Pid}, st.others()...)
	g0 := sumTicks(side)
	t0 := time.Now()
	profDone := make(chan error, 1)
	if profileDir != "" {
		go func() {
			profDone <- fetchProfile(trxHTTP, "profile?seconds="+strconv.Itoa(int(opt.Window.Seconds())), filepath.Join(profileDir, fmt.Sprintf("trx-cpu-%s-%d.pprof", fileFormat(st.format), n)))
		}()
	} else {
		profDone <- nil
	}
	time.Sleep(opt.Window)
	c1, err := cpuTicks(pid)
	if err != nil {
		return err
	}
	g1 := sumTicks(side)
	wall := time.Since(t0).Seconds()
	m1, err := scrape(trxHTTP)
	if err != nil {
		return err
	}
	if s.rssKiB, err = rssKiB(pid); err != nil {
		return err
	}
	s.trxCores = float64(c1-c0) / clkTck / wall
	s.genCores = float64(g1-g0) / clkTck / wall
	s.heapKiB = m1.value("go_memstats_heap_inuse_bytes", "") / 1024
	const delayCount = "switchboard_transceiver_media_delay_seconds_count"
	s.carried = (m1.value(delayCount, "to_backend") - m0.value(delayCount, "to_backend")) * probeSample / wall / packetsPerSecond
	s.goroutines = m1.value("go_goroutines", "")
	for _, d := range []struct {
		dir string
		dst *[2]float64
	}{{"to_backend", &s.toBackend}, {"to_client", &s.toClient}} {
		b0, b1 := m0.buckets("switchboard_transceiver_media_delay_seconds", d.dir), m1.buckets("switchboard_transceiver_media_delay_seconds", d.dir)
		d.dst[0], d.dst[1] = quantileDiff(b0, b1, 0.5)*1000, quantileDiff(b0, b1, 0.99)*1000
	}
	if err := <-profDone; err != nil {
		return err
	}
	if s.liveKiB, err = liveKiB(trxHTTP); err != nil {
		return err
	}
	if profileDir != "" {
		if err := fetchProfile(trxHTTP, "heap", filepath.Join(profileDir, fmt.Sprintf("trx-heap-%s-%d.pprof", fileFormat(st.format), n))); err != nil {
			return err
		}
		if err := fetchProfile(trxHTTP, "goroutine?debug=1", filepath.Join(profileDir, fmt.Sprintf("trx-goroutine-%s-%d.txt", fileFormat(st.format), n))); err != nil {
			return err
		}
	}
	select {
	case <-gen.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(dur + time.Minute):
		return errors.New("generator did not finish")
	}
	out := gen.cmd.Stdout.(*strings.Builder).String()
	if err := json.Unmarshal([]byte(out), &s.summary); err != nil {
		return fmt.Errorf("generator summary: %w: %q", err, out)
	}
	// The next step starts from no sessions.
	return st.waitSessions(ctx, 0, 30*time.Second)
}

// fileFormat names a bridge format in a file name: "opus-48000-2".
func fileFormat(f string) string { return strings.ReplaceAll(f, "/", "-") }

// liveKiB forces a GC in the process serving addr (its heap profile with
// gc=1) and returns its live heap, KiB.
func liveKiB(addr string) (float64, error) {
	resp, err := httpc.Get("http://" + addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	m, err := scrape(addr)
	if err != nil {
		return 0, err
	}
	return m.value("go_memstats_heap_alloc_bytes", "") / 1024, nil
}

func fetchProfile(addr, what, path string) error {
	resp, err := httpc.Get("http://" + addr + "/debug/pprof/" + what)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := httpc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v", url, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probeSample is the transceiver's delay probe sampling (1 packet in 8,
// internal/transceiver/delay.go); packetsPerSecond the audio rate of one
// session, each way.
const (
	probeSample      = 8
	packetsPerSecond = 50
)

// clkTck is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux architecture Go supports.
const clkTck = 100

// cpuTicks returns utime+stime of pid (proc(5), fields 14 and 15).
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStat(string(b))
}

func parseStat(s string) (int64, error) {
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("malformed /proc stat times")
	}
	return u + k, nil
}

// sumTicks returns the CPU ticks of pids together; a pid that cannot be
// read counts 0.
func sumTicks(pids []int) int64 {
	var t int64
	for _, p := range pids {
		v, _ := cpuTicks(p)
		t += v
	}
	return t
}

// rssKiB returns VmRSS of pid.
func rssKiB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb, err
		}
	}
	return 0, errors.New("no VmRSS")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
