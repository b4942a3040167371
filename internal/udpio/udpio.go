// Package udpio is UDP socket I/O shared by the relay, the hop and the
// transceiver: batched reads and writes, and groups of sockets sharing
// one port.
//
// On Linux a Batch moves up to its size of datagrams per recvmmsg(2) or
// sendmmsg(2) call without allocating, and ListenGroup binds n sockets on
// one port with SO_REUSEPORT, which the kernel balances by a hash of the
// 4-tuple. Elsewhere (a developer's macOS, say) the same API runs one
// datagram per system call through the net package and ListenGroup binds
// a single socket, so the relay builds and its tests run there, slower.
package udpio

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// BufferSize is the receive and send buffer, in bytes, that SetBuffers
// asks for. A loopback datagram of 100 bytes takes about 1 KiB of receive
// buffer, so the usual default (net.core.rmem_default, 208 KiB) holds a
// couple of hundred: 20 to 40 ms of 10 000 datagrams a second, less than
// a reader stalled by a busy machine can lose. BufferSize holds thousands.
// The kernel caps it at net.core.rmem_max and net.core.wmem_max (and
// doubles what it grants, for its bookkeeping).
const BufferSize = 4 << 20

// SetBuffers asks for BufferSize receive and send buffers on c, best
// effort: a smaller grant (the sysctl caps above) or an error leaves the
// socket working with what it has; Drops counts what a too small buffer
// lost.
func SetBuffers(c *net.UDPConn) {
	_ = c.SetReadBuffer(BufferSize)
	_ = c.SetWriteBuffer(BufferSize)
}

// IsClosed reports whether err means the socket was closed (net.ErrClosed).
func IsClosed(err error) bool { return errors.Is(err, net.ErrClosed) }

// bindError names addr when err says another socket holds it
// (EADDRINUSE), and returns err unchanged otherwise.
func bindError(addr string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("udpio: %s is in use by another process: %w", addr, syscall.EADDRINUSE)
	}
	return err
}

// checkSize validates NewBatch's size and buffers.
func checkSize(size int, bufs [][]byte) error {
	if size < 1 {
		return fmt.Errorf("udpio: batch size %d; want at least 1", size)
	}
	if bufs != nil && len(bufs) != size {
		return fmt.Errorf("udpio: %d buffers for a batch of %d", len(bufs), size)
	}
	return nil
}

// closeAll closes conns, ignoring errors: for unwinding a failed bind.
func closeAll(conns []*net.UDPConn) {
	for _, c := range conns {
		_ = c.Close()
	}
}
