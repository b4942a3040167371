package relay

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
)

// TestTCPAbuse: while live UDP sessions echo through the relay, three
// kinds of TCP abuse run one after the other, and the state each leaves
// stays within the caps (docs/security.md, "ICE-TCP"):
//
//   - connections that never send a frame, from many source IPs: refused
//     at accept over the per-source cap, closed at the first-frame timeout;
//   - connections whose first frame is a valid-token check for a
//     transceiver that never answers: the source's pending cap admits 16,
//     the rest wait on their goroutines (held) and are closed after 2 s;
//   - clients that stop reading while the transceiver sends them audio:
//     their queues drop the oldest audio, the relay's loops never wait.
//
// The live sessions must see no gap over a second. Default: small;
// SWITCHBOARD_FLOOD_FULL=1 for the figures.
func TestTCPAbuse(t *testing.T) {
	ips, perIP, checkers, slow := 8, 64, 64, 8
	if fullSize() {
		ips, perIP, checkers, slow = 40, 300, 400, 64
	}
	e := newEnv(t, Config{TCPAddr: "127.0.0.1:0", TCPFirstFrameTimeout: time.Second, MaxTCPConnsPerIP: perIP / 2}, nil)
	startEcho(t, e.tr, true)

	// Live sessions: 10 UDP clients, a packet every 20 ms, echoed.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var maxGap atomic.Int64
	for i := range 10 {
		c := udp(t)
		send(t, c, e.binding(t, 7), e.r.PublicAddr())
		recv(t, c)
		wg.Go(func() {
			last := time.Now()
			buf := make([]byte, 2048)
			for seq := uint32(0); !stop.Load(); seq++ {
				_, _ = c.WriteToUDPAddrPort(mediaPkt(seq+uint32(i)<<24), e.r.PublicAddr())
				_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
				if _, _, err := c.ReadFromUDPAddrPort(buf); err == nil {
					if g := time.Since(last); g > time.Duration(maxGap.Load()) {
						maxGap.Store(int64(g))
					}
					last = time.Now()
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	rss0, heap0 := rssBytes(), goMemory()
	var peakOpen atomic.Int64
	watch := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if o := int64(e.r.Stats().TCP.Open); o > peakOpen.Load() {
				peakOpen.Store(o)
			}
		}
	}
	dial := func(ip byte) *net.TCPConn {
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 6, ip)}, net.TCPAddrFromAddrPort(e.r.TCPAddr()))
		if err != nil {
			return nil // refused under the cap: the reset may reach the dial
		}
		return c
	}

	// 1. Connections that never send a frame.
	var conns []*net.TCPConn
	for ip := range ips {
		for range perIP {
			if c := dial(byte(1 + ip)); c != nil {
				conns = append(conns, c)
			}
		}
	}
	watch(100 * time.Millisecond)
	heap1 := goMemory()
	s1 := e.r.Stats().TCP
	eventually(t, "the silent connections closed at the first-frame timeout", func() bool { return e.r.Stats().TCP.Open == 0 })
	s := e.r.Stats().TCP
	t.Logf("silent: %d dialed from %d IPs: refused over the per-source cap %d, open at most %d (Go memory +%.1f MiB), closed at the first-frame timeout %d",
		ips*perIP, ips, s.Closed[TCPRefusedSource], peakOpen.Load(), float64(heap1-heap0)/(1<<20), s.Closed[TCPFirstFrameTimeout])
	if want := ips * perIP / 2; int(peakOpen.Load()) > want || s1.Open > want || s.Closed[TCPFirstFrameTimeout] == 0 {
		t.Errorf("open at most %d, want ≤ %d (the per-source cap)", peakOpen.Load(), want)
	}
	for _, c := range conns {
		c.Close()
	}

	// 2. Valid-token checks for a transceiver that never answers, all from
	// one source: 16 pending flows, the others held, then closed.
	silent := udp(t) // member 9: never answers
	if err := e.members.Set(map[uint32]netip.AddrPort{7: addrOf(e.tr), 9: addrOf(silent)}); err != nil {
		t.Fatal(err)
	}
	before := e.r.Stats()
	conns = conns[:0]
	for range checkers {
		c := dial(200)
		if c == nil {
			continue
		}
		_, _ = c.Write(frame(binding(t, mint(t, e.keys, testCluster, 9, e.now)+":clnt")))
		conns = append(conns, c)
	}
	eventually(t, "the held first frames to give up", func() bool {
		st := e.r.Stats()
		return st.Waiting == 0 && st.Held > before.Held
	})
	st := e.r.Stats()
	t.Logf("valid checks, no answer: %d connections from one IP: flows created %d, held %d, expired %d (closed first_frame_invalid %d), pending flows at most %d",
		checkers, st.FlowsCreated-before.FlowsCreated, st.Held-before.Held, st.Expired-before.Expired,
		st.TCP.Closed[TCPFirstFrameInvalid]-before.TCP.Closed[TCPFirstFrameInvalid], st.PendingFlows)
	if st.PendingFlows > e.r.cfg.MaxPendingPerIP || int(st.FlowsCreated-before.FlowsCreated) > e.r.cfg.MaxPendingPerIP {
		t.Errorf("pending flows %d, created %d: above the source's pending cap %d", st.PendingFlows, st.FlowsCreated-before.FlowsCreated, e.r.cfg.MaxPendingPerIP)
	}
	for _, c := range conns {
		c.Close()
	}

	// 3. Clients that stop reading while the transceiver sends them audio.
	readers := make([]*net.TCPConn, 0, slow)
	for range slow {
		c := dial(100)
		if c == nil {
			t.Fatal("slow reader refused")
		}
		_, _ = c.Write(frame(e.binding(t, 7)))
		readers = append(readers, c)
	}
	eventually(t, "the slow readers established", func() bool { return e.r.Stats().TCP.Established == slow })
	rtp := append([]byte{0x80, 111}, make([]byte, 1000)...)
	sent := 0
	for range 200 {
		for _, c := range readers {
			send(t, e.tr, append(hop.AppendHeader(nil, hop.TypeDataTCP, tcpAddrOf(c)), rtp...), e.r.InternalAddr())
			sent++
		}
		time.Sleep(time.Millisecond)
	}
	heap3 := goMemory()
	st = e.r.Stats()
	t.Logf("slow readers: %d clients, %d KB-sized frames sent to them: %d written, %d dropped from full queues (Go memory +%.1f MiB over the start)",
		slow, sent, st.TCP.ToClientFrames, st.Drops[DropTCPQueueFull], float64(heap3-heap0)/(1<<20))
	if st.Drops[DropTCPQueueFull] == 0 {
		t.Error("no queue drops: the clients read after all?")
	}
	for _, c := range readers {
		c.Close()
	}

	stop.Store(true)
	wg.Wait()
	rss1 := rssBytes()
	t.Logf("live UDP sessions: longest gap %v; RSS %+.1f MiB", time.Duration(maxGap.Load()).Round(time.Millisecond), float64(rss1-rss0)/(1<<20))
	if g := time.Duration(maxGap.Load()); g > time.Second {
		t.Errorf("a live session's echoes stopped for %v", g)
	}
}
