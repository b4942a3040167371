//go:build !linux

package kube

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"testing"
)

// NetNS is a Linux network namespace; elsewhere NewNetNS skips the test.
type NetNS struct{ Name string }

// NewNetNS skips: network namespaces are Linux's.
func NewNetNS(t testing.TB) *NetNS {
	t.Skip("network namespaces need Linux")
	return nil
}

var errNotLinux = errors.New("kube: network namespaces need Linux")

// Addr returns 10.78.0.i.
func (n *NetNS) Addr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 78, 0, byte(i)}) }

// AddAddr does nothing outside Linux.
func (n *NetNS) AddAddr(netip.Addr) {}

// Command cannot run inside a namespace outside Linux.
func (n *NetNS) Command(bin string, args ...string) *exec.Cmd { return exec.Command(bin, args...) }

// WriteHosts fails outside Linux.
func (n *NetNS) WriteHosts(map[string]netip.Addr) error { return errNotLinux }

// DialContext fails outside Linux.
func (n *NetNS) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, errNotLinux
}

// ListenPacket fails outside Linux.
func (n *NetNS) ListenPacket(string, string) (net.PacketConn, error) { return nil, errNotLinux }
