package hop

import (
	"net/netip"

	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// Batched sends of paced media.
//
// A transceiver sends every session's audio on one shared clock tick
// (internal/playout): hundreds of RTP packets within a fraction of a
// millisecond, each one sendto(2) of its own. Between Hold and Flush,
// Conn queues the RTP packets it is asked to write and Flush sends them
// together, with as few sendmmsg(2) calls as the batch size allows
// (internal/udpio). Everything else stays immediate: STUN, DTLS
// (and so the data channels), RTCP, and RTP written while nothing holds.
//
// Which datagrams wait is decided by their first two bytes (RFC 7983 §7,
// RFC 5761 §4): RTP, not RTCP. They are the paced packets of the clock's
// workers; a packet queued by any goroutine is sent by the next Flush of
// any holder, so none waits past the end of the tick it was written in.

// sendBatch is the number of datagrams one sendmmsg carries. A full batch
// is sent at once, so a packet waits at most for the work of writing the
// next sendBatch-1 (their interceptor and SRTP encryption, some tens of
// microseconds), not for the rest of the tick; 16 keeps most of the
// saving of a larger batch (BenchmarkWriteRTP: about 0.5-0.8 µs of the
// writer's CPU per packet, of 4-5 µs).
const sendBatch = 16

// IsRTP reports whether b is an RTP (or SRTP) packet and not RTCP: the
// datagrams Conn queues between Hold and Flush. A first byte in 128–191
// is RTP or RTCP (RFC 7983 §7); with rtcp-mux, payload types 64–95 with
// the marker bit are RTCP packet types 192–223 (RFC 5761 §4).
func IsRTP(b []byte) bool {
	if len(b) < 12 || b[0] < 128 || b[0] > 191 {
		return false
	}
	pt := b[1] & 0x7f
	return pt < 64 || pt > 95
}

// Hold makes RTP writes wait for Flush. Every Hold must be followed by
// one Flush. Holds nest across goroutines: RTP waits while any is in
// force. Safe for concurrent use.
func (c *Conn) Hold() { c.holds.Add(1) }

// Flush sends the RTP packets queued since the holds began, in the order
// they were written, and ends one Hold. A packet the kernel refuses is
// counted (ConnStats.DroppedSendFailed). After Close (a worker's tick
// that ends during shutdown) the queue is discarded: not sent, not
// counted, not reported to ConnConfig.OnSent. Safe for concurrent use.
func (c *Conn) Flush() {
	c.bmu.Lock()
	c.flushLocked()
	c.holds.Add(-1) // under bmu: a writer that sees no hold sends at once
	c.bmu.Unlock()
}

// flushLocked sends the queue. bmu held.
func (c *Conn) flushLocked() {
	if c.out.Queued() == 0 {
		return
	}
	queued := c.out.Queued()
	sent, _, failed, err := c.out.Flush()
	c.sent.Add(uint64(sent))
	if udpio.IsClosed(err) {
		// Closed before or during the flush: failed counts the packets
		// the closed socket never took (a shutdown, not the kernel
		// refusing them), so it is not a send_failed drop.
		return
	}
	c.droppedSendFailed.Add(uint64(failed))
	if c.onSent != nil {
		for i, b := range c.obufs[:queued] {
			c.onSent(b[c.ohdr[i]:c.oend[i]]) // refused ones included: the batch cannot tell which
		}
	}
}

// queue adds b, for client through relay, to the batch and reports
// whether it did; false means nothing holds (any more), or the relay's
// address does not suit the socket: the caller sends b at once.
func (c *Conn) queue(b []byte, client, relay netip.AddrPort) bool {
	c.bmu.Lock()
	defer c.bmu.Unlock()
	if c.holds.Load() == 0 {
		return false
	}
	if c.out.Queued() == len(c.obufs) {
		c.flushLocked()
	}
	i := c.out.Queued()
	buf := c.obufs[i]
	h := PutHeader(buf, TypeFor(client), client)
	n := h + copy(buf[h:], b)
	if IsTCP(client) {
		c.sentTCP.Add(1)
	}
	c.ohdr[i], c.oend[i] = h, n
	return c.out.Queue(buf[:n], relay, len(b))
}

// newSendBatch prepares Conn's batch and its buffers.
func (c *Conn) newSendBatch() error {
	out, err := udpio.NewBatch(c.sock, sendBatch, nil)
	if err != nil {
		return err
	}
	c.out = out
	c.obufs = make([][]byte, sendBatch)
	c.ohdr, c.oend = make([]int, sendBatch), make([]int, sendBatch)
	for i := range c.obufs {
		c.obufs[i] = make([]byte, MaxHeaderLen+MaxPayload)
	}
	return nil
}
