package relay

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/stunpeek"
)

// ICE-TCP (RFC 6544) on the public side (docs/relay.md, "ICE-TCP").
//
// A client whose network drops UDP connects to the relay's TCP port
// (Config.TCPAddr; the answer's "tcptype passive" candidate) and sends its
// packets in RFC 4571 frames: a 2-byte length, then one STUN, DTLS, RTP
// or RTCP packet. The relay terminates the TCP connection, not a protocol
// above it: each frame's packet is forwarded unchanged over the internal
// hop as a TypeDataTCP datagram naming the client's TCP address, exactly
// as a UDP client's datagram is (the same first-packet token check, the
// same flow table, keyed by transport and address: flows.go, addrKey),
// and what a transceiver sends back for that client is framed and written
// to its connection. So the transceiver keeps its one UDP socket and
// learns the client's transport from the hop type.
//
// Rules of a connection:
//
//   - The first frame must be a STUN Binding request whose USERNAME
//     carries a valid token (the UDP first-packet path, admit); anything
//     else closes the connection (first_frame_invalid, with the drop
//     reason counted as for UDP), and so does no first frame within
//     Config.TCPFirstFrameTimeout (first_frame_timeout). A first frame a
//     per-source cap turns away for the moment (over its source's rate,
//     or at its pending cap) waits on the connection's own goroutine, up
//     to waitHold, as a UDP client's request waits in the waiting room
//     (wait.go): over TCP a client sends a check once (RFC 8489 §6.2.2,
//     no retransmissions on a reliable transport), so a delay must be a
//     wait, not a drop.
//   - A frame longer than hop.MaxPayload, the path's one datagram limit,
//     closes the connection (frame_too_big; too_big is counted too). An
//     empty frame is dropped (unknown_first_byte), as an empty datagram is.
//   - Nothing read for Config.TCPIdleTimeout (up to a quarter more, or a
//     second more, whichever is less: the deadline is pushed forward at
//     most that often) closes it (idle_timeout).
//   - Connections per source IP (IPv6: /64) and in total are capped
//     (Config.MaxTCPConnsPerIP, MaxTCPConns): over a cap a new connection
//     is closed at once with a reset (source_limit, total_limit).
//   - Writes never block a relay loop: the internal loop copies a frame
//     into the connection's send queue (tcpQueue frames) and a writer
//     goroutine per connection writes the queue out, framed, with one
//     writev. A full queue drops its oldest audio (RTP) frame, or its
//     oldest frame if none is audio (tcp_queue_full): late audio is
//     useless, and DTLS and SCTP retransmit. A write that does not finish
//     within tcpWriteTimeout closes the connection (write_timeout).
//   - TCP_NODELAY is on (Go's default, set explicitly), and the kernel's
//     send buffer is kept small (tcpSendBuffer), so that audio waits in the
//     queue, where the oldest is dropped, rather than in the kernel.
//   - A connection's flow is removed when it closes; a client that
//     reconnects (after a relay restart, say) starts again with a check.
//
// Every close has a reason with a counter created at start-up
// (switchboard_relay_tcp_closed_total{reason}).

// Defaults of the TCP side (Config.Validate).
const (
	// DefaultTCPFirstFrameTimeout bounds the wait for a connection's first
	// frame: a client sends its first check as soon as it has connected.
	DefaultTCPFirstFrameTimeout = 5 * time.Second
	// DefaultDrainTimeout is how long `switchboard relay` lets open ICE-TCP
	// connections go on after SIGTERM (Drain).
	DefaultDrainTimeout = 30 * time.Second
	// DefaultMaxTCPConns caps the open TCP connections of one relay.
	DefaultMaxTCPConns = 20_000
	// DefaultMaxTCPConnsPerIP caps the open TCP connections of one source
	// IP (IPv6: /64): every client of an office behind one NAT that falls
	// back to TCP, with room (the transceiver admits 64 pending sessions
	// per client address).
	DefaultMaxTCPConnsPerIP = 256
	// tcpQueue is how many frames wait for a connection's writer: 320 ms
	// of 20 ms audio, or a DTLS flight and some data-channel messages.
	tcpQueue = 16
	// tcpWriteTimeout bounds one write to a client: a client that reads
	// nothing for this long has lost the call anyway.
	tcpWriteTimeout = 10 * time.Second
	// tcpSendBuffer is the SO_SNDBUF asked for (Linux doubles it): a few
	// hundred milliseconds of audio and a DTLS flight.
	tcpSendBuffer = 16 << 10
	// tcpReadBuffer is the read buffer of a connection: one largest frame.
	tcpReadBuffer = 2 + hop.MaxPayload
	// tcpDeadlineEvery is how often the read deadline is pushed forward:
	// not at every frame, which would reset a timer 50 times a second.
	tcpDeadlineEvery = time.Second
)

// TCPCloseReason says why the relay closed (or refused) a client's TCP
// connection. Every reason has a counter from start-up:
// switchboard_relay_tcp_closed_total{reason="<String()>"}.
type TCPCloseReason uint8

// Reasons a TCP connection ends.
const (
	// TCPRefusedTotal: the relay held MaxTCPConns connections; refused at accept.
	TCPRefusedTotal TCPCloseReason = iota
	// TCPRefusedSource: the source IP (IPv6: /64) held MaxTCPConnsPerIP; refused at accept.
	TCPRefusedSource
	// TCPRefusedDuplicate: a connection from the same client address is open.
	TCPRefusedDuplicate
	// TCPFirstFrameInvalid: the first frame was not a Binding request with
	// a valid token that made a flow (its drop reason is counted too).
	TCPFirstFrameInvalid
	// TCPFirstFrameTimeout: no first frame within Config.TCPFirstFrameTimeout.
	TCPFirstFrameTimeout
	// TCPFrameTooBig: a frame longer than hop.MaxPayload.
	TCPFrameTooBig
	// TCPIdleTimeout: nothing read for Config.TCPIdleTimeout.
	TCPIdleTimeout
	// TCPClientClosed: the client closed or reset the connection.
	TCPClientClosed
	// TCPReadError: a read failed otherwise.
	TCPReadError
	// TCPWriteError: a write to the client failed.
	TCPWriteError
	// TCPWriteTimeout: a write to the client did not finish within tcpWriteTimeout.
	TCPWriteTimeout
	// TCPRelayClosed: the relay is closing.
	TCPRelayClosed
	// NumTCPCloseReasons is the number of reasons.
	NumTCPCloseReasons
)

var tcpCloseNames = [NumTCPCloseReasons]string{
	"total_limit", "source_limit", "duplicate", "first_frame_invalid", "first_frame_timeout",
	"frame_too_big", "idle_timeout", "client_closed", "read_error", "write_error", "write_timeout", "relay_closed",
}

// String returns the reason's metric label.
func (c TCPCloseReason) String() string {
	if c < NumTCPCloseReasons {
		return tcpCloseNames[c]
	}
	return "unknown"
}

// tcpServer is the relay's TCP listener and its connections.
type tcpServer struct {
	// Set once.
	r    *Relay
	ln   *net.TCPListener
	addr netip.AddrPort
	bufs sync.Pool // *[]byte of 2 + hop.MaxPayload: queued frames
	wg   sync.WaitGroup

	mu       sync.RWMutex
	conns    map[netip.AddrPort]*tcpConn // by client (TCP form); guarded by mu
	bySource map[netip.Prefix]int        // open connections per source; guarded by mu
	closed   bool                        // guarded by mu

	// Counters, read by Stats.
	open, established atomic.Int64
	accepted          atomic.Uint64
	closes            [NumTCPCloseReasons]atomic.Uint64
	frames, bytes     [numDirections]atomic.Uint64
	drops             [NumDropReasons]atomic.Uint64 // frames dropped, by the relay's drop reasons
}

// tcpConn is one client's TCP connection.
type tcpConn struct {
	// Set once.
	s      *tcpServer
	conn   *net.TCPConn
	client netip.AddrPort // TCP form (hop.TCPAddr)
	src    netip.Prefix
	sock   *net.UDPConn  // the internal socket its frames leave from
	wake   chan struct{} // capacity 1: the queue has frames
	done   chan struct{} // closed by close
	wrote  chan struct{} // closed when the writer returns

	closeOnce sync.Once
	// failed is 1 + the reason the writer gave up (a write error or
	// timeout), which then closed the socket under the reader; 0: none.
	failed atomic.Uint32

	mu      sync.Mutex
	q       [tcpQueue]*[]byte // ring of framed packets (length + packet); guarded by mu
	head    int               // guarded by mu
	n       int               // guarded by mu
	closed  bool              // guarded by mu
	writing bool              // the writer was started; guarded by mu
}

// sourcePrefix is the unit of the per-source connection cap: an IPv4
// address or an IPv6 /64, as for flows (limits.go).
func sourcePrefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.Prefix(64)
	return p
}

func newTCPServer(r *Relay, addr string) (*tcpServer, error) {
	laddr, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenTCP("tcp", laddr)
	if err != nil {
		return nil, err
	}
	s := &tcpServer{
		r:        r,
		ln:       ln,
		addr:     canonical(ln.Addr().(*net.TCPAddr).AddrPort()),
		conns:    make(map[netip.AddrPort]*tcpConn),
		bySource: make(map[netip.Prefix]int),
	}
	s.bufs.New = func() any { b := make([]byte, 2+hop.MaxPayload); return &b }
	return s, nil
}

// acceptLoop accepts connections until the listener closes. An accept
// that fails otherwise (out of file descriptors) waits as a read error
// does, 1 ms doubling to 1 s.
func (s *tcpServer) acceptLoop() {
	defer s.r.wg.Done()
	var wait time.Duration
	for {
		conn, err := s.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			wait = min(max(2*wait, firstReadBackoff), maxReadBackoff)
			select {
			case <-s.r.done:
				return
			case <-time.After(wait):
			}
			continue
		}
		wait = 0
		s.accept(conn)
	}
}

// accept admits conn under the caps or closes it with a reset.
func (s *tcpServer) accept(conn *net.TCPConn) {
	s.accepted.Add(1)
	ap := canonical(conn.RemoteAddr().(*net.TCPAddr).AddrPort())
	c := &tcpConn{
		s:      s,
		conn:   conn,
		client: hop.TCPAddr(ap),
		src:    sourcePrefix(ap.Addr()),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		wrote:  make(chan struct{}),
	}
	ws := s.r.workers
	c.sock = ws[int(s.accepted.Load())%len(ws)].internal
	refused := NumTCPCloseReasons
	s.mu.Lock()
	switch {
	case s.closed:
		refused = TCPRelayClosed
	case len(s.conns) >= s.r.cfg.MaxTCPConns:
		refused = TCPRefusedTotal
	case s.bySource[c.src] >= s.r.cfg.MaxTCPConnsPerIP:
		refused = TCPRefusedSource
	case s.conns[c.client] != nil:
		refused = TCPRefusedDuplicate
	default:
		s.conns[c.client] = c
		s.bySource[c.src]++
		s.wg.Add(1) // under mu: shutdown's Wait comes after it
	}
	s.mu.Unlock()
	if refused != NumTCPCloseReasons {
		// Counted before the reset, so that whoever sees the reset also
		// sees it counted.
		s.closes[refused].Add(1)
		_ = conn.SetLinger(0) // a reset: no TIME_WAIT left for a refused connection
		_ = conn.Close()
		return
	}
	s.open.Add(1)
	_ = conn.SetNoDelay(true)
	_ = conn.SetKeepAlive(false) // the idle timeout and ICE consent cover it
	_ = conn.SetWriteBuffer(tcpSendBuffer)
	go c.serve()
}

// serve reads the connection until it ends, then closes it.
func (c *tcpConn) serve() {
	defer c.s.wg.Done()
	reason := c.readLoop()
	if f := c.failed.Load(); f != 0 {
		reason = TCPCloseReason(f - 1) // the writer closed the socket under the reader
	}
	c.close(reason)
}

// readLoop reads frames and forwards their packets until the connection
// must close, and returns why.
func (c *tcpConn) readLoop() TCPCloseReason {
	r := c.s.r
	br := bufio.NewReaderSize(c.conn, tcpReadBuffer)
	frame := make([]byte, hop.MaxHeaderLen+hop.MaxPayload)
	start := time.Now()
	_ = c.conn.SetReadDeadline(start.Add(r.cfg.TCPFirstFrameTimeout))
	// The idle deadline is pushed forward at most every `every`, to
	// idle+every past the push: silence closes the connection after
	// between TCPIdleTimeout and a quarter more.
	idle := r.cfg.TCPIdleTimeout
	every := min(tcpDeadlineEvery, idle/4)
	var pushed time.Time // when the idle deadline was last pushed; zero before the first frame
	for {
		var l [2]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			return c.readError(err, pushed.IsZero())
		}
		n := int(l[0])<<8 | int(l[1])
		if n > hop.MaxPayload {
			c.s.drops[DropTooBig].Add(1)
			return TCPFrameTooBig
		}
		pkt := frame[hop.MaxHeaderLen : hop.MaxHeaderLen+n]
		if _, err := io.ReadFull(br, pkt); err != nil {
			return c.readError(err, pushed.IsZero())
		}
		now := time.Now()
		if pushed.IsZero() {
			if drop := c.first(frame[:hop.MaxHeaderLen+n], start); drop != dropNone {
				c.s.drops[drop].Add(1)
				return TCPFirstFrameInvalid
			}
			c.mu.Lock()
			if !c.closed {
				c.writing = true
				c.s.established.Add(1)
				go c.writeLoop()
			}
			c.mu.Unlock()
			pushed = now
			_ = c.conn.SetReadDeadline(now.Add(idle + every))
			continue
		}
		if now.Sub(pushed) >= every {
			pushed = now
			_ = c.conn.SetReadDeadline(now.Add(idle + every))
		}
		if n == 0 {
			c.s.drops[DropUnknownFirstByte].Add(1)
			continue
		}
		to, out, drop := r.fromClient(c.client, netip.AddrPort{}, frame[:hop.MaxHeaderLen+n], hop.MaxHeaderLen, now)
		if drop == dropNone && out != nil {
			drop = c.forward(out, to, n)
		}
		if drop != dropNone {
			c.s.drops[drop].Add(1)
		}
	}
}

// first admits the connection's first frame, buf[hop.MaxHeaderLen:]: it
// must be a Binding request whose token makes (or rides) the client's
// flow, and is then forwarded. A frame a per-source cap turns away for
// the moment waits on this goroutine, trying again every waitRetry for up
// to waitHold (over TCP a client sends a check once, RFC 8489 §6.2.2), and
// is counted with the UDP requests the waiting room holds (wait.go).
func (c *tcpConn) first(buf []byte, start time.Time) DropReason {
	r := c.s.r
	pkt := buf[hop.MaxHeaderLen:]
	switch _, res := stunpeek.PeekBindingRequest(pkt); {
	case stunpeek.Classify(pkt) == stunpeek.KindOther:
		return DropUnknownFirstByte
	case stunpeek.Classify(pkt) != stunpeek.KindSTUN:
		return DropNotSTUNOnMiss
	case res == stunpeek.NotBindingRequest:
		return DropSTUNNotBindingRequest
	case res == stunpeek.NoUsername:
		return DropNoUsername
	case res == stunpeek.UsernameTooLong:
		return DropUsernameMalformed
	case res != stunpeek.OK:
		return DropSTUNMalformed
	}
	var held time.Time
	for {
		now := time.Now()
		to, out, drop := r.fromClient(c.client, netip.AddrPort{}, buf, hop.MaxHeaderLen, now)
		if holdable(drop) && (held.IsZero() || now.Sub(held) < waitHold) {
			if held.IsZero() {
				held = now
				r.wait.heldTCP(1)
			}
			select {
			case <-time.After(waitRetry):
				continue
			case <-c.done:
				r.wait.heldTCP(-1)
				return drop
			}
		}
		if !held.IsZero() {
			r.wait.heldTCP(-1)
			if drop == dropNone {
				r.wait.results[waitAdmitted].Add(1)
			} else {
				r.wait.results[waitExpired].Add(1)
			}
		}
		if drop != dropNone {
			return drop
		}
		return c.forward(out, to, len(pkt))
	}
}

// forward sends hop datagram out (header and a packet of n bytes) to the
// transceiver or cluster relay to.
func (c *tcpConn) forward(out []byte, to netip.AddrPort, n int) DropReason {
	if _, err := c.sock.WriteToUDPAddrPort(out, to); err != nil {
		return DropWriteError
	}
	c.s.frames[toTransceiver].Add(1)
	c.s.bytes[toTransceiver].Add(uint64(n))
	return dropNone
}

// readError is the close reason of read error err; first says whether
// the first frame was still awaited.
func (c *tcpConn) readError(err error, first bool) TCPCloseReason {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded) && first:
		return TCPFirstFrameTimeout
	case errors.Is(err, os.ErrDeadlineExceeded):
		return TCPIdleTimeout
	case errors.Is(err, net.ErrClosed):
		return TCPRelayClosed
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), isReset(err):
		return TCPClientClosed
	}
	return TCPReadError
}

// enqueue copies packet p, for the client, into the connection's send
// queue and wakes its writer. The internal loop calls it: it never
// blocks. A full queue drops its oldest audio frame, or its oldest frame,
// and says so (DropTCPQueueFull); a closed connection takes nothing
// (DropTCPNoConnection).
func (c *tcpConn) enqueue(p []byte) DropReason {
	bp := c.s.bufs.Get().(*[]byte)
	b := (*bp)[:2+len(p)]
	b[0], b[1] = byte(len(p)>>8), byte(len(p))
	copy(b[2:], p)
	*bp = b
	drop := dropNone
	var evicted *[]byte
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.s.bufs.Put(bp)
		return DropTCPNoConnection
	}
	if c.n == len(c.q) {
		evicted = c.evictLocked()
		drop = DropTCPQueueFull
	}
	c.q[(c.head+c.n)%len(c.q)] = bp
	c.n++
	c.mu.Unlock()
	if evicted != nil {
		c.s.bufs.Put(evicted)
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return drop
}

// evictLocked removes the oldest RTP frame of the full queue, or else the
// oldest frame, and returns it. c.mu is held.
func (c *tcpConn) evictLocked() *[]byte {
	at := 0
	for i := range c.n {
		if hop.IsRTP((*c.q[(c.head+i)%len(c.q)])[2:]) {
			at = i
			break
		}
	}
	idx := (c.head + at) % len(c.q)
	bp := c.q[idx]
	// Close the gap: shift the older frames up by one.
	for i := at; i > 0; i-- {
		c.q[(c.head+i)%len(c.q)] = c.q[(c.head+i-1)%len(c.q)]
	}
	c.q[c.head] = nil
	c.head = (c.head + 1) % len(c.q)
	c.n--
	return bp
}

// writeLoop writes the queued frames to the client, all that are queued
// with one writev, until the connection closes.
func (c *tcpConn) writeLoop() {
	defer close(c.wrote)
	var taken [tcpQueue]*[]byte
	bufs := make(net.Buffers, 0, tcpQueue)
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		for {
			c.mu.Lock()
			n := c.n
			for i := range n {
				j := (c.head + i) % len(c.q)
				taken[i], c.q[j] = c.q[j], nil
			}
			c.head, c.n = 0, 0
			c.mu.Unlock()
			if n == 0 {
				break
			}
			bufs = bufs[:0]
			var size int
			for _, bp := range taken[:n] {
				bufs = append(bufs, *bp)
				size += len(*bp)
			}
			_ = c.conn.SetWriteDeadline(time.Now().Add(tcpWriteTimeout))
			w := bufs // WriteTo consumes its receiver
			_, err := w.WriteTo(c.conn)
			for i, bp := range taken[:n] {
				c.s.bufs.Put(bp)
				taken[i] = nil
			}
			if err != nil {
				reason := TCPWriteError
				switch {
				case errors.Is(err, os.ErrDeadlineExceeded):
					reason = TCPWriteTimeout
				case isReset(err) || errors.Is(err, syscall.EPIPE):
					reason = TCPClientClosed // it hung up while we wrote
				}
				// The reader, woken by the closed socket, closes the
				// connection with this reason (serve).
				c.failed.CompareAndSwap(0, uint32(reason)+1)
				_ = c.conn.SetLinger(0)
				_ = c.conn.Close()
				return
			}
			c.s.frames[toClient].Add(uint64(n))
			c.s.bytes[toClient].Add(uint64(size - 2*n))
		}
	}
}

// close ends the connection once, for reason: it closes the socket (with
// a reset unless the client closed first, so that no TIME_WAIT is left
// for a connection the relay ended), waits for the writer, removes its
// flow and then the connection, and returns the queued buffers.
func (c *tcpConn) close(reason TCPCloseReason) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		writing := c.writing
		c.mu.Unlock()
		close(c.done)
		if reason != TCPClientClosed {
			_ = c.conn.SetLinger(0)
		}
		_ = c.conn.Close()
		if writing {
			<-c.wrote
			c.s.established.Add(-1)
		}
		s := c.s
		// The flow first, while the connection still holds its address:
		// a new connection from the same address is refused (duplicate)
		// until then, so its flow is never the one removed here.
		s.r.flows.remove(c.client)
		s.mu.Lock()
		if s.conns[c.client] == c {
			delete(s.conns, c.client)
			if s.bySource[c.src]--; s.bySource[c.src] <= 0 {
				delete(s.bySource, c.src)
			}
		}
		s.mu.Unlock()
		s.open.Add(-1)
		c.mu.Lock()
		for c.n > 0 {
			s.bufs.Put(c.q[c.head])
			c.q[c.head] = nil
			c.head = (c.head + 1) % len(c.q)
			c.n--
		}
		c.mu.Unlock()
		s.closes[reason].Add(1)
	})
}

// deliver hands packet p, from a transceiver for TCP client client (TCP
// form), to the client's connection. The internal loop calls it.
func (s *tcpServer) deliver(client netip.AddrPort, p []byte) DropReason {
	if s == nil {
		return DropTCPNoConnection
	}
	s.mu.RLock()
	c := s.conns[client]
	s.mu.RUnlock()
	if c == nil {
		return DropTCPNoConnection
	}
	return c.enqueue(p)
}

// ErrDraining is Relay.Ready's error while the relay drains (Drain).
var ErrDraining = errors.New("relay: draining: taking no new ICE-TCP connections")

// Drain stops taking ICE-TCP connections (the listener closes; Ready
// fails with ErrDraining, so the relay leaves its load balancer) and waits
// until every open connection has ended (its call hung up, or its client
// moved) or ctx is done, and returns how many are still open. Everything
// else goes on meanwhile: the open connections' frames both ways, and UDP
// (a UDP client holds nothing here: once the load balancer sends it
// elsewhere, its next packets rebuild its flow on another relay). A relay
// restart would close the connections, and clients that do not reconnect
// an ICE-TCP connection (Firefox, Pion) would lose their calls; drained,
// they keep them for as long as ctx allows. Without Config.TCPAddr it
// returns 0 at once. Close ends what is left.
func (r *Relay) Drain(ctx context.Context) int {
	s := r.tcp
	if s == nil {
		return 0
	}
	r.draining.Store(true)
	_ = s.ln.Close()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		n := int(s.open.Load())
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
		}
	}
}

// shutdown closes the listener and every connection and waits for their
// goroutines. Relay.Close calls it.
func (s *tcpServer) shutdown() error {
	err := s.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil // Drain closed it
	}
	s.mu.Lock()
	s.closed = true
	conns := make([]*tcpConn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.close(TCPRelayClosed)
	}
	s.wg.Wait()
	return err
}

// isReset reports whether err is the client resetting the connection.
func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
