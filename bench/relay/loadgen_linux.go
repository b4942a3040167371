package relaybench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// The load generator is one busy-polling loop on one pinned OS thread that
// plays every client and the sink (the fake transceiver or TURN peer), so
// that both ends share one monotonic clock and no goroutine scheduling sits
// on the measured path. Clients are distinct source addresses 127.1.x.y on
// one wildcard-bound socket: each datagram names its source with an
// IP_PKTINFO control message, and replies to every 127.1.x.y:port land on
// the same socket. So 2,000 sessions cost one socket and batched syscalls.

type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

const (
	cliBuf   = 256 // a client datagram: 4 bytes of ChannelData header and up to 200 of payload
	ctrlSize = 32  // unix.CmsgSpace(unix.SizeofInet4Pktinfo)
)

// clientConn sends datagrams from chosen loopback source addresses.
type clientConn struct {
	c    *net.UDPConn
	rc   syscall.RawConn
	port uint16
	in   *udpio.Batch

	hdrs []mmsghdr
	iovs []unix.Iovec
	ctrl []byte
	bufs [][]byte
	dst  unix.RawSockaddrInet4
	n    int

	off     int
	errno   error
	flushFn func(fd uintptr)
}

func newClientConn(batch int) (*clientConn, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		return nil, err
	}
	_ = c.SetReadBuffer(4 << 20)
	_ = c.SetWriteBuffer(4 << 20)
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	cc := &clientConn{
		c: c, rc: rc, port: uint16(c.LocalAddr().(*net.UDPAddr).Port),
		hdrs: make([]mmsghdr, batch), iovs: make([]unix.Iovec, batch),
		ctrl: make([]byte, batch*ctrlSize), bufs: make([][]byte, batch),
	}
	rbufs := make([][]byte, 64)
	for i := range rbufs {
		rbufs[i] = make([]byte, 2048)
	}
	if cc.in, err = udpio.NewBatch(c, len(rbufs), rbufs); err != nil {
		c.Close()
		return nil, err
	}
	for i := range cc.hdrs {
		cc.bufs[i] = make([]byte, cliBuf)
		h := &cc.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&cc.dst))
		h.Namelen = unix.SizeofSockaddrInet4
		h.Iov = &cc.iovs[i]
		h.SetIovlen(1)
		cc.iovs[i].Base = &cc.bufs[i][0]
		ctrl := cc.ctrl[i*ctrlSize : (i+1)*ctrlSize]
		cm := (*unix.Cmsghdr)(unsafe.Pointer(&ctrl[0]))
		cm.Level, cm.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
		cm.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
		h.Control = &ctrl[0]
		h.SetControllen(ctrlSize)
	}
	cc.flushFn = cc.send
	return cc, nil
}

func (cc *clientConn) setTarget(to netip.AddrPort) {
	cc.dst = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: to.Addr().As4()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&cc.dst.Port))[:], to.Port())
}

// next returns the buffer of the next datagram, to be sent from src, or
// nil if the batch is full. The caller fills it and calls commit.
func (cc *clientConn) next(src [4]byte) []byte {
	if cc.n == len(cc.hdrs) {
		return nil
	}
	ctrl := cc.ctrl[cc.n*ctrlSize:]
	pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&ctrl[unix.CmsgLen(0)]))
	pi.Ifindex, pi.Spec_dst = 0, src
	return cc.bufs[cc.n]
}

func (cc *clientConn) commit(n int) {
	cc.iovs[cc.n].SetLen(n)
	cc.n++
}

// flush sends what is queued without waiting; datagrams the socket buffer
// cannot take are discarded and not counted as sent.
func (cc *clientConn) flush() int {
	cc.off, cc.errno = 0, nil
	for cc.off < cc.n && cc.errno == nil {
		_ = cc.rc.Control(cc.flushFn)
	}
	sent := cc.off
	cc.n = 0
	return sent
}

func (cc *clientConn) send(fd uintptr) {
	r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&cc.hdrs[cc.off])), uintptr(cc.n-cc.off), unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		if e != unix.EINTR {
			cc.errno = e
		}
		return
	}
	cc.off += int(r)
}

// sessionIP is the loopback source address of session i.
func sessionIP(i int) [4]byte {
	return [4]byte{127, byte(1 + i/62500), byte(1 + i/250%250), byte(1 + i%250)}
}

// hist is a latency histogram with 100 ns buckets up to 20 ms.
type hist struct {
	b []uint32
	n uint64
}

const (
	histRes = 100
	histMax = 20_000_000
)

func newHist() *hist { return &hist{b: make([]uint32, histMax/histRes)} }

func (h *hist) add(ns int64) {
	i := max(ns, 0) / histRes
	if i >= int64(len(h.b)) {
		i = int64(len(h.b)) - 1
	}
	h.b[i]++
	h.n++
}

func (h *hist) reset() {
	clear(h.b)
	h.n = 0
}

// quantile returns the q-quantile in ns (the bucket's upper edge).
func (h *hist) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	want := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.b {
		seen += uint64(c)
		if seen >= want {
			return int64(i+1) * histRes
		}
	}
	return histMax
}

// pinProcess sets the CPU affinity of every thread of pid to cpu and raises
// its priority to nice -10 (best effort: a shared machine's other work then
// interferes less). Threads created later inherit both from their creator.
func pinProcess(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
		_ = unix.Setpriority(unix.PRIO_PROCESS, tid, -10)
	}
	return errors.Join(errs...)
}

// procCPU returns the CPU time pid's live threads have used, from
// /proc/<pid>/task/*/schedstat (nanoseconds on CPU).
func procCPU(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var total int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) > 0 {
			v, _ := strconv.ParseInt(f[0], 10, 64)
			total += v
		}
	}
	return time.Duration(total), nil
}
