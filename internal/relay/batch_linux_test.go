package relay

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
)

// TestBatchRoundTrip sends datagrams through a send Batch and reads them
// with a receive Batch, checking payloads, source addresses and that
// neither direction allocates.
func TestBatchRoundTrip(t *testing.T) {
	for _, network := range []struct{ name, addr string }{{"udp4", "127.0.0.1:0"}, {"udp6 dual-stack", "[::]:0"}} {
		t.Run(network.name, func(t *testing.T) {
			rx, err := net.ListenPacket("udp", network.addr)
			if err != nil {
				t.Skip(err)
			}
			defer rx.Close()
			tx := udp(t)
			rxAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), rx.LocalAddr().(*net.UDPAddr).AddrPort().Port())
			in, err := NewBatch(rx.(*net.UDPConn), 8, newSlots(8))
			if err != nil {
				t.Fatal(err)
			}
			out, err := NewBatch(tx, 8, nil)
			if err != nil {
				t.Fatal(err)
			}
			pkts := [][]byte{bytes.Repeat([]byte{1}, 160), bytes.Repeat([]byte{2}, 120), bytes.Repeat([]byte{3}, 200)}
			round := func() {
				for _, p := range pkts {
					if !out.Queue(p, rxAddr) {
						t.Fatal("queue refused")
					}
				}
				sent, n, failed, err := out.Flush()
				if err != nil || sent != len(pkts) || failed != 0 || n != 480 {
					t.Fatalf("flush: sent %d bytes %d failed %d err %v", sent, n, failed, err)
				}
				for got := 0; got < len(pkts); {
					n, err := in.Read()
					if err != nil {
						t.Fatal(err)
					}
					for i := range n {
						if in.Addr(i) != addrOf(tx) || in.Truncated(i) || !bytes.Equal(in.bufs[i][:in.Len(i)], pkts[got+i]) {
							t.Fatalf("datagram %d from %v (%d bytes)", got+i, in.Addr(i), in.Len(i))
						}
					}
					got += n
				}
			}
			round()
			if n := testing.AllocsPerRun(100, round); n != 0 {
				t.Errorf("%v allocations per round trip of %d datagrams, want 0", n, len(pkts))
			}
			if out.Queue(pkts[0], netip.MustParseAddrPort("[2001:db8::1]:9")) {
				t.Error("an IPv6 destination on an IPv4 socket must be refused")
			}
		})
	}
}
