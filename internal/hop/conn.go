package hop

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/trusted"
	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// ErrNoRoute is returned by Conn writes to a client that no relay has
// delivered a datagram from (or whose route expired).
var ErrNoRoute = errors.New("hop: no relay route to client")

// ErrTooBig is returned by Conn writes of a datagram longer than MaxPayload.
var ErrTooBig = fmt.Errorf("hop: datagram longer than %d bytes", MaxPayload)

// MaxPayload is the longest client datagram (UDP payload, hop header not
// included) the whole path carries, in bytes: relays drop longer ones from
// either side (relay drop reason too_big), Conn drops longer ones it reads
// (ConnStats.DroppedTooBig) and refuses longer writes (ErrTooBig), and the
// transceiver sizes its read buffer to it. It is Pion's default
// receive MTU and the Ethernet MTU: WebRTC keeps its datagrams under the
// path MTU (DTLS, SCTP and browsers' RTP stay near 1,200 bytes), so nothing
// a real client sends comes near it.
const MaxPayload = 1500

// ConnStats are a Conn's counters since it was created.
type ConnStats struct {
	// Received counts client datagrams delivered to the reader.
	Received uint64
	// Sent counts client datagrams sent back through a relay.
	Sent uint64
	// ReceivedTCP and SentTCP are the part of Received and Sent that are
	// TCP clients' packets (TypeDataTCP). Sent counts a batched RTP packet
	// when its batch is sent, SentTCP when it is queued.
	ReceivedTCP, SentTCP uint64
	// DroppedNotHop counts datagrams without a valid hop header: a client
	// (or anyone else) sending to the transceiver directly, or garbage.
	DroppedNotHop uint64
	// DroppedUntrusted counts hop datagrams from a source outside the
	// allowed relay prefixes.
	DroppedUntrusted uint64
	// DroppedNoRoute counts writes to a client with no known relay.
	DroppedNoRoute uint64
	// DroppedTooBig counts client datagrams longer than MaxPayload: read
	// from a relay (dropped before the transceiver's endpoint sees them)
	// or written by it (refused with ErrTooBig).
	DroppedTooBig uint64
	// DroppedSendFailed counts RTP packets queued between Hold and Flush
	// that the kernel refused (batch.go); an immediate write's failure is
	// its caller's error instead. Packets still queued when the Conn is
	// closed are discarded without being counted here or in Sent.
	DroppedSendFailed uint64
	// Routes is the number of clients with a known relay.
	Routes int
}

// ConnConfig configures a Conn.
type ConnConfig struct {
	// Advertise is the address LocalAddr reports, the one host candidate
	// answers carry unless a region's ingress replaces it: the relay's
	// public VIP:port
	// (the transceiver's own port is never shown to clients).
	Advertise netip.AddrPort
	// AllowRelays lists the prefixes hop datagrams may come from. Empty
	// allows any source.
	AllowRelays trusted.Prefixes
	// RouteTTL is how long a client's route to its last relay lives
	// without traffic. Default 2 minutes, longer than ICE consent (30 s).
	RouteTTL time.Duration
	// OnSent, if set, is called with each client datagram (hop header not
	// included) when Conn hands it to the kernel: at its write, or for an
	// RTP packet held for a batch (batch.go) when the batch's sendmmsg
	// returned. It runs on the sending goroutine, must not block and must
	// not keep b. The transceiver's media delay probe observes with it.
	OnSent func(b []byte)
}

// Conn is the transceiver's end of the internal hop: a net.PacketConn over
// one UDP socket that strips the hop header from every datagram a relay
// delivers and reports the client's public address as the source, so that
// the transceiver's WebRTC endpoint (internal/peer) keys each session by
// its client's real address. Writes to a client go, with a header naming
// it, to the relay that delivered that client's last datagram.
//
// A TCP client's packets (TypeDataTCP) are reported under the client's
// TCP form of address (TCPAddr), and a write to that form goes out as
// TypeDataTCP: the endpoint keys a TCP path apart from a UDP one of the
// same ip:port, and answers on the transport a packet came in on.
//
// Conn reports each datagram under the address it came from, never under
// another address of the same client: when a client's NAT gives it a new
// port mid-call, its datagrams from there are a new address's, and whether
// the session's media follows is the endpoint's decision (internal/peer,
// "Path selection": the client's own SRTP or SRTCP from the new address,
// which a replayed Binding request cannot bring). Writes go to the address
// they name.
//
// Conn has allocation-free ReadFromAddrPort and WriteToAddrPort, which the
// endpoint uses. Reads are meant for one goroutine (the endpoint's);
// writes are safe from any number.
type Conn struct {
	// Set once.
	sock      *net.UDPConn
	advertise *net.UDPAddr
	allow     trusted.Prefixes
	ttl       time.Duration
	onSent    func([]byte) // ConnConfig.OnSent; nil for none
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	received, sent, droppedNotHop, droppedUntrusted, droppedNoRoute, droppedTooBig, droppedSendFailed atomic.Uint64
	receivedTCP, sentTCP                                                                              atomic.Uint64 // of received, sent: TCP clients'

	mu sync.RWMutex
	// routes maps a client's wire address to the relay that last delivered
	// its traffic; guarded by mu (lastSeen inside each route is atomic).
	routes map[netip.AddrPort]*route

	bufs sync.Pool // *[]byte of MaxHeaderLen + MaxPayload for writes

	// Batched RTP sends (batch.go). holds counts Holds not yet flushed;
	// it changes under bmu, which guards out and obufs.
	holds atomic.Int32
	bmu   sync.Mutex
	out   *udpio.Batch
	obufs [][]byte // one datagram buffer per slot of out
	// ohdr and oend bound each queued datagram's payload in its buffer.
	ohdr, oend []int
}

type route struct {
	relay    atomic.Pointer[netip.AddrPort]
	lastSeen atomic.Int64 // unix nanoseconds
}

// NewConn wraps sock, which the Conn then owns.
func NewConn(sock *net.UDPConn, cfg ConnConfig) (*Conn, error) {
	if !cfg.Advertise.IsValid() || cfg.Advertise.Port() == 0 {
		return nil, fmt.Errorf("hop: advertise address %q must be an IP and a non-zero port", cfg.Advertise)
	}
	if cfg.RouteTTL <= 0 {
		cfg.RouteTTL = 2 * time.Minute
	}
	c := &Conn{
		sock:      sock,
		onSent:    cfg.OnSent,
		advertise: net.UDPAddrFromAddrPort(cfg.Advertise),
		allow:     cfg.AllowRelays,
		ttl:       cfg.RouteTTL,
		done:      make(chan struct{}),
		routes:    make(map[netip.AddrPort]*route),
	}
	c.bufs.New = func() any { b := make([]byte, MaxHeaderLen+MaxPayload); return &b }
	if err := c.newSendBatch(); err != nil {
		return nil, fmt.Errorf("hop: send batch: %w", err)
	}
	c.wg.Add(1)
	go c.sweep()
	return c, nil
}

func (c *Conn) trusted(from netip.AddrPort) bool {
	return len(c.allow) == 0 || c.allow.Contains(from.Addr())
}

// ReadFromAddrPort reads the next client datagram into b and returns its
// length and the client's public address. Datagrams that are not valid hop
// datagrams from an allowed relay are dropped and counted, never returned.
func (c *Conn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	for {
		n, from, err := c.sock.ReadFromUDPAddrPort(b)
		if err != nil {
			return 0, netip.AddrPort{}, err
		}
		if !c.trusted(from) {
			c.droppedUntrusted.Add(1)
			continue
		}
		typ, client, payload, err := ParseHeader(b[:n])
		if err != nil {
			c.droppedNotHop.Add(1)
			continue
		}
		if len(payload) > MaxPayload {
			c.droppedTooBig.Add(1)
			continue
		}
		if typ == TypeDataTCP {
			client = TCPAddr(client)
			c.receivedTCP.Add(1)
		}
		c.learn(client, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
		c.received.Add(1)
		return copy(b, payload), client, nil
	}
}

func (c *Conn) learn(client, relay netip.AddrPort) {
	now := time.Now().UnixNano()
	c.mu.RLock()
	r := c.routes[client]
	c.mu.RUnlock()
	if r == nil {
		c.mu.Lock()
		if r = c.routes[client]; r == nil {
			r = &route{}
			r.relay.Store(&relay)
			c.routes[client] = r
		}
		c.mu.Unlock()
	}
	if cur := r.relay.Load(); *cur != relay {
		r.relay.Store(&relay) // the client's traffic now arrives through another relay
	}
	r.lastSeen.Store(now)
}

// WriteToAddrPort sends b to client through the relay that last delivered
// the client's traffic. It returns ErrNoRoute if there is none, ErrTooBig if
// b is longer than MaxPayload. Between Hold and Flush an RTP packet is
// queued instead, and sent by Flush (batch.go).
func (c *Conn) WriteToAddrPort(b []byte, client netip.AddrPort) (int, error) {
	if len(b) > MaxPayload {
		c.droppedTooBig.Add(1)
		return 0, ErrTooBig
	}
	if !IsTCP(client) {
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	}
	c.mu.RLock()
	r := c.routes[client]
	c.mu.RUnlock()
	if r == nil {
		c.droppedNoRoute.Add(1)
		return 0, ErrNoRoute
	}
	relay := *r.relay.Load()
	if c.holds.Load() > 0 && IsRTP(b) && c.queue(b, client, relay) {
		return len(b), nil
	}
	bp := c.bufs.Get().(*[]byte)
	defer c.bufs.Put(bp)
	buf := *bp
	n := PutHeader(buf, TypeFor(client), client)
	n += copy(buf[n:], b)
	if _, err := c.sock.WriteToUDPAddrPort(buf[:n], relay); err != nil {
		return 0, err
	}
	c.sent.Add(1)
	if IsTCP(client) {
		c.sentTCP.Add(1)
	}
	if c.onSent != nil {
		c.onSent(b)
	}
	return len(b), nil
}

// ReadFrom implements net.PacketConn; the address is a *net.UDPAddr.
func (c *Conn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := c.ReadFromAddrPort(b)
	if err != nil {
		return 0, nil, err
	}
	return n, net.UDPAddrFromAddrPort(a), nil
}

// WriteTo implements net.PacketConn; addr must be a *net.UDPAddr.
func (c *Conn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, fmt.Errorf("hop: write to %T, want *net.UDPAddr", addr)
	}
	return c.WriteToAddrPort(b, ua.AddrPort())
}

// LocalAddr returns the advertised address (the relay's public address),
// not the socket's: the answers' host candidate.
func (c *Conn) LocalAddr() net.Addr { return c.advertise }

// SocketAddr returns the address the internal-hop socket is bound to; relays
// send to it.
func (c *Conn) SocketAddr() netip.AddrPort {
	return c.sock.LocalAddr().(*net.UDPAddr).AddrPort()
}

// SetDeadline implements net.PacketConn.
func (c *Conn) SetDeadline(t time.Time) error { return c.sock.SetDeadline(t) }

// SetReadDeadline implements net.PacketConn.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.sock.SetReadDeadline(t) }

// SetWriteDeadline implements net.PacketConn.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.sock.SetWriteDeadline(t) }

// Stats returns the Conn's counters.
func (c *Conn) Stats() ConnStats {
	c.mu.RLock()
	routes := len(c.routes)
	c.mu.RUnlock()
	return ConnStats{
		Received:          c.received.Load(),
		Sent:              c.sent.Load(),
		ReceivedTCP:       c.receivedTCP.Load(),
		SentTCP:           c.sentTCP.Load(),
		DroppedNotHop:     c.droppedNotHop.Load(),
		DroppedUntrusted:  c.droppedUntrusted.Load(),
		DroppedNoRoute:    c.droppedNoRoute.Load(),
		DroppedTooBig:     c.droppedTooBig.Load(),
		DroppedSendFailed: c.droppedSendFailed.Load(),
		Routes:            routes,
	}
}

// sweep drops routes idle for longer than the TTL.
func (c *Conn) sweep() {
	defer c.wg.Done()
	t := time.NewTicker(c.ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case now := <-t.C:
			cutoff := now.Add(-c.ttl).UnixNano()
			c.mu.Lock()
			for k, r := range c.routes {
				if r.lastSeen.Load() < cutoff {
					delete(c.routes, k)
				}
			}
			c.mu.Unlock()
		}
	}
}

// Close closes the socket and stops the sweeper. It is idempotent.
func (c *Conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.done)
		err = c.sock.Close()
		c.wg.Wait()
	})
	return err
}
