package transceiver

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/playout"
)

// The media delay probe measures how long an audio packet spends inside
// the transceiver's own machinery, each way:
//
//   - to_backend: from the hop socket read to the bridge write returning:
//     the peer endpoint's demultiplexing and SRTP decryption (its shared
//     read loop), the session's media queue and goroutine hand-off, for
//     PCM formats the Opus decode, and the bridge's framing and write.
//   - to_client: from the paced send (SendPacket, on the playout clock's
//     tick) to the hop socket handing the packet to the kernel: SRTP
//     encryption, the wait for the packet's sendmmsg batch (hop.Conn
//     Hold/Flush) and the socket write. It leaves out, on purpose, the
//     time a packet waits in the session's playout queue for its tick
//     (the pacing that plays audio in real time, up to the queue's
//     depth), and for PCM formats the Opus encode, done when the
//     backend's frame arrives, before it is queued.
//
// An SRTP packet's header is in the clear (RFC 3711 §3.1), so the socket
// side names a packet by its SSRC and sequence number as the RTP side
// does, with no per-packet state elsewhere. On the way out the sequence
// number is the one the playout queue gave the packet.
//
// One packet in delaySample (by sequence number) is measured: a stamp
// table of delaySlots entries per direction, indexed by a hash of SSRC and
// sequence number; a packet whose slot was overwritten before it came out
// is not measured.
const (
	delaySample = 8
	delaySlots  = 4096
)

// Directions, the values of the direction label of the media delay histogram.
const (
	dirToBackend = "to_backend"
	dirToClient  = "to_client"
)

// delayBuckets span 25 µs to ~200 ms, in seconds.
var delayBuckets = prometheus.ExponentialBuckets(25e-6, 2, 14)

type delayStamp struct {
	key uint64 // 1<<48 | ssrc<<16 | seq; 0 when empty
	at  int64  // unix ns
}

// delayTable remembers when sampled packets entered one direction.
type delayTable struct {
	mu    sync.Mutex
	slots [delaySlots]delayStamp
	hist  prometheus.Observer
}

func delayKey(ssrc uint32, seq uint16) (uint64, bool) {
	if seq%delaySample != 0 {
		return 0, false
	}
	return 1<<48 | uint64(ssrc)<<16 | uint64(seq), true
}

func (t *delayTable) slot(key uint64) *delayStamp {
	h := key * 0x9E3779B97F4A7C15 // Fibonacci hashing
	return &t.slots[h>>(64-12)]
}

// enter stamps packet (ssrc, seq) as it enters, if sampled.
func (t *delayTable) enter(ssrc uint32, seq uint16) {
	key, ok := delayKey(ssrc, seq)
	if !ok {
		return
	}
	now := time.Now().UnixNano()
	t.mu.Lock()
	*t.slot(key) = delayStamp{key: key, at: now}
	t.mu.Unlock()
}

// leave observes the time packet (ssrc, seq) spent inside, if it was
// stamped.
func (t *delayTable) leave(ssrc uint32, seq uint16) {
	key, ok := delayKey(ssrc, seq)
	if !ok {
		return
	}
	now := time.Now().UnixNano()
	t.mu.Lock()
	s := t.slot(key)
	st := *s
	if st.key == key {
		*s = delayStamp{}
	}
	t.mu.Unlock()
	if st.key == key {
		t.hist.Observe(float64(now-st.at) / 1e9)
	}
}

// delayProbe is the pair of tables.
type delayProbe struct {
	toBackend, toClient delayTable
}

func newDelayProbe(h *prometheus.HistogramVec) *delayProbe {
	p := &delayProbe{}
	p.toBackend.hist = h.WithLabelValues(dirToBackend)
	p.toClient.hist = h.WithLabelValues(dirToClient)
	return p
}

// rtpHeader returns the SSRC and sequence number of an RTP or SRTP packet,
// and false for anything else: STUN, DTLS, RTCP (RFC 7983 §7 and RFC 5761
// §4 tell them apart by the first and second bytes).
func rtpHeader(b []byte) (ssrc uint32, seq uint16, ok bool) {
	if !hop.IsRTP(b) {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b[8:12]), binary.BigEndian.Uint16(b[2:4]), true
}

// addrPortConn is what the peer endpoint reads and writes: the hop conn or, in
// Direct mode, the UDP socket.
type addrPortConn interface {
	net.PacketConn
	ReadFromAddrPort(b []byte) (int, netip.AddrPort, error)
	WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error)
}

// probeConn stamps sampled RTP packets as they are read from the socket
// and, in Direct mode, observes them as they are written to it (hop.Conn
// observes its own sends through ConnConfig.OnSent: batched packets leave
// at the batch's flush, not at their write). It is the playout clock's
// Batcher (server.go), forwarding to the conn's batching if it has one.
type probeConn struct {
	addrPortConn
	probe *delayProbe
	batch playout.Batcher // the conn's batching (hop.Conn); nil: writes are immediate and observed here
}

func newProbeConn(c addrPortConn, p *delayProbe) *probeConn {
	pc := &probeConn{addrPortConn: c, probe: p}
	pc.batch, _ = c.(playout.Batcher)
	return pc
}

// Hold starts a tick's batch (playout.Batcher).
func (c *probeConn) Hold() {
	if c.batch != nil {
		c.batch.Hold()
	}
}

// Flush sends the tick's batch (playout.Batcher).
func (c *probeConn) Flush() {
	if c.batch != nil {
		c.batch.Flush()
	}
}

// sent observes a datagram the socket took, if it is a sampled RTP packet.
func (p *delayProbe) sent(b []byte) {
	if ssrc, seq, ok := rtpHeader(b); ok {
		p.toClient.leave(ssrc, seq)
	}
}

func (c *probeConn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	n, addr, err := c.addrPortConn.ReadFromAddrPort(b)
	if err == nil {
		if ssrc, seq, ok := rtpHeader(b[:n]); ok {
			c.probe.toBackend.enter(ssrc, seq)
		}
	}
	return n, addr, err
}

func (c *probeConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, addr, err := c.addrPortConn.ReadFrom(b)
	if err == nil {
		if ssrc, seq, ok := rtpHeader(b[:n]); ok {
			c.probe.toBackend.enter(ssrc, seq)
		}
	}
	return n, addr, err
}

func (c *probeConn) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	n, err := c.addrPortConn.WriteToAddrPort(b, addr)
	if c.batch == nil && err == nil {
		c.probe.sent(b)
	}
	return n, err
}

func (c *probeConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.addrPortConn.WriteTo(b, addr)
	if c.batch == nil && err == nil {
		c.probe.sent(b)
	}
	return n, err
}

// udpAddrPort gives a UDP socket the method names of addrPortConn.
type udpAddrPort struct{ *net.UDPConn }

func (c udpAddrPort) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	return c.ReadFromUDPAddrPort(b)
}

func (c udpAddrPort) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	return c.WriteToUDPAddrPort(b, addr)
}
