//go:build !linux

package udpio

import "net"

// Batch is one direction of datagram I/O on one socket: either a receive
// batch (Read, then Len/Addr/Truncated per message) or a send batch
// (Queue, then Flush). A Batch is used by one goroutine at a time. On this
// OS it moves one datagram per system call: Read returns one datagram, in
// the first buffer, and Truncated reports a datagram that filled its
// buffer (it may have been longer; this OS's fallback cannot tell).
type Batch struct{ *portable }

// NewBatch prepares up to size messages on c. For a receive batch, bufs
// holds size buffers (Read uses the first); for a send batch, bufs is nil
// and Queue names the buffers. It fails if size is not positive or bufs
// has another length.
func NewBatch(c *net.UDPConn, size int, bufs [][]byte) (*Batch, error) {
	p, err := newPortable(c, size, bufs)
	if err != nil {
		return nil, err
	}
	return &Batch{p}, nil
}
