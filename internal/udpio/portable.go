package udpio

import (
	"net"
	"net/netip"
)

// portable is batched I/O's portable form: the same contract as Batch, one
// datagram per system call through the net package. It is the Batch of
// every OS but Linux, and is built everywhere so that its tests run on
// Linux too.
type portable struct {
	c    *net.UDPConn
	size int

	// Receive: the buffers, and the one datagram of the last Read.
	bufs  [][]byte
	rlen  int
	raddr netip.AddrPort

	// Send: the queued datagrams.
	pkts [][]byte
	tos  []netip.AddrPort
	plen []int
}

func newPortable(c *net.UDPConn, size int, bufs [][]byte) (*portable, error) {
	if err := checkSize(size, bufs); err != nil {
		return nil, err
	}
	return &portable{c: c, size: size, bufs: bufs,
		pkts: make([][]byte, 0, size), tos: make([]netip.AddrPort, 0, size), plen: make([]int, 0, size)}, nil
}

// Read receives one datagram into the first buffer, blocking until it
// arrives.
func (b *portable) Read() (int, error) {
	n, from, err := b.c.ReadFromUDPAddrPort(b.bufs[0])
	if err != nil {
		return 0, err
	}
	b.rlen, b.raddr = n, netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	return 1, nil
}

func (b *portable) Buf(i int) []byte        { return b.bufs[i] }
func (b *portable) Len(int) int             { return b.rlen }
func (b *portable) Addr(int) netip.AddrPort { return b.raddr }
func (b *portable) Truncated(int) bool      { return b.rlen == len(b.bufs[0]) }
func (b *portable) Queued() int             { return len(b.pkts) }
func (b *portable) queue(p []byte, to netip.AddrPort, counted int) bool {
	if len(b.pkts) == b.size {
		return false
	}
	b.pkts, b.tos, b.plen = append(b.pkts, p), append(b.tos, to), append(b.plen, counted)
	return true
}

// Queue adds datagram p for to; it refuses only when the batch is full (a
// destination the socket cannot reach fails in Flush).
func (b *portable) Queue(p []byte, to netip.AddrPort, counted int) bool {
	return b.queue(p, to, counted)
}

// Flush sends the queued datagrams one write each.
func (b *portable) Flush() (sent, bytes, failed int, err error) {
	defer func() {
		clear(b.pkts) // drop the references to the callers' buffers
		b.pkts, b.tos, b.plen = b.pkts[:0], b.tos[:0], b.plen[:0]
	}()
	for i, p := range b.pkts {
		if _, werr := b.c.WriteToUDPAddrPort(p, b.tos[i]); werr != nil {
			if IsClosed(werr) {
				return sent, bytes, failed + len(b.pkts) - i, werr
			}
			failed++
			continue
		}
		sent++
		bytes += b.plen[i]
	}
	return sent, bytes, failed, nil
}
