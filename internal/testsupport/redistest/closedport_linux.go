package redistest

import (
	"testing"

	"golang.org/x/sys/unix"
)

// ClosedPort returns a loopback TCP port where connections are refused
// until the test ends: a socket bound to it that does not listen holds
// it, so that no other process can start listening there meanwhile (as
// one could on a port FreePort returned). Linux refuses a SYN to a bound
// port without a listener with a RST.
func ClosedPort(tb testing.TB) int {
	tb.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		tb.Fatal(err)
	}
	return sa.(*unix.SockaddrInet4).Port
}
