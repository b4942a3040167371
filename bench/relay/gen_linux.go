package relaybench

import (
	"encoding/binary"
	"net"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// gen is the load generator's state: the client socket, the sink socket
// and the counters and histogram of the current step.
type gen struct {
	epoch    time.Time
	cli      *clientConn
	sink     *net.UDPConn
	sinkIn   *udpio.Batch
	sinkOut  *udpio.Batch
	sessions int
	chanHdr  bool // client datagrams are TURN ChannelData (coturn)
	sinkHdr  bool // sink datagrams start with an internal-hop header (relay, naive)
	seq      uint64
	hist     *hist
	onSetup  func(b []byte) // non-media datagrams reaching a client
	c        counts
}

// counts are the datagrams of one step: sent by clients, received by the
// sink, echoed by the sink, received back by clients.
type counts struct{ cliSent, sinkRecv, sinkSent, cliRecv uint64 }

// forwarded is what the system under test delivered, both directions.
func (c counts) forwarded() uint64 { return c.sinkRecv + c.cliRecv }

// loss is the fraction of datagrams lost, both directions.
func (c counts) loss() float64 {
	sent := c.cliSent + c.sinkSent
	if sent == 0 {
		return 0
	}
	return max(0, 1-float64(c.forwarded())/float64(sent))
}

func newGen(sessions int) (*gen, error) {
	cli, err := newClientConn(32)
	if err != nil {
		return nil, err
	}
	sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		cli.c.Close()
		return nil, err
	}
	_ = sink.SetReadBuffer(4 << 20)
	_ = sink.SetWriteBuffer(4 << 20)
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, 2048)
	}
	g := &gen{epoch: time.Now(), cli: cli, sink: sink, sessions: sessions, hist: newHist(), onSetup: func([]byte) {}}
	if g.sinkIn, err = udpio.NewBatch(sink, 64, bufs); err == nil {
		g.sinkOut, err = udpio.NewBatch(sink, 64, nil)
	}
	if err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

func (g *gen) close() {
	g.cli.c.Close()
	g.sink.Close()
}

func (g *gen) now() int64 { return int64(time.Since(g.epoch)) }

// pump runs the load for dur at rate client datagrams per second (spread
// round robin over the sessions), then keeps receiving for drain. It
// returns the step's counts; the histogram holds its one-way latencies.
func (g *gen) pump(rate float64, dur, drain time.Duration) counts {
	g.c = counts{}
	g.hist.reset()
	start := g.now()
	end, stop := start+int64(dur), start+int64(dur+drain)
	var scheduled int64
	for {
		t := g.now()
		if t >= stop {
			break
		}
		if t < end && rate > 0 {
			due := int64(float64(t-start) * rate / 1e9)
			if lag := due - scheduled; lag > int64(rate/200)+64 {
				scheduled = due - 64 // more than 5 ms behind: the generator is the bottleneck; skip ahead
			}
			for scheduled < due {
				i := int(g.seq % uint64(g.sessions))
				buf := g.cli.next(sessionIP(i))
				if buf == nil {
					break
				}
				g.cli.commit(g.fill(buf, i, t))
				g.seq++
				scheduled++
			}
			if g.cli.n > 0 {
				g.c.cliSent += uint64(g.cli.flush())
			}
		}
		g.pollSink()
		g.pollClients()
	}
	return g.c
}

// fill writes session i's next datagram into buf and returns its length.
func (g *gen) fill(buf []byte, i int, now int64) int {
	size := 120 + int(g.seq*37%81)
	p := buf
	if g.chanHdr {
		binary.BigEndian.PutUint16(buf[0:], 0x4000)
		binary.BigEndian.PutUint16(buf[2:], uint16(size))
		p = buf[4:]
	}
	clear(p[:size])
	p[0], p[1] = 0x80, 111
	binary.BigEndian.PutUint16(p[offSeq:], uint16(g.seq))
	binary.BigEndian.PutUint32(p[offSession:], uint32(i))
	binary.BigEndian.PutUint64(p[offTClient:], uint64(now))
	ip := sessionIP(i)
	copy(p[offClient:], ip[:])
	binary.BigEndian.PutUint16(p[offClient+4:], g.cli.port)
	if g.chanHdr {
		return 4 + size
	}
	return size
}

func (g *gen) pollSink() {
	n, err := g.sinkIn.Poll()
	if err != nil || n == 0 {
		return
	}
	now := g.now()
	for i := range n {
		b := g.sinkIn.Buf(i)[:g.sinkIn.Len(i)]
		p := b
		if g.sinkHdr && len(b) > 2 {
			off := 10
			if b[2] == 6 {
				off = 22
			}
			p = b[min(off, len(b)):]
		}
		if len(p) >= minPayload && p[0] == 0x80 {
			g.c.sinkRecv++
			g.hist.add(now - int64(binary.BigEndian.Uint64(p[offTClient:])))
			binary.BigEndian.PutUint64(p[offTSink:], uint64(g.now()))
		}
		g.sinkOut.Queue(b, g.sinkIn.Addr(i), len(b))
	}
	sent, _, _, _ := g.sinkOut.Flush()
	g.c.sinkSent += uint64(sent)
}

func (g *gen) pollClients() {
	n, err := g.cli.in.Poll()
	if err != nil || n == 0 {
		return
	}
	now := g.now()
	for i := range n {
		b := g.cli.in.Buf(i)[:g.cli.in.Len(i)]
		if g.chanHdr && len(b) >= 4 && b[0]&0xC0 == 0x40 {
			b = b[4:]
		}
		if len(b) >= minPayload && b[0] == 0x80 {
			g.c.cliRecv++
			g.hist.add(now - int64(binary.BigEndian.Uint64(b[offTSink:])))
			continue
		}
		g.onSetup(b)
	}
}

// transact sends a request for every session not yet done (build returns
// it, nil for none) and polls until all are done or rounds run out.
func (g *gen) transact(rounds int, wait time.Duration, done []bool, build func(i int) []byte) int {
	for range rounds {
		left := 0
		for i := range done {
			if done[i] {
				continue
			}
			left++
			buf := g.cli.next(sessionIP(i))
			if buf == nil {
				g.cli.flush()
				buf = g.cli.next(sessionIP(i))
			}
			g.cli.commit(copy(buf, build(i)))
			if g.cli.n == len(g.cli.hdrs) {
				g.cli.flush()
				g.drainFor(200 * time.Microsecond)
			}
		}
		g.cli.flush()
		if left == 0 {
			break
		}
		deadline := g.now() + int64(wait)
		for g.now() < deadline && !all(done) {
			g.pollSink()
			g.pollClients()
		}
	}
	n := 0
	for _, d := range done {
		if d {
			n++
		}
	}
	return n
}

func (g *gen) drainFor(d time.Duration) {
	for end := g.now() + int64(d); g.now() < end; {
		g.pollSink()
		g.pollClients()
	}
}

func all(b []bool) bool {
	for _, v := range b {
		if !v {
			return false
		}
	}
	return true
}
