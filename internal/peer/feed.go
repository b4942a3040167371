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

// dtlsQueueBytes bounds the DTLS datagrams, in bytes, a session's DTLS
// connection may be behind the read loop. DTLS carries the handshake (a
// flight is a few records) and the data channels' SCTP packets: a large
// message (a session.update with tool schemas is tens of KB) comes as a
// burst of 1200-byte packets once SCTP's congestion window has opened,
// which the DTLS reader, on a loaded machine, may not take as they come.
// 256 KiB holds over 200 of them; a full queue drops, as a full socket
// buffer would. The queue takes memory only while it holds datagrams.
const dtlsQueueBytes = 256 << 10

// feed is the net.PacketConn a session's DTLS connection runs over: the
// read loop pushes the session's DTLS records into it, and its writes go
// to the session's client address on the shared socket.
type feed struct {
	s *Session
	// mu guards q, the datagrams not yet read, and qBytes, their bytes;
	// notify (capacity 1) wakes the reader after a push.
	mu     sync.Mutex
	q      [][]byte
	qBytes int
	notify chan struct{}
	done   chan struct{}
	once   sync.Once
	rdline *deadline.Deadline
	// ready is closed when the handshake has ended (handshaken). Until
	// then application data waits here: pion/dtls keeps only one record
	// of early application data (its Finished may still be pending) and
	// drops the rest, which a peer that finished first and sent at once
	// (SCTP's first DATA chunks) would have to retransmit after its RTO,
	// a second later.
	ready     chan struct{}
	readyOnce sync.Once
	// held is the application data taken from q before the end of the
	// handshake, in arrival order, waiting for ready; the reader's alone.
	// The reader goes on past it, so that the handshake records behind it
	// (a retransmitted Finished, when the first was lost) still reach
	// DTLS: waiting at the head of the queue would hold them up for good.
	held [][]byte
}

// maxHeld bounds the application-data datagrams held for the end of the
// handshake: a window's worth of SCTP's first packets. More are dropped,
// as pion/dtls would drop them, and SCTP retransmits them.
const maxHeld = 64

// contentApplicationData is the DTLS record content type of application
// data (RFC 6347 §4.1, RFC 5246 §6.2.1).
const contentApplicationData = 23

func newFeed(s *Session) *feed {
	return &feed{s: s, notify: make(chan struct{}, 1), done: make(chan struct{}), rdline: deadline.New(), ready: make(chan struct{})}
}

// handshaken releases application data held for the end of the handshake.
func (f *feed) handshaken() { f.readyOnce.Do(func() { close(f.ready) }) }

// push queues a copy of b and reports whether it fit. Read loop only.
func (f *feed) push(b []byte) bool {
	select {
	case <-f.done:
		return true // closed: nothing reads, nothing to count
	default:
	}
	f.mu.Lock()
	if f.qBytes+len(b) > dtlsQueueBytes {
		f.mu.Unlock()
		return false
	}
	f.q = append(f.q, bytes.Clone(b))
	f.qBytes += len(b)
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default:
	}
	return true
}

// pop takes the oldest queued datagram, or returns nil.
func (f *feed) pop() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.q) == 0 {
		return nil
	}
	b := f.q[0]
	f.q[0] = nil
	f.q = f.q[1:]
	f.qBytes -= len(b)
	if len(f.q) == 0 {
		f.q = nil // let a burst's backing array go
	}
	return b
}

// ReadFrom returns the next queued datagram. Datagrams that start with
// application data before the end of the handshake are held and returned,
// in order, once it has ended; the handshake records that came after them
// are returned meanwhile.
func (f *feed) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		ready := f.isReady()
		if ready && len(f.held) > 0 {
			b := f.held[0]
			f.held[0] = nil
			f.held = f.held[1:]
			if len(f.held) == 0 {
				f.held = nil
			}
			return copy(p, b), f.remote(), nil
		}
		b := f.pop()
		if b == nil {
			var wake <-chan struct{} // the end of the handshake, when it releases held data
			if !ready && len(f.held) > 0 {
				wake = f.ready
			}
			select {
			case <-f.notify:
			case <-wake:
			case <-f.done:
				return 0, nil, net.ErrClosed
			case <-f.rdline.Done():
				return 0, nil, os.ErrDeadlineExceeded
			}
			continue
		}
		if b[0] == contentApplicationData && !ready {
			if len(f.held) < maxHeld {
				f.held = append(f.held, b)
			}
			continue
		}
		return copy(p, b), f.remote(), nil
	}
}

func (f *feed) isReady() bool {
	select {
	case <-f.ready:
		return true
	default:
		return false
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
