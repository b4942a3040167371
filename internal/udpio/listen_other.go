//go:build !linux

package udpio

import (
	"context"
	"fmt"
	"net"
)

// MaxGroup is the most sockets ListenGroup binds on one port: one on this
// OS, whose SO_REUSEPORT does not balance unicast datagrams across
// sockets.
const MaxGroup = 1

// ListenGroup binds one UDP socket on addr (n must be 1 on this OS). If
// another socket holds addr the error names addr and wraps
// syscall.EADDRINUSE.
func ListenGroup(addr string, n int) ([]*net.UDPConn, error) {
	if n != 1 {
		return nil, fmt.Errorf("udpio: %d sockets on one port need Linux SO_REUSEPORT; use 1", n)
	}
	pc, err := (&net.ListenConfig{}).ListenPacket(context.Background(), "udp", addr)
	if err != nil {
		return nil, bindError(addr, err)
	}
	c := pc.(*net.UDPConn)
	SetBuffers(c)
	return []*net.UDPConn{c}, nil
}
