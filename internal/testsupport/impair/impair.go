// Package impair is the test harness's network impairment layer: UDP and
// TCP proxies that add one-way delay, jitter, loss, duplication and
// reordering, and can simulate a NAT rebinding. Tests put one between a
// client and the address it dials, on loopback or in network namespaces the
// test creates, where the kernel's netem qdisc is not available.
//
// The UDP proxy behaves like a NAT: each client address gets its own
// upstream socket, so the target sees one distinct source port per client,
// and replies to that port go back to the client from the proxy's listening
// address.
package impair

import (
	"container/heap"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// Config is an impairment, applied to each direction independently.
type Config struct {
	// Delay is the one-way delay added to every datagram.
	Delay time.Duration
	// Jitter adds a uniform random delay in [0, Jitter).
	Jitter time.Duration
	// Loss is the probability (0–1) that a datagram is dropped.
	Loss float64
	// Duplicate is the probability (0–1) that a datagram is sent twice.
	Duplicate float64
	// Reorder is the probability (0–1) that a datagram is held back by an
	// extra Delay+1ms, so that later ones overtake it.
	Reorder float64
	// Drop, if set, is asked about each datagram of a UDP proxy before the
	// random choices: the client's address, the datagram (not to be kept)
	// and its direction (toTarget: from the client to the target). One it
	// returns true for is dropped, counted in Stats.Dropped: a test's
	// chosen loss, e.g. one call's first DTLS flight. It is called from
	// the proxy's reading goroutines, one per direction and client.
	Drop func(client netip.AddrPort, b []byte, toTarget bool) bool
}

// Stats counts what a proxy did, both directions together.
type Stats struct {
	Forwarded, Dropped, Duplicated, Reordered uint64
	// SocketDropped counts datagrams the kernel dropped at the proxy's
	// own sockets because their receive buffers were full (udpio.Drops):
	// the proxy never saw them, so they are in no other count. A UDP
	// proxy's Stats has it on Linux; 0 elsewhere and for TCP.
	SocketDropped uint64
}

// scheduler sends datagrams at their due time, in due-time order.
type scheduler struct {
	mu   sync.Mutex
	q    pending
	seq  uint64
	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
}

type item struct {
	due  time.Time
	seq  uint64
	send func()
}

type pending []item

func (p pending) Len() int { return len(p) }
func (p pending) Less(i, j int) bool {
	if p[i].due.Equal(p[j].due) {
		return p[i].seq < p[j].seq
	}
	return p[i].due.Before(p[j].due)
}
func (p pending) Swap(i, j int) { p[i], p[j] = p[j], p[i] }
func (p *pending) Push(x any)   { *p = append(*p, x.(item)) }
func (p *pending) Pop() any {
	old := *p
	it := old[len(old)-1]
	*p = old[:len(old)-1]
	return it
}

func newScheduler() *scheduler {
	s := &scheduler{wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.wg.Add(1)
	go s.run()
	return s
}

func (s *scheduler) at(due time.Time, send func()) {
	s.mu.Lock()
	s.seq++
	heap.Push(&s.q, item{due, s.seq, send})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *scheduler) run() {
	defer s.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		var wait time.Duration = time.Hour
		for s.q.Len() > 0 {
			if d := time.Until(s.q[0].due); d > 0 {
				wait = d
				break
			}
			it := heap.Pop(&s.q).(item)
			s.mu.Unlock()
			it.send()
			s.mu.Lock()
		}
		s.mu.Unlock()
		t.Reset(wait)
		select {
		case <-s.done:
			return
		case <-s.wake:
		case <-t.C:
		}
	}
}

func (s *scheduler) close() {
	close(s.done)
	s.wg.Wait()
}

// impairer decides each datagram's fate under the current Config.
type impairer struct {
	cfg                                       atomic.Pointer[Config]
	mu                                        sync.Mutex
	rng                                       *rand.Rand
	sched                                     *scheduler
	forwarded, dropped, duplicated, reordered atomic.Uint64
}

func newImpairer(cfg Config, seed uint64) *impairer {
	im := &impairer{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), sched: newScheduler()}
	im.cfg.Store(&cfg)
	return im
}

// submit schedules send (called with the datagram's copy) per the config;
// client and toTarget are for Config.Drop.
func (im *impairer) submit(client netip.AddrPort, toTarget bool, b []byte, send func([]byte)) {
	cfg := im.cfg.Load()
	if cfg.Drop != nil && cfg.Drop(client, b, toTarget) {
		im.dropped.Add(1)
		return
	}
	im.mu.Lock()
	lost := cfg.Loss > 0 && im.rng.Float64() < cfg.Loss
	dup := cfg.Duplicate > 0 && im.rng.Float64() < cfg.Duplicate
	reorder := cfg.Reorder > 0 && im.rng.Float64() < cfg.Reorder
	var jitter time.Duration
	if cfg.Jitter > 0 {
		jitter = time.Duration(im.rng.Int64N(int64(cfg.Jitter)))
	}
	im.mu.Unlock()
	if lost {
		im.dropped.Add(1)
		return
	}
	delay := cfg.Delay + jitter
	if reorder {
		im.reordered.Add(1)
		delay += cfg.Delay + time.Millisecond
	}
	c := append([]byte(nil), b...)
	now := time.Now()
	im.forwarded.Add(1)
	im.sched.at(now.Add(delay), func() { send(c) })
	if dup {
		im.duplicated.Add(1)
		im.sched.at(now.Add(delay), func() { send(c) })
	}
}

func (im *impairer) stats() Stats {
	return Stats{Forwarded: im.forwarded.Load(), Dropped: im.dropped.Load(), Duplicated: im.duplicated.Load(), Reordered: im.reordered.Load()}
}

// UDP is a UDP impairment proxy in front of one target address.
type UDP struct {
	// Set once.
	conn   *net.UDPConn
	target netip.AddrPort
	im     *impairer
	wg     sync.WaitGroup
	once   sync.Once

	mu     sync.Mutex
	peers  map[netip.AddrPort]*net.UDPConn // client → upstream socket; guarded by mu
	closed uint64                          // kernel drops of the sockets closed so far; guarded by mu
}

// NewUDP listens on listen (e.g. "127.0.0.1:0") and forwards to target
// under cfg. seed makes the random choices repeatable.
func NewUDP(listen string, target netip.AddrPort, cfg Config, seed uint64) (*UDP, error) {
	laddr, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		return nil, err
	}
	conn, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, err
	}
	return NewUDPConn(conn, target, cfg, seed), nil
}

// NewUDPConn is NewUDP on a socket the caller bound already, for a target
// that needs the proxy's address before it exists itself (a transceiver
// that advertises the proxy): bind conn on port 0, start the target, then
// the proxy. The proxy owns conn from now on and closes it in Close.
func NewUDPConn(conn *net.UDPConn, target netip.AddrPort, cfg Config, seed uint64) *UDP {
	// All clients' datagrams share conn: with the default receive buffer
	// a proxy held up some tens of milliseconds on a busy machine lost
	// datagrams of its own, beyond its Config.
	udpio.SetBuffers(conn)
	p := &UDP{conn: conn, target: target, im: newImpairer(cfg, seed), peers: map[netip.AddrPort]*net.UDPConn{}}
	p.wg.Add(1)
	go p.readClients()
	return p
}

// Addr is the address clients send to.
func (p *UDP) Addr() netip.AddrPort { return p.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// SetConfig changes the impairment from now on.
func (p *UDP) SetConfig(cfg Config) { p.im.cfg.Store(&cfg) }

// Stats returns the proxy's counters, also after Close.
func (p *UDP) Stats() Stats {
	st := p.im.stats()
	p.mu.Lock()
	defer p.mu.Unlock()
	st.SocketDropped = p.closed
	if p.peers != nil { // not closed: add the live sockets
		st.SocketDropped += drops(p.conn)
		for _, up := range p.peers {
			st.SocketDropped += drops(up)
		}
	}
	return st
}

// drops is c's kernel receive drops, 0 where they cannot be read.
func drops(c *net.UDPConn) uint64 {
	d, _ := udpio.Drops(c)
	return d
}

func (p *UDP) readClients() {
	defer p.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, client, err := p.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		up, err := p.upstream(client)
		if err != nil {
			continue
		}
		p.im.submit(client, true, buf[:n], func(b []byte) { _, _ = up.WriteToUDPAddrPort(b, p.target) })
	}
}

func (p *UDP) upstream(client netip.AddrPort) (*net.UDPConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if up := p.peers[client]; up != nil {
		return up, nil
	}
	if p.peers == nil {
		return nil, net.ErrClosed
	}
	up, err := net.ListenUDP("udp", &net.UDPAddr{IP: p.Addr().Addr().AsSlice()})
	if err != nil {
		return nil, err
	}
	udpio.SetBuffers(up)
	p.peers[client] = up
	p.wg.Add(1)
	go p.readUpstream(client, up)
	return up, nil
}

func (p *UDP) readUpstream(client netip.AddrPort, up *net.UDPConn) {
	defer p.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := up.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		if from != p.target {
			continue
		}
		p.im.submit(client, false, buf[:n], func(b []byte) { _, _ = p.conn.WriteToUDPAddrPort(b, client) })
	}
}

// Clients returns the client addresses the proxy has mappings for.
func (p *UDP) Clients() []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]netip.AddrPort, 0, len(p.peers))
	for c := range p.peers {
		out = append(out, c)
	}
	return out
}

// Rebind simulates a NAT rebinding for client: its later datagrams leave
// from a new upstream port, and the old port is closed, so replies sent to
// it are lost. It reports whether the client was known.
func (p *UDP) Rebind(client netip.AddrPort) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.peers[client]
	if old == nil {
		return false
	}
	delete(p.peers, client)
	p.closed += drops(old)
	_ = old.Close()
	return true
}

// Close stops the proxy and waits for its goroutines. Datagrams still
// scheduled are discarded.
func (p *UDP) Close() error {
	var err error
	p.once.Do(func() {
		p.mu.Lock()
		p.closed += drops(p.conn)
		err = p.conn.Close()
		for _, up := range p.peers {
			p.closed += drops(up)
			_ = up.Close()
		}
		p.peers = nil
		p.mu.Unlock()
		p.wg.Wait()
		p.im.sched.close()
	})
	return err
}

// TCP is a TCP proxy that delays each chunk by a fixed one-way delay in
// each direction (no loss: TCP would hide it), for HTTP signaling.
type TCP struct {
	ln     net.Listener
	target string
	delay  time.Duration
	wg     sync.WaitGroup
	once   sync.Once
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// NewTCP listens on listen and forwards connections to target with delay
// added one way in each direction.
func NewTCP(listen, target string, delay time.Duration) (*TCP, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &TCP{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *TCP) Addr() string { return p.ln.Addr().String() }

func (p *TCP) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *TCP) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c) || !p.track(u) {
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.wg.Add(2)
		go p.pump(c, u)
		go p.pump(u, c)
	}
}

// pump copies src to dst, each chunk delayed by p.delay, in order.
func (p *TCP) pump(src, dst net.Conn) {
	defer p.wg.Done()
	type chunk struct {
		due time.Time
		b   []byte
	}
	ch := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range ch {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{time.Now().Add(p.delay), append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			break
		}
	}
	close(ch)
	<-done
}

// Close stops the proxy, closes every connection and waits.
func (p *TCP) Close() error {
	var err error
	p.once.Do(func() {
		err = p.ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
		p.mu.Unlock()
		p.wg.Wait()
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
