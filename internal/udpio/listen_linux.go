package udpio

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxGroup is the most sockets ListenGroup binds on one port: unbounded
// on Linux (SO_REUSEPORT balances them).
const MaxGroup = 1 << 16

// ListenGroup binds n UDP sockets on addr. With n > 1 each socket sets
// SO_REUSEPORT so that all of them share the port and the kernel spreads
// datagrams across them by a hash of the 4-tuple (one client stays on one
// socket). If addr asks for port 0, the first bind picks the port and the
// others join it. Each socket asks for 4 MiB socket buffers (the kernel
// caps them at net.core.[rw]mem_max).
//
// SO_REUSEPORT would equally let another process of the same user join
// the group (a second relay on the same address), and the kernel would
// then split the port's traffic between the two. So before binding the
// group ListenGroup binds addr once without SO_REUSEPORT and closes that
// socket again: if any socket holds the address, with SO_REUSEPORT or
// not, it fails with an error that names addr and wraps
// syscall.EADDRINUSE. Two groups started in the same instant can still
// both pass the probe; a process that joins later is refused by its own
// probe if it is a relay, and not at all if it sets SO_REUSEPORT itself.
func ListenGroup(addr string, n int) ([]*net.UDPConn, error) {
	lc := net.ListenConfig{}
	if n > 1 {
		if err := probe(addr); err != nil {
			return nil, err
		}
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	conns := make([]*net.UDPConn, 0, n)
	for i := range n {
		pc, err := lc.ListenPacket(context.Background(), "udp", addr)
		if err != nil {
			closeAll(conns)
			return nil, bindError(addr, err)
		}
		c := pc.(*net.UDPConn)
		conns = append(conns, c)
		if i == 0 {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				closeAll(conns)
				return nil, err
			}
			addr = net.JoinHostPort(host, strconv.Itoa(c.LocalAddr().(*net.UDPAddr).Port))
		}
		SetBuffers(c)
	}
	if len(conns) != n {
		closeAll(conns)
		return nil, fmt.Errorf("bound %d of %d sockets", len(conns), n)
	}
	return conns, nil
}

// probe binds addr once without SO_REUSEPORT and closes the socket, so
// that a port some other socket holds fails before a SO_REUSEPORT group
// joins it. Port 0 needs no probe: the kernel picks an unused port.
func probe(addr string) error {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return err
	}
	if ua.Port == 0 {
		return nil
	}
	pc, err := net.ListenUDP("udp", ua)
	if err != nil {
		return bindError(addr, err)
	}
	return pc.Close()
}
