// Package relaybench is `switchboard-bench relay`: it measures Switchboard's
// relay against a raw UDP ceiling, a naive Go proxy and coturn, on one
// machine in one run, and prints a markdown table (docs/benchmarks.md).
//
// Each system under test runs as a child process pinned to one CPU
// (taskset), so its CPU time is read per process from
// /proc/<pid>/task/*/schedstat. The load generator (gen_linux.go) runs in
// this process, pinned to another CPU, and plays both the clients and the
// sink (fake transceiver / TURN peer) so that one-way latency is measured
// on one monotonic clock from timestamps in the payload.
//
// Per system and run: session setup (real STUN Binding requests carrying
// real tokens for the relay; TURN Allocate, CreatePermission and
// ChannelBind for coturn), a step of Sessions × PPS each way, a ramp to
// saturation (from 20k pps, ×1.3 per step; capacity is the best step with
// at most 1% loss), then latency steps at 10%, 50% and 80% of that system's own
// capacity. Each number in the table is the median over Runs runs.
package relaybench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pion/stun/v4"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/coturn"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// Options configure a benchmark run.
type Options struct {
	// Systems to measure, in order: raw, raw-nolock, relay, relay-nobatch, naive, coturn.
	Systems []string
	// Runs per system; each table cell is the median.
	Runs int
	// Sessions and PPS shape the voice step: Sessions × PPS datagrams per second each way.
	Sessions, PPS int
	// Step is the length of each measured load step; Ramp of each ramp step.
	Step, Ramp time.Duration
	// LoadCPU runs the load generator, SUTCPU the system under test.
	LoadCPU, SUTCPU int
	// Serve returns the command that runs `bench serve` with args (a Go
	// system under test); the harness pins it with taskset.
	Serve func(args []string) *exec.Cmd
	// MaxRate stops the ramp at this many client datagrams per second; 0
	// means no limit (the smoke test bounds its duration with it).
	MaxRate float64
	// Log receives progress lines (may be nil).
	Log io.Writer
}

// Defaults returns the default options; quick shortens everything to a
// smoke run of about a minute.
func Defaults(quick bool) Options {
	o := Options{
		Systems:  []string{"raw", "raw-nolock", "relay", "relay-nobatch", "naive", "coturn"},
		Runs:     3,
		Sessions: 2000, PPS: 50,
		Step: 3 * time.Second, Ramp: time.Second,
		LoadCPU: 0, SUTCPU: 1,
	}
	if quick {
		o.Runs, o.Step, o.Ramp = 1, time.Second, 300*time.Millisecond
	}
	return o
}

// result is one system's numbers from one run.
type result struct {
	capPPS     float64 // forwarded datagrams per second at capacity, both directions
	capUtil    float64 // CPU utilization of the system at capacity (1 = one core)
	perCPUSec  float64 // forwarded datagrams per CPU-second at capacity
	genBound   bool    // the ramp stopped because the generator could not keep up
	voicePPS   float64 // forwarded per second at Sessions × PPS
	voiceCPUus float64 // CPU-µs per forwarded datagram at Sessions × PPS
	voiceLoss  float64
	lat        [3][3]float64 // [10%, 50%, 80%][p50, p99, p99.9] added one-way µs
	latLoss    [3]float64
}

var loadFractions = [3]float64{0.1, 0.5, 0.8}

// Run measures every system opt.Runs times and writes the markdown report to w.
func Run(ctx context.Context, opt Options, w io.Writer) error {
	if opt.Serve == nil {
		return errors.New("bench: Options.Serve is nil")
	}
	logf := func(format string, args ...any) {
		if opt.Log != nil {
			fmt.Fprintf(opt.Log, format+"\n", args...)
		}
	}
	if runtime.NumCPU() < 2 {
		return errors.New("bench: needs two CPUs (one for the load generator, one for the system under test)")
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		return fmt.Errorf("bench: taskset (util-linux) is needed to pin the system under test: %w", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := pinProcess(os.Getpid(), opt.LoadCPU); err != nil {
		return fmt.Errorf("bench: pin load generator: %w", err)
	}
	g, err := newGen(opt.Sessions)
	if err != nil {
		return err
	}
	defer g.close()
	sinkAddr := g.sink.LocalAddr().(*net.UDPAddr).AddrPort()

	// Direct loopback one-way latency, client → sink → client with no
	// system in between: subtracted from every latency as "added".
	g.cli.setTarget(sinkAddr)
	g.pump(float64(opt.Sessions*opt.PPS), opt.Step/2, 50*time.Millisecond)
	d0 := float64(g.hist.quantile(0.5)) / 1e3
	direct := [3]float64{d0, float64(g.hist.quantile(0.99)) / 1e3, float64(g.hist.quantile(0.999)) / 1e3}
	logf("direct loopback one-way p50/p99/p99.9 %.1f/%.1f/%.1f µs (p50 is subtracted as the baseline)", direct[0], direct[1], direct[2])

	results := map[string][]result{}
	for run := range opt.Runs {
		for _, sys := range opt.Systems {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			res, err := measure(ctx, opt, g, sys, sinkAddr, d0, logf)
			if errors.Is(err, errSkip) {
				logf("%s: skipped: %v", sys, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("bench: %s (run %d): %w", sys, run+1, err)
			}
			results[sys] = append(results[sys], res)
			logf("%s run %d: capacity %.0f pkt/s (cpu %.0f%%, %.0f pkt/CPU-s), voice %.2f CPU-µs/pkt loss %.3f%%, p99 @50%% %.1f µs",
				sys, run+1, res.capPPS, res.capUtil*100, res.perCPUSec, res.voiceCPUus, res.voiceLoss*100, res.lat[1][1])
		}
	}
	writeReport(w, opt, results, direct)
	return nil
}

var errSkip = errors.New("not available")

// sut is a running system under test.
type sut struct {
	pid       int            // its process (pinned to Options.SUTCPU)
	pub, int_ netip.AddrPort // its public and internal-hop addresses
	close     func()         // stops it and waits for it
}

func (s *sut) stop() { s.close() }

func pinned(cpu int, cmd *exec.Cmd) *exec.Cmd {
	c := exec.Command("taskset", append([]string{"-c", strconv.Itoa(cpu), cmd.Path}, cmd.Args[1:]...)...)
	c.Env = cmd.Env
	c.Stderr = os.Stderr
	return c
}

func startGo(opt Options, args []string) (*sut, error) {
	cmd := pinned(opt.SUTCPU, opt.Serve(args))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &sut{pid: cmd.Process.Pid, close: func() {
		stdin.Close() // the system under test exits at EOF on stdin
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				line <- sc.Text()
			}
		}
	}()
	select {
	case l := <-line:
		f := strings.Fields(l)
		if len(f) == 3 {
			s.pub, err = netip.ParseAddrPort(f[1])
			if err == nil {
				s.int_, err = netip.ParseAddrPort(f[2])
			}
			if err == nil {
				return s, nil
			}
		}
		err = fmt.Errorf("bad READY line %q", l)
	case <-time.After(10 * time.Second):
		err = errors.New("system under test did not report READY")
	}
	s.stop()
	return nil, err
}

// startCoturn starts coturn without authentication, one relay thread,
// pinned like the other systems under test.
func startCoturn(opt Options) (*sut, error) {
	t, err := coturn.Start(coturn.Config{RelayThreads: 1, Wrap: func(c *exec.Cmd) *exec.Cmd {
		p := pinned(opt.SUTCPU, c)
		p.Stderr = nil
		return p
	}})
	if errors.Is(err, coturn.ErrNotInstalled) {
		return nil, fmt.Errorf("%w: %v", errSkip, err)
	}
	if err != nil {
		return nil, err
	}
	return &sut{pid: t.PID(), pub: t.Addr, close: t.Stop}, nil
}

// txID encodes session i and a phase in a STUN transaction id.
func txID(i int, phase byte) [stun.TransactionIDSize]byte {
	var id [stun.TransactionIDSize]byte
	binary.BigEndian.PutUint32(id[0:], uint32(i))
	id[4] = phase
	id[5] = 0x5b
	return id
}

// stunDone returns an onSetup hook marking done[i] for a response (or an
// echo) to session i's transaction in phase.
func stunDone(done []bool, phase byte, wantClass stun.MessageClass, firstErr *error) func(b []byte) {
	return func(b []byte) {
		if !stun.IsMessage(b) {
			return
		}
		m := &stun.Message{Raw: append([]byte(nil), b...)}
		if m.Decode() != nil || m.TransactionID[4] != phase || m.TransactionID[5] != 0x5b {
			return
		}
		i := int(binary.BigEndian.Uint32(m.TransactionID[0:]))
		if i >= len(done) {
			return
		}
		if m.Type.Class == wantClass {
			done[i] = true
			return
		}
		if *firstErr == nil {
			var code stun.ErrorCodeAttribute
			_ = code.GetFrom(m)
			*firstErr = fmt.Errorf("%v: %v", m.Type, code)
		}
	}
}

type xorPeer netip.AddrPort

func (p xorPeer) AddTo(m *stun.Message) error {
	a := netip.AddrPort(p)
	x := stun.XORMappedAddress{IP: a.Addr().AsSlice(), Port: int(a.Port())}
	return x.AddToAs(m, stun.AttrXORPeerAddress)
}

// setup creates the sessions on the system under test.
func setup(g *gen, sys string, secret []byte, sink netip.AddrPort) error {
	n := g.sessions
	var firstErr error
	step := func(phase byte, class stun.MessageClass, build func(i int) []byte) error {
		done := make([]bool, n)
		g.onSetup = stunDone(done, phase, class, &firstErr)
		got := g.transact(8, 300*time.Millisecond, done, build)
		g.onSetup = func([]byte) {}
		if got != n {
			return fmt.Errorf("phase %d: %d of %d sessions set up (first error: %v)", phase, got, n, firstErr)
		}
		return nil
	}
	switch sys {
	case "raw", "raw-nolock":
		return nil // no state to create
	case "coturn":
		if err := step(1, stun.ClassSuccessResponse, func(i int) []byte {
			return stun.MustBuild(stun.NewTransactionIDSetter(txID(i, 1)), stun.NewType(stun.MethodAllocate, stun.ClassRequest),
				stun.RawAttribute{Type: stun.AttrRequestedTransport, Value: []byte{17, 0, 0, 0}}, stun.Fingerprint).Raw
		}); err != nil {
			return err
		}
		if err := step(2, stun.ClassSuccessResponse, func(i int) []byte {
			return stun.MustBuild(stun.NewTransactionIDSetter(txID(i, 2)), stun.NewType(stun.MethodCreatePermission, stun.ClassRequest),
				xorPeer(sink), stun.Fingerprint).Raw
		}); err != nil {
			return err
		}
		return step(3, stun.ClassSuccessResponse, func(i int) []byte {
			return stun.MustBuild(stun.NewTransactionIDSetter(txID(i, 3)), stun.NewType(stun.MethodChannelBind, stun.ClassRequest),
				stun.RawAttribute{Type: stun.AttrChannelNumber, Value: []byte{0x40, 0, 0, 0}}, xorPeer(sink), stun.Fingerprint).Raw
		})
	default: // relay, naive: a Binding request with a token, echoed by the sink
		keys, err := token.NewKeyring(token.Key{ID: 1, Secret: secret})
		if err != nil {
			return err
		}
		reqs := make([][]byte, n)
		for i := range reqs {
			u, err := keys.Seal(token.Claims{Cluster: benchCluster, Transceiver: benchTransceiver, IssuedMinute: token.MinuteOf(time.Now())}, rand.Reader)
			if err != nil {
				return err
			}
			reqs[i] = stun.MustBuild(stun.NewTransactionIDSetter(txID(i, 4)), stun.BindingRequest,
				stun.NewUsername(u+":cli"+strconv.Itoa(i)), stun.NewShortTermIntegrity("bench-pwd"), stun.Fingerprint).Raw
		}
		return step(4, stun.ClassRequest, func(i int) []byte { return reqs[i] })
	}
}

func measure(ctx context.Context, opt Options, g *gen, sys string, sink netip.AddrPort, d0 float64, logf func(string, ...any)) (result, error) {
	var res result
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	var s *sut
	var err error
	switch sys {
	case "raw":
		s, err = startGo(opt, []string{"-system", "raw", "-sink", sink.String()})
	case "raw-nolock":
		// What pinning a read loop to its thread buys, measured on the
		// raw loop: the relay's loops are always pinned.
		s, err = startGo(opt, []string{"-system", "raw", "-sink", sink.String(), "-lock=false"})
	case "relay", "relay-nobatch":
		args := []string{"-system", "relay", "-sink", sink.String(), "-secret", hex.EncodeToString(secret)}
		if sys == "relay-nobatch" {
			args = append(args, "-batch", "1")
		}
		s, err = startGo(opt, args)
	case "naive":
		s, err = startGo(opt, []string{"-system", "naive", "-sink", sink.String()})
	case "coturn":
		s, err = startCoturn(opt)
	default:
		return res, fmt.Errorf("unknown system %q", sys)
	}
	if err != nil {
		return res, err
	}
	defer s.stop()
	pid := s.pid
	if err := pinProcess(pid, opt.SUTCPU); err != nil { // taskset pinned it; this adds the priority
		return res, err
	}
	g.cli.setTarget(s.pub)
	g.chanHdr = sys == "coturn"
	g.sinkHdr = strings.HasPrefix(sys, "relay") || sys == "naive"
	if err := setup(g, sys, secret, sink); err != nil {
		return res, err
	}
	const drain = 50 * time.Millisecond
	step := func(rate float64, d time.Duration) (counts, time.Duration) {
		c0, _ := procCPU(pid)
		c := g.pump(rate, d, drain)
		c1, _ := procCPU(pid)
		return c, c1 - c0
	}
	// Warm up, then the voice step.
	g.pump(float64(opt.Sessions*opt.PPS), opt.Ramp, drain)
	c, cpu := step(float64(opt.Sessions*opt.PPS), opt.Step)
	res.voicePPS = float64(c.forwarded()) / opt.Step.Seconds()
	res.voiceCPUus = float64(cpu.Microseconds()) / float64(max(c.forwarded(), 1))
	res.voiceLoss = c.loss()

	// Ramp to saturation, from well below any system's capacity. Capacity is
	// the best forwarded rate of a step with at most 1% loss. The ramp goes
	// on through a lossy step (on a shared machine a burst of other work can
	// stall a pinned process long enough to overflow a socket buffer) and
	// stops after two bad steps in a row (see below) or at MaxRate.
	rate := 20_000.0
	lossy := 0
	for ctx.Err() == nil {
		c, cpu := step(rate, opt.Ramp)
		fwd := float64(c.forwarded()) / opt.Ramp.Seconds()
		achieved := float64(c.cliSent) / opt.Ramp.Seconds()
		logf("  %s ramp: offered %.0f/s, sent %.0f/s, forwarded %.0f/s, loss %.2f%%, cpu %.0f%%",
			sys, rate, achieved, fwd, 100*c.loss(), 100*cpu.Seconds()/(opt.Ramp+drain).Seconds())
		if c.loss() <= 0.01 && fwd > res.capPPS {
			res.capPPS = fwd
			res.capUtil = cpu.Seconds() / (opt.Ramp + drain).Seconds()
			res.perCPUSec = float64(c.forwarded()) / max(cpu.Seconds(), 1e-9)
		}
		// A step is bad if it lost more than 5% or the generator fell more
		// than 10% short of the offered rate; stop after two in a row
		// (one alone is often a burst of other work on a shared machine).
		short := achieved < 0.9*rate
		if c.loss() <= 0.05 && !short {
			lossy = 0
		} else if lossy++; lossy == 2 {
			res.genBound = short
			break
		}
		if opt.MaxRate > 0 && rate*1.3 > opt.MaxRate {
			break
		}
		rate *= 1.3
	}
	// Latency at fractions of this system's capacity.
	for j, f := range loadFractions {
		c, _ := step(f*res.capPPS/2, opt.Step)
		for k, q := range []float64{0.5, 0.99, 0.999} {
			res.lat[j][k] = max(0, float64(g.hist.quantile(q))/1e3-d0)
		}
		res.latLoss[j] = c.loss()
	}
	return res, nil
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

func med(rs []result, f func(result) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return median(xs)
}

var systemNames = map[string]string{
	"raw":           "(a) raw ceiling",
	"raw-nolock":    "(a') raw ceiling, no LockOSThread",
	"relay":         "(b) Switchboard relay",
	"relay-nobatch": "(b') relay, Batch=1",
	"naive":         "(c) naive Go proxy",
	"coturn":        "(d) coturn",
}

func writeReport(w io.Writer, opt Options, results map[string][]result, direct [3]float64) {
	d0 := direct[0]
	perCPU := func(sys string) float64 { return med(results[sys], func(r result) float64 { return r.perCPUSec }) }
	ratio := func(a, b float64) string {
		if a == 0 || b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", a/b)
	}
	fmt.Fprintf(w, "Sessions %d × %d pps each way; %d run(s), medians; step %v, ramp step %v; load generator on CPU %d, system under test on CPU %d; added latency = one-way minus direct loopback p50 (%.1f µs).\n\n",
		opt.Sessions, opt.PPS, opt.Runs, opt.Step, opt.Ramp, opt.LoadCPU, opt.SUTCPU, d0)
	fmt.Fprintln(w, "| system | capacity (fwd pkt/s) | CPU at capacity | pkt per CPU-second | CPU-µs/pkt at capacity | CPU-µs/pkt at 2k×50 pps | loss at 2k×50 pps | vs (a) | vs coturn |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, sys := range opt.Systems {
		rs := results[sys]
		if len(rs) == 0 {
			fmt.Fprintf(w, "| %s | not run | | | | | | | |\n", systemNames[sys])
			continue
		}
		capNote := ""
		for _, r := range rs {
			if r.genBound {
				capNote = " (gen-bound)"
			}
		}
		pc := perCPU(sys)
		fmt.Fprintf(w, "| %s | %.0f%s | %.0f%% | %.0f | %.2f | %.2f | %.3f%% | %s | %s |\n", systemNames[sys],
			med(rs, func(r result) float64 { return r.capPPS }), capNote,
			100*med(rs, func(r result) float64 { return r.capUtil }), pc, 1e6/max(pc, 1e-9),
			med(rs, func(r result) float64 { return r.voiceCPUus }),
			100*med(rs, func(r result) float64 { return r.voiceLoss }),
			ratio(pc, perCPU("raw")), ratio(pc, perCPU("coturn")))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Added one-way latency, µs (p50 / p99 / p99.9), and loss, at a fraction of each system's own capacity:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| system | 10% | 50% | 80% | loss 10/50/80% |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	fmt.Fprintf(w, "| direct loopback, no system (absolute one-way, at 2k×50 pps) | %s / %s / %s | | | |\n", us(direct[0]), us(direct[1]), us(direct[2]))
	for _, sys := range opt.Systems {
		rs := results[sys]
		if len(rs) == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s ", systemNames[sys])
		for j := range loadFractions {
			fmt.Fprintf(w, "| %s / %s / %s ", us(med(rs, func(r result) float64 { return r.lat[j][0] })),
				us(med(rs, func(r result) float64 { return r.lat[j][1] })), us(med(rs, func(r result) float64 { return r.lat[j][2] })))
		}
		fmt.Fprintf(w, "| %.3f / %.3f / %.3f%% |\n", 100*med(rs, func(r result) float64 { return r.latLoss[0] }),
			100*med(rs, func(r result) float64 { return r.latLoss[1] }), 100*med(rs, func(r result) float64 { return r.latLoss[2] }))
	}
}

// us formats microseconds; the histogram tops out at 20 ms.
func us(v float64) string {
	if v >= histMax/1e3-50 {
		return "≥20000"
	}
	return fmt.Sprintf("%.1f", v)
}
