package peer

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/pion/transport/v5/deadline"
)

// dtlsQueue is how many DTLS records a session's DTLS connection may be
// behind the read loop. DTLS carries the handshake (a flight is a few
// records) and the data channels' SCTP packets, which the DTLS reader
// takes as they come; a full queue drops, as a full socket buffer would.
const dtlsQueue = 32

// feed is the net.PacketConn a session's DTLS connection runs over: the
// read loop pushes the session's DTLS records into it, and its writes go
// to the session's client address on the shared socket.
type feed struct {
	s      *Session
	in     chan []byte
	done   chan struct{}
	once   sync.Once
	rdline *deadline.Deadline
}

func newFeed(s *Session) *feed {
	return &feed{s: s, in: make(chan []byte, dtlsQueue), done: make(chan struct{}), rdline: deadline.New()}
}

// push queues a copy of b and reports whether it fit. Read loop only.
func (f *feed) push(b []byte) bool {
	select {
	case <-f.done:
		return true // closed: nothing reads, nothing to count
	default:
	}
	select {
	case f.in <- bytes.Clone(b):
		return true
	default:
		return false
	}
}

// ReadFrom returns the next queued record.
func (f *feed) ReadFrom(p []byte) (int, net.Addr, error) {
	select {
	case b := <-f.in:
		return copy(p, b), f.remote(), nil
	case <-f.done:
		return 0, nil, net.ErrClosed
	case <-f.rdline.Done():
		return 0, nil, os.ErrDeadlineExceeded
	}
}

// WriteTo writes p to the session's selected client address, whatever
// addr says: the address follows the client's nominations and NAT
// rebindings.
func (f *feed) WriteTo(p []byte, _ net.Addr) (int, error) {
	select {
	case <-f.done:
		return 0, net.ErrClosed
	default:
	}
	a := f.s.remote()
	if !a.IsValid() {
		return 0, errNoAddress
	}
	return f.s.e.conn.WriteToAddrPort(p, a)
}

func (f *feed) remote() net.Addr {
	return net.UDPAddrFromAddrPort(f.s.remote())
}

// Close ends reads and writes. Idempotent.
func (f *feed) Close() error {
	f.once.Do(func() { close(f.done) })
	return nil
}

func (f *feed) LocalAddr() net.Addr { return f.s.e.conn.LocalAddr() }

func (f *feed) SetDeadline(t time.Time) error { return f.SetReadDeadline(t) }

func (f *feed) SetReadDeadline(t time.Time) error {
	f.rdline.Set(t)
	return nil
}

// SetWriteDeadline does nothing: writes do not block.
func (f *feed) SetWriteDeadline(time.Time) error { return nil }

// udpAddr is addr as the net.Addr DTLS wants for its peer.
func udpAddr(a netip.AddrPort) net.Addr { return net.UDPAddrFromAddrPort(a) }
