package udpio

import (
	"bytes"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// batch is what the relay uses of a Batch; both forms have it.
type batch interface {
	Read() (int, error)
	Len(i int) int
	Addr(i int) netip.AddrPort
	Truncated(i int) bool
	Buf(i int) []byte
	Queue(p []byte, to netip.AddrPort, counted int) bool
	Flush() (sent, bytes, failed int, err error)
}

// forms are the batch constructors under test: the OS's Batch and, on
// Linux, also the portable form every other OS uses.
var forms = []struct {
	name string
	new  func(c *net.UDPConn, size int, bufs [][]byte) (batch, error)
}{
	{"Batch", func(c *net.UDPConn, size int, bufs [][]byte) (batch, error) { return NewBatch(c, size, bufs) }},
	{"portable", func(c *net.UDPConn, size int, bufs [][]byte) (batch, error) { return newPortable(c, size, bufs) }},
}

func udp(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

func slots(n, size int) [][]byte {
	b := make([][]byte, n)
	for i := range b {
		b[i] = make([]byte, size)
	}
	return b
}

// TestBatchRoundTrip sends datagrams through a send batch and reads them
// with a receive batch, checking payloads, source addresses, the counted
// bytes, and (for Linux's Batch) that neither direction allocates.
func TestBatchRoundTrip(t *testing.T) {
	for _, form := range forms {
		for _, network := range []struct{ name, addr string }{{"udp4", "127.0.0.1:0"}, {"udp6 dual-stack", "[::]:0"}} {
			t.Run(form.name+"/"+network.name, func(t *testing.T) {
				rx, err := net.ListenPacket("udp", network.addr)
				if err != nil {
					t.Skip(err)
				}
				defer rx.Close()
				tx := udp(t)
				rxAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), rx.LocalAddr().(*net.UDPAddr).AddrPort().Port())
				in, err := form.new(rx.(*net.UDPConn), 8, slots(8, 2048))
				if err != nil {
					t.Fatal(err)
				}
				out, err := form.new(tx, 8, nil)
				if err != nil {
					t.Fatal(err)
				}
				pkts := [][]byte{bytes.Repeat([]byte{1}, 160), bytes.Repeat([]byte{2}, 120), bytes.Repeat([]byte{3}, 200)}
				round := func() {
					for _, p := range pkts {
						if !out.Queue(p, rxAddr, len(p)-10) { // as if a 10-byte header were left out
							t.Fatal("queue refused")
						}
					}
					sent, n, failed, err := out.Flush()
					if err != nil || sent != len(pkts) || failed != 0 || n != 480-30 {
						t.Fatalf("flush: sent %d bytes %d failed %d err %v", sent, n, failed, err)
					}
					for got := 0; got < len(pkts); {
						n, err := in.Read()
						if err != nil {
							t.Fatal(err)
						}
						for i := range n {
							if in.Addr(i) != addrOf(tx) || in.Truncated(i) || !bytes.Equal(in.Buf(i)[:in.Len(i)], pkts[got+i]) {
								t.Fatalf("datagram %d from %v (%d bytes)", got+i, in.Addr(i), in.Len(i))
							}
						}
						got += n
					}
				}
				round()
				if form.name == "Batch" && runtime.GOOS == "linux" {
					if n := testing.AllocsPerRun(100, round); n != 0 {
						t.Errorf("%v allocations per round trip of %d datagrams, want 0", n, len(pkts))
					}
				}
				// An IPv6 destination on an IPv4 socket is refused by Queue
				// (Linux's Batch) or fails in Flush (portable), never sent.
				if out.Queue(pkts[0], netip.MustParseAddrPort("[2001:db8::1]:9"), len(pkts[0])) {
					if sent, _, failed, err := out.Flush(); sent != 0 || failed != 1 || err != nil {
						t.Errorf("IPv6 destination on an IPv4 socket: sent %d, failed %d, err %v", sent, failed, err)
					}
				}
			})
		}
	}
}

// TestBatchTruncated: a datagram longer than its buffer is reported, not
// passed on as if whole.
func TestBatchTruncated(t *testing.T) {
	for _, form := range forms {
		t.Run(form.name, func(t *testing.T) {
			rx, tx := udp(t), udp(t)
			in, err := form.new(rx, 2, slots(2, 100))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.WriteToUDPAddrPort(make([]byte, 300), addrOf(rx)); err != nil {
				t.Fatal(err)
			}
			if n, err := in.Read(); err != nil || n != 1 || !in.Truncated(0) {
				t.Fatalf("read %d, err %v, truncated %v; want 1 truncated datagram", n, err, n > 0 && in.Truncated(0))
			}
		})
	}
}

// TestBatchClosed: Read and Flush on a closed socket return net.ErrClosed.
func TestBatchClosed(t *testing.T) {
	for _, form := range forms {
		t.Run(form.name, func(t *testing.T) {
			c := udp(t)
			in, err := form.new(c, 4, slots(4, 64))
			if err != nil {
				t.Fatal(err)
			}
			out, err := form.new(c, 4, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			if _, err := in.Read(); !IsClosed(err) {
				t.Errorf("Read after Close: %v, want net.ErrClosed", err)
			}
			out.Queue([]byte{1}, addrOf(udp(t)), 1)
			if _, _, failed, err := out.Flush(); !IsClosed(err) || failed != 1 {
				t.Errorf("Flush after Close: failed %d, err %v; want 1, net.ErrClosed", failed, err)
			}
		})
	}
}

// TestNewBatchErrors: bad sizes fail at construction.
func TestNewBatchErrors(t *testing.T) {
	c := udp(t)
	for _, form := range forms {
		for _, tt := range []struct {
			name string
			size int
			bufs [][]byte
		}{{"zero size", 0, nil}, {"buffers for another size", 4, slots(3, 64)}} {
			if _, err := form.new(c, tt.size, tt.bufs); err == nil {
				t.Errorf("%s, %s: no error", form.name, tt.name)
			}
		}
	}
}

// TestListenGroup: the sockets of a group share one port.
func TestListenGroup(t *testing.T) {
	n := min(MaxGroup, 3)
	conns, err := ListenGroup("127.0.0.1:0", n)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(conns)
	if len(conns) != n {
		t.Fatalf("%d sockets, want %d", len(conns), n)
	}
	for _, c := range conns[1:] {
		if addrOf(c) != addrOf(conns[0]) {
			t.Errorf("socket on %v, want %v", addrOf(c), addrOf(conns[0]))
		}
	}
	if MaxGroup == 1 {
		if _, err := ListenGroup("127.0.0.1:0", 2); err == nil {
			t.Error("more sockets than MaxGroup: no error")
		}
	}
}
