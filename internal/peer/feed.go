package peer

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
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

	rtx pacing // the handshake's retransmissions (pacing)
	// rekeyed: a DTLS 1.3 record in epoch 4 was written (lastFlight).
	rekeyed atomic.Bool

	// The first flight (resendFirst). heard is set by the read loop once
	// any DTLS from the client has come; fmu guards the rest: first, the
	// datagrams written before that (the ClientHello, when the session is
	// the DTLS client), firstKeys the handshake fragment each starts
	// with, and resends, how many times they were sent again.
	heard       atomic.Bool
	resendDelay time.Duration // resendDelay; tests change it (export_test.go)
	fmu         sync.Mutex
	first       [][]byte
	firstKeys   []uint64
	resends     int
}

// Retransmission pacing.
//
// The handshake library retransmits a flight when its timer, set to the
// session's retransmission timeout (flightInterval), expires, and, with
// its backoff off, every timeout after that; pacing decides which of those
// go. A burst of writes (those within a quarter of the timeout of its
// first: the library's ticks come a timeout apart) after the client's DTLS
// has come is a new flight and goes; a burst with no DTLS from the client
// since the last one is a retransmission, which goes only once the gap
// since the last one has passed: the timeout, then twice it, and twice it
// again at most (maxRetransmitGap), never more than maxRetransmits times
// per flight. RFC 6347 §4.2.4.1 doubles up to 60 s; a voice call that
// loses a third of its datagrams then waits seconds for its setup, so the
// gaps stop growing at twice the timeout (docs/benchmarks.md, "Under
// loss") and the count bounds what a client that went away is sent: 16
// copies of a flight of a few kilobytes.

// maxRetransmits bounds the retransmissions of one flight (pacing).
const maxRetransmits = 16

// pacing holds back the handshake library's retransmissions beyond the
// schedule above. Its zero value lets everything go (no timeout set).
type pacing struct {
	mu         sync.Mutex
	timeout    time.Duration // the library's interval; 0: no pacing
	heardSince bool          // DTLS came from the client since the last burst
	bursts     int           // bursts written so far
	burstAt    time.Time     // the current burst's first write
	drop       bool          // the current burst is held back
	n          int           // retransmissions of the current flight let go
	gap        time.Duration // the gap before the next may go
	last       time.Time     // when the last burst that went left
}

// start sets the library's retransmission interval, before the handshake.
func (p *pacing) start(timeout time.Duration) {
	p.mu.Lock()
	p.timeout = timeout
	p.mu.Unlock()
}

// heard notes DTLS from the client (the read loop, during the handshake).
func (p *pacing) heard() {
	p.mu.Lock()
	p.heardSince = true
	p.mu.Unlock()
}

// suppress reports whether a write at now is part of a retransmission
// that is held back.
func (p *pacing) suppress(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timeout <= 0 {
		return false
	}
	if p.bursts > 0 && now.Sub(p.burstAt) <= p.timeout/4 {
		return p.drop // the rest of the burst shares its fate
	}
	p.burstAt = now
	p.bursts++
	if p.bursts == 1 || p.heardSince {
		// A new flight.
		p.heardSince, p.drop, p.n, p.gap, p.last = false, false, 0, p.timeout, now
		return false
	}
	// The library's timer: a retransmission. A tick comes every timeout;
	// one that is a little early for the gap (timer slack) still counts.
	if p.n == maxRetransmits || now.Sub(p.last) < p.gap-p.timeout/4 {
		p.drop = true
		return true
	}
	p.n++
	p.last, p.drop = now, false
	p.gap = min(2*p.gap, maxRetransmitGap(p.timeout))
	return false
}

// maxRetransmitGap is the longest gap between two retransmissions of a
// flight: twice the timeout.
func maxRetransmitGap(timeout time.Duration) time.Duration { return 2 * timeout }

// The DTLS 1.3 client's last flight.
//
// A DTLS 1.3 client's handshake is complete once it has sent its last
// flight (Certificate to Finished), but it sends that flight again until
// the server acknowledges it (RFC 9147 §5.8.3, §7), for as long as the
// connection lives: with the library's backoff off, every timeout to a
// server that went away. Those records are in the handshake epoch, 2 (RFC
// 9147 §6.1; the unified header's low two bits, §4), as little else after
// the handshake is (a server's ACK of a client flight sent again), and the
// pacing holds every such record to the same schedule and bound as any
// flight. The read loop does not tell the pacing about the server's DTLS
// after the handshake (its application data would restart the schedule), so
// a server that lost the flight and sends its own again gets it on that
// schedule too. Application data in epoch 6 (three key updates later) has
// the same two bits; epoch 4 (EE 00) comes first, and from then on nothing
// is paced.

// lastFlight reports whether p, written after the handshake, is a
// retransmission of the DTLS 1.3 client's last flight: a record with a
// unified header (first bits 001) in epoch 2 (low bits 10), before any
// in epoch 4. WriteTo.
func (f *feed) lastFlight(p []byte) bool {
	if len(p) == 0 || p[0]&0xe0 != 0x20 || f.rekeyed.Load() {
		return false
	}
	switch p[0] & 0x03 {
	case 0:
		f.rekeyed.Store(true) // epoch 4: a key update
	case 2:
		return true
	}
	return false
}

// The first flight.
//
// The DTLS client's first flight, its ClientHello, leaves right after the
// answer to the session's first authenticated check. A client that drops
// DTLS arriving before its ICE layer has taken that answer (Firefox), or a
// lost datagram, would leave it to the DTLS retransmission timer. So, until
// the client has sent any DTLS, each later fresh check from the selected
// address (Chromium nominates on its next check, tens of milliseconds
// later; Pion's consent checks follow) sends the same datagrams again, byte
// for byte, unless the client's DTLS comes within resendDelay: a client that had them drops the copy as a replay (RFC 6347
// §4.1.2.6), and nothing the handshake library keeps changes. maxResends
// bounds the copies, so a client, or whoever replays its checks from its
// address, gets at most that many more datagrams of the session's first
// flight; a replayed check (a recent transaction ID) earns none.

// maxResends bounds the re-sends of the first flight.
const maxResends = 3

// maxFirst bounds the datagrams of the first flight kept: a ClientHello
// with a post-quantum key share spans two at the usual MTU.
const maxFirst = 4

// handshakeFragment is the handshake header (RFC 6347 §4.2.2, RFC 9147
// §5.2) of a plaintext DTLS handshake record.
type handshakeFragment struct {
	typ             uint8 // msg_type: 1 ClientHello, 2 ServerHello, ...
	epoch           uint16
	length          int // of the whole message
	seq             int // message_seq
	offset, fragLen int // fragment_offset, fragment_length
}

// firstFragment reads the handshake header of b's first record, if that
// is a plaintext DTLS handshake record (RFC 6347 §4.1: content type 22;
// the 12-byte handshake header follows the 13-byte record header).
func firstFragment(b []byte) (handshakeFragment, bool) {
	if len(b) < 13+12 || b[0] != 22 {
		return handshakeFragment{}, false
	}
	h := b[13:]
	u24 := func(p []byte) int { return int(p[0])<<16 | int(p[1])<<8 | int(p[2]) }
	return handshakeFragment{typ: h[0], epoch: uint16(b[3])<<8 | uint16(b[4]), length: u24(h[1:]),
		seq: int(h[4])<<8 | int(h[5]), offset: u24(h[6:]), fragLen: u24(h[9:])}, true
}

// firstKey names the handshake fragment a datagram starts with, if it is
// a plaintext handshake record of epoch 0 (firstFragment), by its type,
// message_seq and fragment_offset, so that the handshake library's own
// retransmissions of a fragment already kept are told apart.
func firstKey(b []byte) (uint64, bool) {
	f, ok := firstFragment(b)
	if !ok || f.epoch != 0 {
		return 0, false
	}
	return uint64(f.typ)<<48 | uint64(f.seq)<<24 | uint64(f.offset), true
}

// keepFirst keeps b as part of the first flight if no DTLS has come from
// the client yet. The handshake's goroutine (WriteTo).
func (f *feed) keepFirst(b []byte) {
	if f.heard.Load() {
		return
	}
	k, ok := firstKey(b)
	if !ok {
		return
	}
	f.fmu.Lock()
	defer f.fmu.Unlock()
	if len(f.first) == maxFirst || slices.Contains(f.firstKeys, k) {
		return
	}
	f.first = append(f.first, bytes.Clone(b))
	f.firstKeys = append(f.firstKeys, k)
}

// resendFirst sends the first flight to addr again, resendDelay from now,
// if no DTLS has come from the client by then and it has been sent again
// fewer than maxResends times. The read loop, after answering a fresh
// check from the selected address.
//
// The wait: a client that took the first flight answers it with its own
// while it goes on checking, and its answer often comes right behind a
// check (Firefox checks again as its first check succeeds, and its
// ServerHello follows that check within microseconds); a copy sent at once
// would be answered by the client with its flight again (a repeated
// ClientHello asks for that), a datagram of about 700 bytes each way for
// nothing.
func (f *feed) resendFirst(addr netip.AddrPort) {
	if f.heard.Load() {
		return
	}
	f.fmu.Lock()
	if len(f.first) == 0 || f.resends == maxResends {
		f.fmu.Unlock()
		return
	}
	f.resends++
	again := f.first // never changed in place: keepFirst appends, forgetFirst drops
	f.fmu.Unlock()
	send := func() {
		if f.heard.Load() || f.isClosed() {
			return
		}
		for _, b := range again {
			_, _ = f.s.e.conn.WriteToAddrPort(b, addr)
		}
	}
	if f.resendDelay <= 0 {
		send()
		return
	}
	time.AfterFunc(f.resendDelay, send)
}

// resendDelay is how long resendFirst waits for the client's DTLS before
// it sends the first flight again: more than a client takes between two
// datagrams it sends together, under a packet time.
const resendDelay = 10 * time.Millisecond

func (f *feed) isClosed() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// forgetFirst lets the first flight go, once the handshake has ended.
func (f *feed) forgetFirst() {
	f.fmu.Lock()
	f.first, f.firstKeys = nil, nil
	f.fmu.Unlock()
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

// handshaken releases application data held for the end of the handshake,
// and the first flight.
func (f *feed) handshaken() {
	f.readyOnce.Do(func() { close(f.ready) })
	f.forgetFirst()
	if sp := f.s.sped; sp != nil {
		sp.handshaken()
	}
}

// push queues a copy of b, a DTLS datagram from the client, and reports
// whether it fit. Read loop only.
func (f *feed) push(b []byte) bool {
	if sp := f.s.sped; sp != nil {
		sp.received(b)
	}
	return f.enqueue(b)
}

// enqueue is push without telling SPED (sped.onCheck, which has). Read
// loop only.
func (f *feed) enqueue(b []byte) bool {
	select {
	case <-f.done:
		return true // closed: nothing reads, nothing to count
	default:
	}
	if !f.heard.Load() {
		f.heard.Store(true)
	}
	if !f.isReady() {
		f.rtx.heard()
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
	f.keepFirst(p)
	if !f.isReady() {
		if f.rtx.suppress(time.Now()) {
			return len(p), nil // a retransmission the pacing holds back
		}
		if sp := f.s.sped; sp != nil && sp.written(f.s, p) {
			return len(p), nil // in a Binding response (sped.go)
		}
	} else if f.lastFlight(p) && f.rtx.suppress(time.Now()) {
		return len(p), nil // the DTLS 1.3 client's last flight again, held back
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
