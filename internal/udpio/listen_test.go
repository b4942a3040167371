package udpio

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
)

// TestListenGroupAddressInUse: a group never shares its address with a
// socket that is not its own, neither with a second group (both set
// SO_REUSEPORT on Linux, so without the probe the kernel would let the
// second join the first and split the traffic) nor with a plain socket.
func TestListenGroupAddressInUse(t *testing.T) {
	n := min(MaxGroup, 3)
	first, err := ListenGroup("127.0.0.1:0", n)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(first)
	plain := udp(t)

	for _, tt := range []struct {
		name  string
		owner *net.UDPConn
		n     int
	}{
		{"group after group", first[0], n},
		{"one socket after group", first[0], 1},
		{"group after plain socket", plain, n},
		{"one socket after plain socket", plain, 1},
	} {
		addr := addrOf(tt.owner).String()
		conns, err := ListenGroup(addr, tt.n)
		if err == nil {
			closeAll(conns)
			t.Errorf("%s: %d sockets bound on %s, which another socket holds", tt.name, len(conns), addr)
			continue
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("%s: error %q does not wrap EADDRINUSE", tt.name, err)
		}
		if want := addr + " is in use by another process"; !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q, want it to say %q", tt.name, err, want)
		}
	}

}
