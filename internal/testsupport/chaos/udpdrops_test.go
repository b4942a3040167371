package chaos

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/impair"
)

// dropWatch samples, for each of a harness's processes, the kernel's
// receive-side drops of its UDP sockets: the "drops" column of
// /proc/net/udp and /proc/net/udp6 (the socket's sk_drops, mostly
// datagrams refused because its receive buffer was full), matched to
// the process by socket inode through /proc/PID/fd. The processes all
// share the machine's network namespace with whatever else runs, so
// the system-wide counters (Udp RcvbufErrors) would count others'
// drops; per-socket counts are only ours.
//
// A socket counts from its creation, so a socket the test's processes
// opened holds only the test's drops. Sockets closed between two samples
// (a client session ending) lose what they dropped since the last
// sample; sampling every 100 ms keeps that small.
type dropWatch struct {
	h    *harness
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	socks map[uint64]sockDrops // by socket inode
}

type sockDrops struct {
	proc  string // the owning process's name
	drops uint64 // the largest value sampled
}

func watchDrops(h *harness) *dropWatch {
	w := &dropWatch{h: h, stop: make(chan struct{}), done: make(chan struct{}), socks: map[uint64]sockDrops{}}
	go func() {
		defer close(w.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			w.sample()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	h.t.Cleanup(w.close)
	return w
}

func (w *dropWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// sample reads every live process's socket inodes and the drops of each.
func (w *dropWatch) sample() {
	w.h.mu.Lock()
	procs := slices.Clone(w.h.procs)
	w.h.mu.Unlock()
	owner := map[uint64]string{}
	for _, p := range procs {
		if p.exited() || p.cmd.Process == nil {
			continue
		}
		for _, ino := range socketInodes(p.cmd.Process.Pid) {
			owner[ino] = p.name
		}
	}
	drops := map[uint64]uint64{}
	for _, f := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		readUDPTable(f, drops)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for ino, name := range owner {
		d, ok := drops[ino]
		if !ok {
			continue
		}
		if s := w.socks[ino]; d >= s.drops {
			w.socks[ino] = sockDrops{proc: name, drops: d}
		}
	}
}

// byProc returns the drops so far summed by process name (one sample
// taken now first, so that live sockets are current), 0 for a process
// whose sockets dropped nothing.
func (w *dropWatch) byProc() map[string]uint64 {
	w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]uint64{}
	w.h.mu.Lock()
	for _, p := range w.h.procs {
		out[p.name] = 0
	}
	w.h.mu.Unlock()
	for _, s := range w.socks {
		out[s.proc] += s.drops
	}
	return out
}

// socketInodes lists the inodes of pid's sockets (its fds that link to
// "socket:[INODE]").
func socketInodes(pid int) []uint64 {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []uint64
	for _, e := range ents {
		l, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(l, "socket:[") {
			continue
		}
		if ino, err := strconv.ParseUint(strings.TrimSuffix(l[len("socket:["):], "]"), 10, 64); err == nil {
			out = append(out, ino)
		}
	}
	return out
}

// readUDPTable adds each socket's drops in a /proc/net/udp-format table
// (inode is the 10th field, drops the last) to drops.
func readUDPTable(path string, drops map[uint64]uint64) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 13 {
			continue
		}
		ino, err1 := strconv.ParseUint(f[9], 10, 64)
		d, err2 := strconv.ParseUint(f[len(f)-1], 10, 64)
		if err1 == nil && err2 == nil {
			drops[ino] = d
		}
	}
}

// softnetDrops sums the second column of /proc/net/softnet_stat: packets
// the kernel dropped because a CPU's input backlog (net.core.netdev_max_backlog)
// was full, which loopback traffic passes through. It is machine-wide, so
// it cannot explain a loss; it is reported beside one.
func softnetDrops() uint64 {
	b, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		return 0
	}
	var sum uint64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			v, _ := strconv.ParseUint(f[1], 16, 64)
			sum += v
		}
	}
	return sum
}

// audioProc reports whether the audio of a load run crosses the UDP
// sockets of the harness process named name: the load's clients, the
// impairment proxy, the relay and the transceivers do; the agent (the
// bridge is a WebSocket) and redis-server do not, and their kernel drops
// cannot explain lost audio.
func audioProc(name string) bool {
	for _, p := range []string{"switchboard load", "impairproxy", "relay", "transceiver"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// lossCounters are the product's counters of datagrams dropped for a
// reason audio can hit (a client's or the echo's RTP, or the bridge
// record that carries it), as exposed series. Reasons that only a
// client's first STUN check, a control message or a datagram longer
// than any audio packet of the load can have are left out (a relay
// delaying new flows by rate, say, counts thousands of checks at the
// start of a run), and so is srtp_auth: here it counts the replays of
// the proxy's duplicates, which are not loss. A reason added to a family
// in dropFamilies and left out here is reported beside the loss, not
// counted: loss it drops then shows up as unexplained.
var lossCounters = []string{
	`switchboard_transceiver_peer_dropped_total{reason="rtp_queue_full"}`,
	`switchboard_transceiver_peer_dropped_total{reason="srtp_not_ready"}`,
	`switchboard_transceiver_peer_dropped_total{reason="unknown_address"}`,
	`switchboard_transceiver_hop_dropped_total{reason="not_hop"}`,
	`switchboard_transceiver_hop_dropped_total{reason="untrusted"}`,
	`switchboard_transceiver_hop_dropped_total{reason="send_failed"}`,
	`switchboard_transceiver_client_audio_dropped_total{reason="invalid_rtp"}`,
	`switchboard_transceiver_client_audio_dropped_total{reason="invalid_opus"}`,
	`switchboard_transceiver_client_audio_dropped_total{reason="late"}`,
	`switchboard_transceiver_backend_input_refused_total{reason="output_queue_full"}`,
	"switchboard_transceiver_output_packets_dropped_total",
	`switchboard_transceiver_bridge_v2_dropped_total{reason="malformed"}`,
	`switchboard_transceiver_bridge_v2_dropped_total{reason="unknown_kind"}`,
	`switchboard_transceiver_bridge_v2_dropped_total{reason="unknown_session"}`,
	`switchboard_transceiver_bridge_v2_dropped_total{reason="closed_session"}`,
	`switchboard_transceiver_bridge_v2_dropped_total{reason="queue_full"}`,
	`switchboard_relay_drops_total{reason="not_stun_on_miss"}`,
	`switchboard_relay_drops_total{reason="transceiver_gone"}`,
	`switchboard_relay_drops_total{reason="ingress_bad_header"}`,
	`switchboard_relay_drops_total{reason="flow_cache_miss"}`,
	`switchboard_relay_drops_total{reason="flow_cache_down"}`,
	`switchboard_relay_drops_total{reason="flow_cache_timeout"}`,
	`switchboard_relay_drops_total{reason="flow_cache_hold_full"}`,
	`switchboard_relay_drops_total{reason="flow_cache_stale"}`,
	`switchboard_relay_drops_total{reason="internal_unknown_peer"}`,
	`switchboard_relay_drops_total{reason="internal_bad_header"}`,
	`switchboard_relay_drops_total{reason="internal_no_flow"}`,
	`switchboard_relay_drops_total{reason="internal_flow_mismatch"}`,
	`switchboard_relay_drops_total{reason="read_error"}`,
	`switchboard_relay_drops_total{reason="write_error"}`,
	`switchboard_relay_drops_total{reason="tcp_queue_full"}`,
	`switchboard_relay_drops_total{reason="tcp_no_connection"}`,
}

// dropFamilies are the datagram drop counters lossCounters picks from;
// their other series are reported beside the loss as drops that are not
// audio loss.
var dropFamilies = []string{
	"switchboard_transceiver_peer_dropped_total",
	"switchboard_transceiver_hop_dropped_total",
	"switchboard_transceiver_client_audio_dropped_total",
	"switchboard_transceiver_bridge_v2_dropped_total",
	"switchboard_relay_drops_total",
}

// lossAccount splits the audio a load run lost between the places that
// lost it: the impairment proxy's coin flips, the kernel at one of the
// sockets audio crosses, the product's drop counters of reasons audio can
// hit, and the rest.
type lossAccount struct {
	sent, lost int
	// proxyRate is the proxy's drop rate over the datagrams it saw (both
	// directions), and atProxy the packets it explains: an echoed packet
	// crosses the proxy twice, sent × (1 − (1 − proxyRate)²), with sigma
	// the binomial standard deviation of that.
	proxyRate, atProxy, sigma float64
	kernel                    map[string]uint64 // kernel socket drops by process audio crosses
	kernelSum                 uint64
	counters                  map[string]float64 // the lossCounters that are not 0
	countersSum               float64
	// Drops that cannot be audio loss, reported only: the kernel's at
	// the sockets of processes audio does not cross, and the other
	// series of dropFamilies.
	otherKernel   map[string]uint64
	otherCounters map[string]float64
	otherSum      float64
	// unexplained = lost − atProxy − (kernelSum + countersSum) ×
	// (1 − proxyRate), and margin what the test allows of it: 4 sigma and
	// 0.1% of sent.
	unexplained, margin float64
}

func accountLoss(sent, recv int, ps impair.Stats, kernel map[string]uint64, ms ...metrics) lossAccount {
	a := lossAccount{sent: sent, lost: sent - recv, kernel: map[string]uint64{}, counters: map[string]float64{},
		otherKernel: map[string]uint64{}, otherCounters: map[string]float64{}}
	if seen := ps.Forwarded + ps.Dropped; seen > 0 {
		a.proxyRate = float64(ps.Dropped) / float64(seen)
	}
	q := 1 - (1-a.proxyRate)*(1-a.proxyRate)
	a.atProxy = float64(sent) * q
	a.sigma = math.Sqrt(float64(sent) * q * (1 - q))
	for name, d := range kernel {
		if audioProc(name) {
			a.kernel[name] = d
			a.kernelSum += d
		} else if d != 0 {
			a.otherKernel[name] = d
		}
	}
	audio := map[string]bool{}
	for _, name := range lossCounters {
		audio[name] = true
		for _, m := range ms {
			if v := m[name]; v != 0 {
				a.counters[name] += v
				a.countersSum += v
			}
		}
	}
	for _, m := range ms {
		for series, v := range m {
			if v == 0 || audio[series] {
				continue
			}
			for _, f := range dropFamilies {
				if series == f || strings.HasPrefix(series, f+"{") {
					a.otherCounters[series] += v
					a.otherSum += v
				}
			}
		}
	}
	// A packet dropped between the proxy's two crossings would have
	// faced the proxy's coin at least once more: it adds (1 − proxyRate)
	// of a packet to the loss, not a whole one.
	a.unexplained = float64(a.lost) - a.atProxy - (float64(a.kernelSum)+a.countersSum)*(1-a.proxyRate)
	a.margin = 4*a.sigma + 0.001*float64(sent)
	return a
}

func (a lossAccount) String() string {
	pc := func(x float64) string { return strconv.FormatFloat(100*x/float64(max(a.sent, 1)), 'f', 2, 64) + "%" }
	var kernel, counters []string
	for _, name := range slices.Sorted(maps.Keys(a.kernel)) {
		kernel = append(kernel, fmt.Sprintf("%s %d", name, a.kernel[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(a.counters)) {
		counters = append(counters, fmt.Sprintf("%s %.0f", name, a.counters[name]))
	}
	var other []string
	for _, name := range slices.Sorted(maps.Keys(a.otherKernel)) {
		other = append(other, fmt.Sprintf("kernel at %s %d", name, a.otherKernel[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(a.otherCounters)) {
		other = append(other, fmt.Sprintf("%s %.0f", name, a.otherCounters[name]))
	}
	return fmt.Sprintf("%s (%d of %d packets): at the proxy %s (it dropped %.2f%% of its datagrams each way); kernel socket drops %s (%s); product drop counters %s (%s); unexplained %s (%.0f packets, allowed %s); not counted, as not audio loss: %d datagrams (%s)",
		pc(float64(a.lost)), a.lost, a.sent, pc(a.atProxy), a.proxyRate*100, pc(float64(a.kernelSum)), strings.Join(kernel, ", "),
		pc(a.countersSum), strings.Join(counters, ", "), pc(a.unexplained), a.unexplained, pc(a.margin),
		uint64(a.otherSum)+sumValues(a.otherKernel), strings.Join(other, ", "))
}

func sumValues(m map[string]uint64) uint64 {
	var s uint64
	for _, v := range m {
		s += v
	}
	return s
}

// TestAccountLoss checks what the loss accounting counts: drops of a
// reason audio can hit and kernel drops at a socket audio crosses explain
// a loss; the same number of drops that cannot be audio (a relay's
// rate-delayed first checks, the agent's sockets) leaves it unexplained.
func TestAccountLoss(t *testing.T) {
	const sent, lost = 10000, 1000
	noProxyLoss := impair.Stats{Forwarded: 2 * sent}
	for _, tc := range []struct {
		name      string
		kernel    map[string]uint64
		m         metrics
		explained bool
		notAudio  uint64 // the drops reported as not audio loss
	}{
		{"nothing counted", nil, metrics{}, false, 0},
		{"relay drops of flows the cache lost", nil, metrics{`switchboard_relay_drops_total{reason="flow_cache_miss"}`: lost}, true, 0},
		{"relay drops of new flows' checks", nil, metrics{`switchboard_relay_drops_total{reason="source_rate_delayed"}`: lost}, false, lost},
		{"peer replays", nil, metrics{`switchboard_transceiver_peer_dropped_total{reason="srtp_auth"}`: lost}, false, lost},
		{"hop send failures", nil, metrics{`switchboard_transceiver_hop_dropped_total{reason="send_failed"}`: lost}, true, 0},
		{"kernel at the relay", map[string]uint64{"relay": lost, "agent": 0}, metrics{}, true, 0},
		{"kernel at a restarted relay", map[string]uint64{"relay (restarted)": lost}, metrics{}, true, 0},
		{"kernel at the agent", map[string]uint64{"agent": lost, "relay": 0}, metrics{}, false, lost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := accountLoss(sent, sent-lost, noProxyLoss, tc.kernel, tc.m)
			if got := a.unexplained <= a.margin; got != tc.explained {
				t.Errorf("explained = %v, want %v: %s", got, tc.explained, a)
			}
			if want := fmt.Sprintf("not counted, as not audio loss: %d datagrams", tc.notAudio); !strings.Contains(a.String(), want) {
				t.Errorf("%q missing from %s", want, a)
			}
		})
	}
}
