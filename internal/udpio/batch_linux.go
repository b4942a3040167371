package udpio

import (
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Batched datagram I/O on Linux: recvmmsg(2) and sendmmsg(2) on a UDP
// socket with every message, iovec, address buffer and payload buffer
// allocated once.
//
// Why not golang.org/x/net/ipv4.PacketConn.ReadBatch: it returns each
// source address as a freshly allocated *net.UDPAddr (two allocations per
// datagram, x/net internal/socket parseInetAddr), which breaks the relay's
// zero-allocation rule. The syscalls go through syscall.RawConn, so a read
// that would block parks the goroutine on the runtime's netpoller exactly as
// net.UDPConn does.

// mmsghdr is struct mmsghdr from <sys/socket.h>.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// Batch is one direction of batched I/O on one socket: either a receive
// batch (Read, then Len/Addr/Truncated per message) or a send batch
// (Queue, then Flush). A Batch is used by one goroutine at a time.
type Batch struct {
	rc    syscall.RawConn
	inet6 bool // the socket is AF_INET6 (IPv4 peers as v4-mapped)

	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6
	bufs  [][]byte // receive: each message's buffer
	plen  []int    // send: the length Queue was told to count for each queued message

	// Results of the last syscall, set by the RawConn callbacks.
	n, off int
	errno  error

	readFn, writeFn func(fd uintptr) bool
	pollFn          func(fd uintptr)
}

// NewBatch prepares up to size messages on c. For a receive batch, bufs
// holds size buffers that Read fills (each is read into whole); for a
// send batch, bufs is nil and Queue names the buffers. It fails if size
// is not positive, bufs has another length, or c's socket cannot be
// inspected.
func NewBatch(c *net.UDPConn, size int, bufs [][]byte) (*Batch, error) {
	if err := checkSize(size, bufs); err != nil {
		return nil, err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	b := &Batch{
		rc:    rc,
		hdrs:  make([]mmsghdr, size),
		iovs:  make([]unix.Iovec, size),
		names: make([]unix.RawSockaddrInet6, size),
		bufs:  bufs,
		plen:  make([]int, size),
	}
	var domain int
	var serr error
	if err := rc.Control(func(fd uintptr) { domain, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN) }); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	b.inet6 = domain == unix.AF_INET6
	for i := range b.hdrs {
		h := &b.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
		if bufs != nil {
			b.iovs[i].Base = unsafe.SliceData(bufs[i])
			b.iovs[i].SetLen(len(bufs[i]))
		}
	}
	b.readFn, b.writeFn = b.recv, b.send
	b.pollFn = func(fd uintptr) { b.recv(fd) }
	return b, nil
}

// Read receives at least one and at most the batch size of datagrams,
// blocking until one arrives. It returns net.ErrClosed after the socket is
// closed, and the errno of a failed recvmmsg otherwise.
func (b *Batch) Read() (int, error) {
	for i := range b.hdrs {
		b.hdrs[i].hdr.Namelen = unix.SizeofSockaddrInet6
		b.hdrs[i].hdr.Flags = 0
	}
	b.n, b.errno = 0, nil
	if err := b.rc.Read(b.readFn); err != nil {
		return 0, err
	}
	return b.n, b.errno
}

// Poll is Read without waiting: it returns 0 when nothing is queued. It is
// for busy-polling load generators (bench/relay), not for the relay, and
// exists on Linux only.
func (b *Batch) Poll() (int, error) {
	for i := range b.hdrs {
		b.hdrs[i].hdr.Namelen = unix.SizeofSockaddrInet6
		b.hdrs[i].hdr.Flags = 0
	}
	b.n, b.errno = 0, nil
	if err := b.rc.Control(b.pollFn); err != nil {
		return 0, err
	}
	return b.n, b.errno
}

// Buf returns the buffer of message i of a receive batch.
func (b *Batch) Buf(i int) []byte { return b.bufs[i] }

func (b *Batch) recv(fd uintptr) bool {
	for {
		r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(len(b.hdrs)), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			b.n = int(r)
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false // wait on the netpoller
		}
		b.errno = e
		return true
	}
}

// Len is the length of datagram i of the last Read.
func (b *Batch) Len(i int) int { return int(b.hdrs[i].n) }

// Truncated reports whether datagram i was longer than its buffer.
func (b *Batch) Truncated(i int) bool { return b.hdrs[i].hdr.Flags&unix.MSG_TRUNC != 0 }

// Addr is the source of datagram i of the last Read, canonical (IPv4-mapped
// IPv6 unmapped). It is invalid if the kernel gave no usable address.
func (b *Batch) Addr(i int) netip.AddrPort {
	sa := &b.names[i]
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
	}
	return netip.AddrPort{}
}

// Queue adds datagram p for to to the send batch and reports whether it
// fits (false when the batch is full or to cannot be expressed on this
// socket, such as IPv6 on an IPv4 socket). Flush counts counted bytes for
// it once sent: len(p), or less to leave a header out of byte counters.
// p must stay untouched until Flush.
func (b *Batch) Queue(p []byte, to netip.AddrPort, counted int) bool {
	if b.n == len(b.hdrs) {
		return false
	}
	i := b.n
	sa := &b.names[i]
	var l uint32
	a := to.Addr()
	switch {
	case b.inet6:
		*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
		l = unix.SizeofSockaddrInet6
	case a.Is4():
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
		l = unix.SizeofSockaddrInet4
	default:
		return false
	}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], to.Port())
	b.hdrs[i].hdr.Namelen = l
	b.iovs[i].Base = unsafe.SliceData(p)
	b.iovs[i].SetLen(len(p))
	b.plen[i] = counted
	b.n++
	return true
}

// Queued returns the number of datagrams waiting for Flush.
func (b *Batch) Queued() int { return b.n }

// Flush sends the queued datagrams, as few sendmmsg calls as the kernel
// allows, waiting (on the netpoller) while the socket buffer is full. A
// datagram the kernel refuses is skipped and counted in failed; sent and
// bytes (the counted lengths given to Queue) count the others. err is
// net.ErrClosed after Close.
func (b *Batch) Flush() (sent, bytes, failed int, err error) {
	total := b.n
	b.off = 0
	for b.off < total {
		b.errno = nil
		start := b.off
		if err := b.rc.Write(b.writeFn); err != nil {
			b.n = 0
			return sent, bytes, failed + total - b.off, err
		}
		for i := start; i < b.off; i++ {
			sent++
			bytes += b.plen[i]
		}
		if b.errno != nil {
			failed++ // the datagram at b.off: skip it
			b.off++
		}
	}
	b.n = 0
	return sent, bytes, failed, nil
}

func (b *Batch) send(fd uintptr) bool {
	for {
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[b.off])), uintptr(b.n-b.off), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			b.off += int(r)
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		b.errno = e
		return true
	}
}
