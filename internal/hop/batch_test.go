package hop

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// batchRig is a Conn with clients routed through one relay socket.
type batchRig struct {
	c       *Conn
	relay   *net.UDPConn
	clients []netip.AddrPort
}

func newBatchRig(t *testing.T, clients int, onSent func([]byte)) *batchRig {
	t.Helper()
	c, err := NewConn(listen(t), ConnConfig{Advertise: netip.MustParseAddrPort("127.0.0.1:3478"), OnSent: onSent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	relay := listen(t)
	t.Cleanup(func() { _ = relay.Close() })
	_ = relay.SetReadBuffer(4 << 20)
	r := &batchRig{c: c, relay: relay}
	to := net.UDPAddrFromAddrPort(c.SocketAddr())
	buf := make([]byte, 1500)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range clients {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), 40000)
		stun := []byte{0, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42}
		if _, err := relay.WriteTo(append(AppendHeader(nil, TypeData, client), stun...), to); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.ReadFromAddrPort(buf); err != nil { // learns the route
			t.Fatal(err)
		}
		r.clients = append(r.clients, client)
	}
	return r
}

// rtpPacket is a 20-byte RTP packet (RFC 3550 §5.1): payload type 111,
// sequence number seq, SSRC ssrc.
func rtpPacket(ssrc uint32, seq uint16) []byte {
	b := make([]byte, 20)
	b[0], b[1] = 0x80, 111
	binary.BigEndian.PutUint16(b[2:], seq)
	binary.BigEndian.PutUint32(b[8:], ssrc)
	return b
}

// read returns the next datagram at the relay: its client and payload.
func (r *batchRig) read(t *testing.T) (netip.AddrPort, []byte) {
	t.Helper()
	buf := make([]byte, 1600)
	_ = r.relay.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := r.relay.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	_, client, p, err := ParseHeader(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return client, p
}

func TestIsRTP(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		want bool
	}{
		{"rtp", rtpPacket(1, 1), true},
		{"rtp with marker", func() []byte { b := rtpPacket(1, 1); b[1] |= 0x80; return b }(), true},
		{"rtcp sender report", append([]byte{0x80, 200}, make([]byte, 26)...), false},
		{"rtcp receiver report", append([]byte{0x81, 201}, make([]byte, 30)...), false},
		{"stun", append([]byte{0, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42}, make([]byte, 12)...), false},
		{"dtls", append([]byte{0x16, 0xfe, 0xfd}, make([]byte, 20)...), false},
		{"short", []byte{0x80, 111, 0, 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsRTP(tt.b); got != tt.want {
				t.Errorf("IsRTP(% x) = %v, want %v", tt.b[:min(len(tt.b), 4)], got, tt.want)
			}
		})
	}
}

// TestHoldFlushSendsEachOnceInOrder: RTP written between Hold and Flush
// waits and then leaves exactly once, in write order, more packets than
// one sendmmsg carries included; a non-RTP datagram written meanwhile
// (here RTCP) leaves at once, ahead of them.
func TestHoldFlushSendsEachOnceInOrder(t *testing.T) {
	var reported []byte // first two bytes of every datagram reported sent, then the RTP seq
	r := newBatchRig(t, 3, func(b []byte) {
		reported = append(reported, b[1])
		if IsRTP(b) {
			reported = binary.BigEndian.AppendUint16(reported, binary.BigEndian.Uint16(b[2:]))
		}
	})
	const n = 2*sendBatch + 7
	r.c.Hold()
	for i := range n {
		if _, err := r.c.WriteToAddrPort(rtpPacket(uint32(i%3), uint16(i)), r.clients[i%3]); err != nil {
			t.Fatal(err)
		}
		if i == sendBatch/2 {
			rtcp := append([]byte{0x80, 201, 0, 1}, make([]byte, 4)...)
			if _, err := r.c.WriteToAddrPort(rtcp, r.clients[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A full batch was sent while writing; the rest waits for Flush.
	if got := r.c.Stats().Sent; got != 1+sendBatch*2 {
		t.Fatalf("before Flush: %d sent, want the RTCP packet and %d full batches", got, 2)
	}
	r.c.Flush()
	if got := r.c.Stats().Sent; got != 1+n {
		t.Fatalf("after Flush: %d sent, want %d", got, 1+n)
	}
	// OnSent saw each datagram once, as it left: the RTCP packet first
	// (written while the first batch was filling), then the RTP in order.
	want := []byte{201}
	for i := range n {
		want = append(want, 111)
		want = binary.BigEndian.AppendUint16(want, uint16(i))
	}
	if string(reported) != string(want) {
		t.Fatalf("OnSent saw % x\nwant % x", reported, want)
	}
	first, rtcp := r.read(t)
	if first != r.clients[0] || rtcp[1] != 201 {
		t.Fatalf("first datagram %x for %s, want the RTCP packet, sent at once", rtcp, first)
	}
	for i := range n {
		client, p := r.read(t)
		if client != r.clients[i%3] || len(p) != 20 || binary.BigEndian.Uint16(p[2:]) != uint16(i) {
			t.Fatalf("datagram %d: seq %d for %s, want seq %d for %s", i, binary.BigEndian.Uint16(p[2:]), client, i, r.clients[i%3])
		}
	}
	// Nothing holds: RTP leaves at once.
	if _, err := r.c.WriteToAddrPort(rtpPacket(9, 9), r.clients[1]); err != nil {
		t.Fatal(err)
	}
	if got := r.c.Stats().Sent; got != 2+n {
		t.Fatalf("unheld RTP: %d sent, want %d", got, 2+n)
	}
}

// TestHoldFlushConcurrent: holders on several goroutines (the clock's
// workers), each writing its own stream: every packet arrives once and
// each stream in order. The relay reads while the writers run, and each
// writer starts its next tick once its last tick has arrived, so at most
// one tick per writer is in flight: the test does not depend on the
// relay's socket buffer, which it sets to a default kernel's
// (net.core.rmem_max 212,992 bytes; the kernel doubles what is asked).
func TestHoldFlushConcurrent(t *testing.T) {
	const writers, ticks, perTick = 4, 20, 30
	r := newBatchRig(t, writers, nil)
	_ = r.relay.SetReadBuffer(212992 / 2)
	type datagram struct {
		client netip.AddrPort
		p      []byte
	}
	var (
		got     []datagram
		readErr error
		arrived = make([]chan struct{}, writers) // a tick of stream w arrived
		failed  = make(chan struct{})            // the relay stopped reading
		read    = make(chan struct{})
	)
	for w := range arrived {
		arrived[w] = make(chan struct{}, ticks)
	}
	go func() {
		defer close(read)
		defer close(failed)
		count := make([]int, writers)
		buf := make([]byte, 1600)
		for range writers * ticks * perTick {
			_ = r.relay.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, _, err := r.relay.ReadFrom(buf)
			if err != nil {
				readErr = err
				return
			}
			_, client, p, err := ParseHeader(buf[:n])
			if err != nil {
				readErr = err
				return
			}
			got = append(got, datagram{client, bytes.Clone(p)})
			if w := binary.BigEndian.Uint32(p[8:]); w < writers {
				if count[w]++; count[w]%perTick == 0 {
					arrived[w] <- struct{}{}
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			seq := uint16(0)
			for range ticks {
				r.c.Hold()
				for range perTick {
					if _, err := r.c.WriteToAddrPort(rtpPacket(uint32(w), seq), r.clients[w]); err != nil {
						t.Error(err)
					}
					seq++
				}
				r.c.Flush()
				select {
				case <-arrived[w]:
				case <-failed:
					return
				}
			}
		})
	}
	wg.Wait()
	<-read
	if readErr != nil {
		t.Fatalf("relay read after %d datagrams: %v", len(got), readErr)
	}
	next := make([]uint16, writers)
	for i, d := range got {
		w, seq := binary.BigEndian.Uint32(d.p[8:]), binary.BigEndian.Uint16(d.p[2:])
		if w >= writers || d.client != r.clients[w] {
			t.Fatalf("datagram %d: stream %d for %s", i, w, d.client)
		}
		if seq != next[w] {
			t.Fatalf("stream %d: seq %d, want %d", w, seq, next[w])
		}
		next[w]++
	}
	if s := r.c.Stats(); s.Sent != writers*ticks*perTick || s.DroppedSendFailed != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestFlushAfterClose: a tick that ends after Close (a clock worker
// during shutdown) discards its queue: no send_failed drops, nothing
// reported sent.
func TestFlushAfterClose(t *testing.T) {
	reported := 0
	r := newBatchRig(t, 2, func([]byte) { reported++ })
	r.c.Hold()
	for i := range 5 {
		if _, err := r.c.WriteToAddrPort(rtpPacket(1, uint16(i)), r.clients[i%2]); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.c.Close(); err != nil {
		t.Fatal(err)
	}
	r.c.Flush()
	if s := r.c.Stats(); s.Sent != 0 || s.DroppedSendFailed != 0 || reported != 0 {
		t.Fatalf("after Close: %d sent, %d send_failed, %d reported sent; want none", s.Sent, s.DroppedSendFailed, reported)
	}
	// Nothing holds any more: a write fails at once.
	if _, err := r.c.WriteToAddrPort(rtpPacket(1, 9), r.clients[0]); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
}

// TestHeldWriteAllocs: a tick's held writes and its Flush allocate
// nothing.
func TestHeldWriteAllocs(t *testing.T) {
	r := newBatchRig(t, 2, func([]byte) {})
	pkts := [][]byte{rtpPacket(1, 1), rtpPacket(2, 1)}
	buf := make([]byte, 1600)
	tick := func() {
		r.c.Hold()
		for i, p := range pkts {
			if _, err := r.c.WriteToAddrPort(p, r.clients[i]); err != nil {
				t.Fatal(err)
			}
		}
		r.c.Flush()
		for range pkts {
			if _, _, err := r.relay.ReadFromUDPAddrPort(buf); err != nil { // keep the relay's buffer from filling
				t.Fatal(err)
			}
		}
	}
	tick()
	if a := testing.AllocsPerRun(100, tick); a != 0 {
		t.Errorf("%.1f allocations per tick, want 0", a)
	}
}
