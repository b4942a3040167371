package transceiver

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/playout"
)

// The media delay probe measures how long an audio packet spends inside
// the transceiver's own machinery, each way:
//
//   - to_backend: from the hop socket read to the bridge write returning:
//     ICE and DTLS-SRTP demultiplexing, SRTP decryption, Pion's buffers
//     and goroutine hand-offs, for PCM formats the Opus decode, and the
//     bridge's framing and write.
//   - to_client: from the paced send (SendPacket, on the playout clock's
//     tick) to the hop socket write: Pion's RTCP report interceptor, SRTP
//     encryption and the socket write. It leaves out, on purpose, the time
//     a packet waits in the session's playout queue for its tick (the
//     pacing that plays audio in real time, up to the queue's depth), and
//     for PCM formats the Opus encode, done when the backend's frame
//     arrives, before it is queued.
//
// An SRTP packet's header is in the clear (RFC 3711 §3.1), so the socket
// side names a packet by its SSRC and sequence number as the RTP side
// does, with no per-packet state in Pion. On the way out the sequence
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

// addrPortConn is what the ICE mux reads and writes: the hop conn or, in
// Direct mode, the UDP socket.
type addrPortConn interface {
	net.PacketConn
	ReadFromAddrPort(b []byte) (int, netip.AddrPort, error)
	WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error)
}

// probeConn stamps sampled RTP packets as they are read from the socket
// and observes them as they are written to it. It is the playout clock's
// Batcher (media.go): with a batching conn (hop.Conn), the RTP packets
// written during a tick wait for the tick's Flush, and so do their
// observations, so that to_client still ends at the socket write.
type probeConn struct {
	addrPortConn
	probe *delayProbe
	batch playout.Batcher // the conn's batching; nil: writes are immediate

	holds atomic.Int32 // Holds in force
	// mu guards held: sampled RTP packets written while held, observed at Flush.
	mu   sync.Mutex
	held []heldPacket
}

type heldPacket struct {
	ssrc uint32
	seq  uint16
}

func newProbeConn(c addrPortConn, p *delayProbe) *probeConn {
	pc := &probeConn{addrPortConn: c, probe: p}
	pc.batch, _ = c.(playout.Batcher)
	return pc
}

// Hold starts a tick's batch (playout.Batcher).
func (c *probeConn) Hold() {
	if c.batch == nil {
		return
	}
	c.holds.Add(1)
	c.batch.Hold()
}

// Flush sends the tick's batch and observes its sampled packets.
func (c *probeConn) Flush() {
	if c.batch == nil {
		return
	}
	c.batch.Flush()
	c.mu.Lock()
	for _, p := range c.held {
		c.probe.toClient.leave(p.ssrc, p.seq)
	}
	c.held = c.held[:0]
	c.holds.Add(-1)
	c.mu.Unlock()
}

// sent observes an RTP packet written to the conn: now, or at Flush when
// the conn held it.
func (c *probeConn) sent(ssrc uint32, seq uint16) {
	if c.holds.Load() == 0 {
		c.probe.toClient.leave(ssrc, seq)
		return
	}
	if _, ok := delayKey(ssrc, seq); !ok {
		return // not sampled
	}
	c.mu.Lock()
	c.held = append(c.held, heldPacket{ssrc, seq})
	c.mu.Unlock()
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
	if ssrc, seq, ok := rtpHeader(b); ok && err == nil {
		c.sent(ssrc, seq)
	}
	return n, err
}

func (c *probeConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.addrPortConn.WriteTo(b, addr)
	if ssrc, seq, ok := rtpHeader(b); ok && err == nil {
		c.sent(ssrc, seq)
	}
	return n, err
}

// senderSSRC returns the SSRC the sender writes with.
func senderSSRC(s *webrtc.RTPSender) uint32 {
	if enc := s.GetParameters().Encodings; len(enc) > 0 {
		return uint32(enc[0].SSRC)
	}
	return 0
}

// udpAddrPort gives a UDP socket the method names of addrPortConn.
type udpAddrPort struct{ *net.UDPConn }

func (c udpAddrPort) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	return c.ReadFromUDPAddrPort(b)
}

func (c udpAddrPort) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	return c.WriteToUDPAddrPort(b, addr)
}
