package relay

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestTCPCost measures what a client costs the relay over ICE-TCP against
// UDP: N clients, each sending a 160-byte audio packet every 20 ms that a
// fake transceiver echoes, through one relay (Workers 2). The clients run
// in a child process (this test binary, TestTCPCostClients), so this
// process's CPU time is the relay's and the echo's (the same for both
// transports); memory is measured with every client connected and
// streaming. The clients also call, over TCP, the design not chosen
// (startSplice), for comparison. The default `go test` runs 100 clients
// for 2 s and checks only that the echoes came back; SWITCHBOARD_TCP_COST_FULL=1 runs 200
// for 10 s (docs/benchmarks.md, "ICE-TCP"):
//
//	SWITCHBOARD_TCP_COST_FULL=1 go test -count=1 -run 'TestTCPCost$' -v ./internal/relay
func TestTCPCost(t *testing.T) {
	n, dur := 100, 2*time.Second
	if os.Getenv("SWITCHBOARD_TCP_COST_FULL") == "1" {
		n, dur = 200, 10*time.Second
	}
	type result struct {
		cpu                  time.Duration // per second of the window
		heap, rss, kernelTCP int64         // growth with every client connected
		sent, echoed         int
		frames               uint64
	}
	results := map[string]result{}
	for _, transport := range []string{"udp", "tcp", "tcp-idle", "splice"} {
		e := newEnv(t, Config{TCPAddr: "127.0.0.1:0", NewFlowsPerIP: maxLimit, NewFlowBurstPerIP: maxLimit, MaxPendingPerIP: maxLimit, MaxTCPConnsPerIP: maxLimit}, nil)
		startEcho(t, e.tr, true)
		heap0, rss0, k0 := goMemory(), rssBytes(), kernelTCPPages()
		to := e.r.PublicAddr()
		if transport != "udp" {
			to = e.r.TCPAddr()
		}
		if transport == "splice" {
			to = startSplice(t)
		}
		gen := exec.Command(os.Args[0], "-test.run=^TestTCPCostClients$", "-test.count=1", "-test.v")
		clients := transport
		if clients == "splice" {
			clients = "tcp" // the same TCP clients, to the splicing proxy
		}
		gen.Env = append(os.Environ(), fmt.Sprintf("SWITCHBOARD_TCP_COST=%s,%s,%d,%d", clients, to, n, dur.Milliseconds()))
		out, err := gen.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		gen.Stderr = os.Stderr
		if err := gen.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(out)
		wait := func(prefix string) string {
			t.Helper()
			for lines.Scan() {
				if l := lines.Text(); strings.HasPrefix(l, prefix) {
					return l
				}
			}
			_ = gen.Wait()
			t.Fatalf("%s clients: no %s line", transport, prefix)
			return ""
		}
		wait("READY")
		// Let the first echoes settle, then measure over most of the run
		// (connections that send nothing: at once, before their first
		// frame's timeout).
		if transport != "tcp-idle" {
			time.Sleep(dur / 5)
		} else {
			eventually(t, "every silent connection accepted", func() bool { return e.r.Stats().TCP.Open >= n })
		}
		heap1, rss1, k1 := goMemory(), rssBytes(), kernelTCPPages()
		window := dur / 2
		c0 := cpuTime()
		time.Sleep(window)
		cpu := cpuTime() - c0
		var sent, echoed int
		if _, err := fmt.Sscanf(wait("DONE"), "DONE %d %d", &sent, &echoed); err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, out)
		if err := gen.Wait(); err != nil {
			t.Fatalf("%s clients: %v", transport, err)
		}
		st := e.r.Stats()
		results[transport] = result{cpu: cpu * time.Second / window, heap: heap1 - heap0, rss: rss1 - rss0, kernelTCP: k1 - k0,
			sent: sent, echoed: echoed, frames: st.TCP.ToTransceiverFrames + st.ToTransceiverPackets}
		// The path works: most echoes come back. On a loaded machine the
		// kernel drops some UDP and the relay's queues drop late audio,
		// as they should; at full size a loss is logged, not a failure.
		if echoed < sent*9/10 && os.Getenv("SWITCHBOARD_TCP_COST_FULL") != "1" {
			t.Errorf("%s: %d of %d packets echoed", transport, echoed, sent)
		}
		_ = e.r.Close()
	}
	pps := float64(n) * 50
	idle := results["tcp-idle"]
	t.Logf("tcp, connected, no frame sent yet (as a browser whose UDP won leaves one until the first-frame timeout): memory per connection: Go heap+stacks %.1f KiB, RSS %.1f KiB, kernel TCP %.1f KiB",
		float64(idle.heap)/1024/float64(n), float64(idle.rss)/1024/float64(n), float64(idle.kernelTCP*4)/float64(n))
	for _, tr := range []string{"udp", "tcp"} {
		r := results[tr]
		t.Logf("%s: %d clients at 50 packets/s each way: relay+echo CPU %.1f ms/s (%.2f µs per packet each way), memory per client: Go heap+stacks %.1f KiB, RSS %.1f KiB, kernel TCP (both ends, this host) %.1f KiB; %d sent, %d echoed",
			tr, n, float64(r.cpu.Microseconds())/1000, float64(r.cpu.Nanoseconds())/1000/pps,
			float64(r.heap)/1024/float64(n), float64(r.rss)/1024/float64(n), float64(r.kernelTCP*4)/float64(n), r.sent, r.echoed)
	}
	u, c, sp := results["udp"], results["tcp"], results["splice"]
	t.Logf("splice (the design not chosen: a Go proxy splicing each client's TCP stream to a TCP echo that reads and writes its frames, as a transceiver terminating TCP would): CPU %.1f ms/s (%.2f µs per packet each way), memory per client: Go heap+stacks %.1f KiB, RSS %.1f KiB; %d sent, %d echoed",
		float64(sp.cpu.Microseconds())/1000, float64(sp.cpu.Nanoseconds())/1000/pps, float64(sp.heap)/1024/float64(n), float64(sp.rss)/1024/float64(n), sp.sent, sp.echoed)
	if u.cpu > 0 && sp.cpu > 0 {
		t.Logf("TCP over UDP: CPU ×%.2f, +%.1f KiB of Go memory per client; splice over UDP: CPU ×%.2f", float64(c.cpu)/float64(u.cpu), float64(c.heap-u.heap)/1024/float64(n), float64(sp.cpu)/float64(u.cpu))
	}
}

// startSplice starts the design not chosen, for comparison: a TCP proxy
// that splices each connection to a TCP echo server (io.Copy, which uses
// splice(2) between TCP sockets on Linux), and the echo server, which
// reads each RFC 4571 frame and writes it back, as a transceiver that
// terminates the client's TCP would. Both run in this process; it
// returns the proxy's address.
func startSplice(t *testing.T) netip.AddrPort {
	t.Helper()
	echo, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { echo.Close(); proxy.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := echo.AcceptTCP()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReaderSize(c, 2048)
				buf := make([]byte, 2+2048)
				for {
					if _, err := io.ReadFull(br, buf[:2]); err != nil {
						return
					}
					n := 2 + int(binary.BigEndian.Uint16(buf))
					if _, err := io.ReadFull(br, buf[2:n]); err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			})
		}
	})
	wg.Go(func() {
		for {
			c, err := proxy.AcceptTCP()
			if err != nil {
				return
			}
			u, err := net.DialTCP("tcp", nil, echo.Addr().(*net.TCPAddr))
			if err != nil {
				c.Close()
				continue
			}
			wg.Go(func() { _, _ = io.Copy(u, c); u.CloseWrite() })
			wg.Go(func() { _, _ = io.Copy(c, u); c.Close() })
		}
	})
	return proxy.Addr().(*net.TCPAddr).AddrPort()
}

// goMemory is the Go heap in use plus goroutine stacks, after a GC.
func goMemory() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// kernelTCPPages is the kernel's TCP buffer memory, in 4 KiB pages
// (/proc/net/sockstat "TCP: … mem N"), 0 where it cannot be read.
func kernelTCPPages() int64 {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "TCP:" {
			for i := 1; i+1 < len(f); i++ {
				if f[i] == "mem" {
					v, _ := strconv.ParseInt(f[i+1], 10, 64)
					return v
				}
			}
		}
	}
	return 0
}

// TestTCPCostClients is TestTCPCost's clients, run in a child process.
func TestTCPCostClients(t *testing.T) {
	spec := os.Getenv("SWITCHBOARD_TCP_COST")
	if spec == "" {
		t.Skip("run by TestTCPCost")
	}
	f := strings.Split(spec, ",")
	transport, to := f[0], netip.MustParseAddrPort(f[1])
	n, _ := strconv.Atoi(f[2])
	ms, _ := strconv.Atoi(f[3])
	keys := testKeyring(t, 1, 0xAA)
	var echoed atomic.Int64
	var wg sync.WaitGroup
	var senders []func([]byte) error
	var closers []func()
	ready := make(chan struct{}, n)
	if transport == "tcp-idle" {
		var conns []*net.TCPConn
		for range n {
			c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(to))
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		fmt.Println("READY")
		time.Sleep(time.Duration(ms) * time.Millisecond / 2)
		fmt.Println("DONE 0 0")
		for _, c := range conns {
			c.Close()
		}
		return
	}
	for i := range n {
		check := binding(t, mint(t, keys, testCluster, 7, time.Now())+":c"+strconv.Itoa(i))
		if transport == "tcp" {
			c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(to))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(frame(check)); err != nil {
				t.Fatal(err)
			}
			senders = append(senders, func(p []byte) error { _, err := c.Write(p); return err })
			closers = append(closers, func() { c.Close() })
			wg.Go(func() {
				br := bufio.NewReader(c)
				var l [2]byte
				buf := make([]byte, 2048)
				for first := true; ; first = false {
					if _, err := io.ReadFull(br, l[:]); err != nil {
						return
					}
					if _, err := io.ReadFull(br, buf[:binary.BigEndian.Uint16(l[:])]); err != nil {
						return
					}
					if first {
						ready <- struct{}{}
					} else {
						echoed.Add(1)
					}
				}
			})
			continue
		}
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteToUDPAddrPort(check, to); err != nil {
			t.Fatal(err)
		}
		senders = append(senders, func(p []byte) error { _, err := c.WriteToUDPAddrPort(p[2:], to); return err })
		closers = append(closers, func() { c.Close() })
		wg.Go(func() {
			buf := make([]byte, 2048)
			for first := true; ; first = false {
				if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
					return
				}
				if first {
					ready <- struct{}{}
				} else {
					echoed.Add(1)
				}
			}
		})
	}
	for range n {
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			t.Fatal("not every client's check came back")
		}
	}
	fmt.Println("READY")
	pkt := frame(append([]byte{0x80, 111}, make([]byte, 158)...))
	sent := 0
	tick := time.NewTicker(20 * time.Millisecond)
	for end := time.Now().Add(time.Duration(ms) * time.Millisecond); time.Now().Before(end); <-tick.C {
		for _, send := range senders {
			if send(pkt) == nil {
				sent++
			}
		}
	}
	tick.Stop()
	time.Sleep(300 * time.Millisecond) // the last echoes
	fmt.Printf("DONE %d %d\n", sent, echoed.Load())
	for _, c := range closers {
		c()
	}
	wg.Wait()
}
