package bridge

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// muxConn is one v2 WebSocket carrying many sessions (docs/bridge.md
// §12). A read loop demultiplexes records into per-session queues; a
// write loop sends, each time it runs, everything the sessions queued
// since its last write as one WebSocket message (group commit: no timer,
// so no added delay; under load one write carries many frames).
type muxConn struct {
	// Set once, never mutated.
	ws       *websocket.Conn
	client   bool      // transceiver side: assigns session indexes
	stats    *MuxStats // never nil
	wake     chan struct{}
	done     chan struct{} // closed by fail: the connection is over
	onStream func(*stream) // server: a session opened (called by the read loop)
	onGone   func()        // a session left the table (pool accounting); may be nil
	onFail   func()        // the connection failed or drained; may be nil
	// writeTimeout bounds each batch write; on expiry the connection
	// fails. keepAlive is the idle period after which it is pinged (and
	// the time the pong has to come back).
	writeTimeout, keepAlive time.Duration

	// writeStart is when the batch write in flight started (UnixNano), 0
	// when none is: Pool.pick skips a connection whose write is stuck.
	writeStart atomic.Int64
	// queued is the bytes in every session's receive queue (stream.in),
	// bounded by ConnQueueLimit.
	queued atomic.Int64
	// rx is set by the read loop on each message: the pinger pings only
	// a connection that received nothing for a whole keepAlive period.
	rx atomic.Bool

	smu      sync.Mutex
	sessions map[uint64]*stream // guarded by smu
	// unnumbered: client sessions opened that have sent nothing yet, so
	// have no index (see stream.write); guarded by smu.
	unnumbered map[*stream]struct{}
	maxID      uint64 // highest index assigned (client) or seen (server); guarded by smu

	// mu guards the following and every stream's closed, gen and pending.
	mu       sync.Mutex
	batch    []byte        // records waiting for the write loop
	spare    []byte        // the last written batch, reused
	gen      uint64        // batches taken by the write loop
	flushed  chan struct{} // closed when the write loop takes the batch, if waiting
	waiting  bool          // a sender waits on flushed
	err      error         // why the connection is over; set by fail
	draining bool          // write what is queued, then close with 1000

	failOnce sync.Once
	wg       sync.WaitGroup // the write loop, the watchdog and the pinger
}

// DefaultWriteTimeout is PoolOptions.WriteTimeout's default: a
// connection whose write (a v2 batch, a v1 message) has not completed
// within 5 s fails, with all its sessions (their sends and Recv return
// ErrClosed), instead of holding them until the kernel gives up on the
// TCP stream (~15 min).
const DefaultWriteTimeout = 5 * time.Second

// DefaultKeepAlive is PoolOptions.KeepAlive's default: a connection (v1
// or v2) that received nothing for 15 s is sent a WebSocket ping (RFC 6455
// §5.5.2), and fails when the pong does not come back within another
// 15 s: a half-open connection (backend host gone without a RST) is found
// without traffic.
const DefaultKeepAlive = 15 * time.Second

// maxStuckWrite is how long a batch write may be in flight before
// Pool.pick stops giving the connection new sessions (a quarter of the
// write timeout when that is shorter).
const maxStuckWrite = time.Second

func newMuxConn(ws *websocket.Conn, client bool, stats *MuxStats, writeTimeout, keepAlive time.Duration) *muxConn {
	if stats == nil {
		stats = new(MuxStats)
	}
	if writeTimeout <= 0 {
		writeTimeout = DefaultWriteTimeout
	}
	if keepAlive <= 0 {
		keepAlive = DefaultKeepAlive
	}
	ws.SetReadLimit(MaxBatchSize)
	return &muxConn{
		ws: ws, client: client, stats: stats, writeTimeout: writeTimeout, keepAlive: keepAlive,
		wake: make(chan struct{}, 1), done: make(chan struct{}), flushed: make(chan struct{}),
		sessions: make(map[uint64]*stream), unnumbered: make(map[*stream]struct{}),
		batch: make([]byte, 0, 16<<10), spare: make([]byte, 0, 16<<10),
	}
}

// connHello is the v2 connection-level hello (session index 0), both
// ways.
type connHello struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
}

var helloV2 = func() []byte {
	b, _ := json.Marshal(connHello{Type: typeHello, Version: VersionV2})
	return AppendRecord(nil, 0, RecordText, b)
}()

// helloExchange sends the connection hello (client first) and checks the
// peer's. On error the WebSocket is closed (4001, or 1002 when malformed).
func (m *muxConn) helloExchange(ctx context.Context) error {
	if m.client {
		if err := m.ws.Write(ctx, websocket.MessageBinary, helloV2); err != nil {
			_ = m.ws.CloseNow()
			return closedErr(ctx, err)
		}
	}
	typ, b, err := m.ws.Read(ctx)
	if err != nil {
		_ = m.ws.CloseNow()
		return closedErr(ctx, err)
	}
	protoErr := func(what string) error {
		err := fmt.Errorf("%w: v2 connection hello: %s", ErrProtocol, what)
		_ = m.ws.Close(websocket.StatusProtocolError, truncReason(err.Error()))
		return err
	}
	if typ != websocket.MessageBinary {
		return protoErr("text message")
	}
	r, _, err := ParseRecord(b)
	if err != nil || r.Session != 0 || r.Kind != RecordText {
		return protoErr("want a text record for session 0")
	}
	var h connHello
	if err := json.Unmarshal(r.Payload, &h); err != nil || h.Type != typeHello {
		return protoErr("want hello")
	}
	if h.Version != VersionV2 {
		err := fmt.Errorf("%w: v2 connection hello version %d, want %d", ErrVersion, h.Version, VersionV2)
		_ = m.ws.Close(CloseVersion, truncReason(err.Error()))
		return err
	}
	if !m.client {
		if err := m.ws.Write(ctx, websocket.MessageBinary, helloV2); err != nil {
			_ = m.ws.CloseNow()
			return closedErr(ctx, err)
		}
	}
	return nil
}

// start runs the write loop, its watchdog and the pinger; the caller
// runs readLoop.
func (m *muxConn) start() {
	m.wg.Add(3)
	go func() {
		defer m.wg.Done()
		m.writeLoop()
	}()
	go func() {
		defer m.wg.Done()
		m.watchdog()
	}()
	go func() {
		defer m.wg.Done()
		m.pinger()
	}()
}

// watchdog fails the connection when a batch write has been in flight
// for longer than writeTimeout (failing closes the socket, which ends the
// write). A timer of its own rather than a deadline context per write:
// the write path allocates nothing.
func (m *muxConn) watchdog() {
	t := time.NewTicker(m.writeTimeout / 4)
	defer t.Stop()
	for {
		select {
		case now := <-t.C:
			if start := m.writeStart.Load(); start != 0 && now.Sub(time.Unix(0, start)) > m.writeTimeout {
				m.failCounted(fmt.Errorf("%w: %w: batch write not done within %v", errSessionClosed, errWriteTimeout, m.writeTimeout), &m.stats.writeTimeouts)
				return
			}
		case <-m.done:
			return
		}
	}
}

// pinger pings the peer when nothing was received for keepAlive, and
// fails the connection when the pong does not come back within
// keepAlive. The read loop reads the pong (the library's Ping waits for
// it); a ping waits behind a batch write in flight, so a stuck write
// fails it too.
func (m *muxConn) pinger() {
	t := time.NewTicker(m.keepAlive)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-m.done:
			return
		}
		if m.rx.Swap(false) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), m.keepAlive)
		err := m.ws.Ping(ctx)
		expired := ctx.Err() != nil
		cancel()
		if err != nil {
			err = fmt.Errorf("%w: keepalive: no pong within %v: %w", errSessionClosed, m.keepAlive, err)
			if expired {
				m.failCounted(err, &m.stats.pongTimeouts)
			} else {
				m.fail(err)
			}
			return
		}
	}
}

// stuck reports whether a batch write has been in flight for longer than
// maxStuckWrite (or a quarter of the write timeout).
func (m *muxConn) stuck(now time.Time) bool {
	start := m.writeStart.Load()
	if start == 0 {
		return false
	}
	return now.Sub(time.Unix(0, start)) > min(maxStuckWrite, m.writeTimeout/4)
}

func (m *muxConn) readLoop() {
	var buf []byte
	for {
		typ, r, err := m.ws.Reader(context.Background())
		if err != nil {
			m.fail(err)
			return
		}
		if buf, err = readAll(r, buf[:0]); err != nil {
			m.fail(err)
			return
		}
		m.rx.Store(true)
		if typ != websocket.MessageBinary {
			m.stats.drop(DropTextMessage)
			continue
		}
		m.dispatchBatch(buf)
	}
}

// dispatchBatch hands each record of one batch to its session.
func (m *muxConn) dispatchBatch(b []byte) {
	for len(b) > 0 {
		r, rest, err := ParseRecord(b)
		if err != nil {
			m.stats.drop(DropMalformed)
			return
		}
		b = rest
		m.dispatch(r)
	}
}

func (m *muxConn) dispatch(r Record) {
	switch r.Kind {
	case RecordBinary, RecordText, RecordClose:
	default:
		m.stats.drop(DropUnknownKind)
		return
	}
	if r.Session == 0 {
		m.stats.drop(DropUnknownSession)
		return
	}
	m.smu.Lock()
	s := m.sessions[r.Session]
	if s == nil {
		if !m.client && r.Session > m.maxID && r.Kind != RecordClose && m.onStream != nil {
			// A new session from the transceiver (its hello).
			m.maxID = r.Session
			s = newStream(m, r.Session)
			m.sessions[r.Session] = s
			m.smu.Unlock()
			s.push(r)
			m.onStream(s)
			return
		}
		seen := r.Session <= m.maxID
		m.smu.Unlock()
		switch {
		case seen && r.Kind == RecordClose:
			// The peer's close crossing ours: nothing to do.
		case seen:
			m.stats.drop(DropClosedSession)
		default:
			m.stats.drop(DropUnknownSession)
		}
		return
	}
	m.smu.Unlock()
	if r.Kind == RecordClose {
		code, reason := parseClosePayload(r.Payload)
		s.ended(websocket.CloseError{Code: websocket.StatusCode(code), Reason: reason})
		return
	}
	s.push(r)
}

// open registers a new session (client side); nil when the connection is
// over. The session gets its index with its first record (number), so
// that indexes reach the peer in increasing order however the sessions'
// first sends interleave.
func (m *muxConn) open() *stream {
	m.mu.Lock()
	failed := m.err != nil || m.draining
	m.mu.Unlock()
	if failed {
		return nil
	}
	s := newStream(m, 0)
	m.smu.Lock()
	m.unnumbered[s] = struct{}{}
	m.smu.Unlock()
	return s
}

// number gives a client session the next index, as its first record is
// queued; m.mu is held, so records carry increasing new indexes.
func (m *muxConn) number(s *stream) {
	m.smu.Lock()
	m.maxID++
	s.id = m.maxID
	delete(m.unnumbered, s)
	m.sessions[s.id] = s
	m.smu.Unlock()
}

func (m *muxConn) kick() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

func (m *muxConn) writeLoop() {
	for {
		select {
		case <-m.wake:
		case <-m.done:
			return
		}
		// Let the goroutines that are already runnable (sessions woken
		// by the same burst of packets) queue their records first: a
		// yield, not a timer, so an idle connection adds no delay (on
		// an idle scheduler Gosched returns at once: a no-op). The
		// batching figures in docs/benchmarks.md (bridge v2) depend on
		// it.
		runtime.Gosched()
		m.mu.Lock()
		b := m.batch
		m.batch, m.spare = m.spare[:0], nil
		m.gen++
		if m.waiting {
			close(m.flushed)
			m.flushed, m.waiting = make(chan struct{}), false
		}
		m.mu.Unlock()
		if len(b) > 0 {
			// A batch not written within writeTimeout fails the
			// connection (watchdog), so that a backend that stopped
			// reading ends its sessions promptly rather than holding
			// their senders.
			m.writeStart.Store(time.Now().UnixNano())
			err := m.ws.Write(context.Background(), websocket.MessageBinary, b)
			m.writeStart.Store(0)
			if err != nil {
				m.fail(fmt.Errorf("%w: batch write: %w", errSessionClosed, err))
				return
			}
			m.stats.batches.Add(1)
		}
		m.mu.Lock()
		m.spare = b[:0]
		drained := m.draining && len(m.batch) == 0
		m.mu.Unlock()
		if drained {
			_ = m.ws.Close(websocket.StatusNormalClosure, "")
			m.fail(fmt.Errorf("%w: drained", errSessionClosed))
			return
		}
	}
}

// drain writes what is queued, then closes the WebSocket with 1000.
func (m *muxConn) drain() {
	m.mu.Lock()
	m.draining = true
	m.mu.Unlock()
	m.kick()
}

// fail ends the connection and every session on it with err (their Recv
// returns it, wrapped in ErrClosed, after what was already queued). It
// reports whether this call ended the connection (false when it was over
// already).
//
// onFail runs before the sessions learn of the end: once a session's Recv
// returns the error, its pool no longer counts the connection nor offers
// it to a Dial (which would find it failed, and pick it again until
// onFail ran).
func (m *muxConn) fail(err error) (first bool) { return m.failCounted(err, nil) }

// failCounted is fail that, when this call ends the connection, first
// adds one to count (when not nil): whoever sees a session end can read
// the count that says why.
func (m *muxConn) failCounted(err error, count *atomic.Uint64) (first bool) {
	m.failOnce.Do(func() {
		first = true
		if count != nil {
			count.Add(1)
		}
		m.mu.Lock()
		m.err = err
		m.mu.Unlock()
		close(m.done)
		_ = m.ws.CloseNow()
		if m.onFail != nil {
			m.onFail()
		}
		m.smu.Lock()
		ss := make([]*stream, 0, len(m.sessions)+len(m.unnumbered))
		for _, s := range m.sessions {
			ss = append(ss, s)
		}
		for s := range m.unnumbered {
			ss = append(ss, s)
		}
		m.smu.Unlock()
		for _, s := range ss {
			s.ended(err)
		}
	})
	return first
}

// wait waits for the write loop.
func (m *muxConn) wait() { m.wg.Wait() }

// stream is one session of a muxConn: the transport under its core.
type stream struct {
	// Set once, never mutated.
	m     *muxConn
	ready chan struct{} // capacity 1: a push or the end happened
	// done is closed, under m.mu, when closed turns true: it wakes a
	// write of this session waiting for room in the batch (End and Close
	// must not wait for a backend that does not read).
	done chan struct{}
	// id is the session index: set at creation on the server side, and by
	// number under m.mu with the first record on the client side (0
	// until then).
	id uint64

	// Guarded by m.mu.
	closed  bool   // no more records may be sent for this session
	gen     uint64 // the batch generation pending counts for
	pending int    // payload bytes this session added to batch gen

	qmu  sync.Mutex
	in   []byte // guarded by qmu: received records, each kind (1) | length (4, LE) | payload
	qerr error  // guarded by qmu: why the session ended; read returns it once drained
	// unbudgeted: the session has ended, so in no longer counts in
	// m.queued (unbudget); guarded by qmu.
	unbudgeted bool

	dead atomic.Bool // ended locally: read fails at once
	out  []byte      // only the reader: the records being read
	off  int         // only the reader: read position in out
}

func newStream(m *muxConn, id uint64) *stream {
	return &stream{m: m, id: id, ready: make(chan struct{}, 1), done: make(chan struct{})}
}

func (s *stream) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// push queues one received record, or ends the session if its queue is
// full.
func (s *stream) push(r Record) {
	s.qmu.Lock()
	if s.qerr != nil || s.unbudgeted {
		s.qmu.Unlock()
		s.m.stats.drop(DropClosedSession)
		return
	}
	if len(s.in) > 0 && len(s.in)+len(r.Payload) > SessionQueueLimit {
		s.qmu.Unlock()
		s.m.stats.drop(DropQueueFull)
		_ = s.finish(CloseQueueFull, "bridge v2: session receive queue full",
			fmt.Errorf("%w: receive queue passed %d bytes", errSessionClosed, SessionQueueLimit))
		return
	}
	before := len(s.in)
	s.in = append(s.in, r.Kind)
	s.in = binary.LittleEndian.AppendUint32(s.in, uint32(len(r.Payload)))
	s.in = append(s.in, r.Payload...)
	total := s.m.queued.Add(int64(len(s.in) - before))
	s.qmu.Unlock()
	s.signal()
	if total > ConnQueueLimit {
		s.m.shed()
	}
}

// shed ends the sessions with the largest receive queues, with
// CloseQueueFull, until the connection's queued bytes are within
// ConnQueueLimit. Only the read loop calls it.
func (m *muxConn) shed() {
	for m.queued.Load() > ConnQueueLimit {
		m.smu.Lock()
		ss := make([]*stream, 0, len(m.sessions))
		for _, s := range m.sessions {
			ss = append(ss, s)
		}
		m.smu.Unlock()
		var big *stream
		most := 0
		for _, s := range ss {
			s.qmu.Lock()
			n := len(s.in)
			s.qmu.Unlock()
			if n > most {
				big, most = s, n
			}
		}
		if big == nil {
			return // what is queued belongs to sessions already ending
		}
		m.stats.drop(DropQueueFull)
		_ = big.finish(CloseQueueFull, "bridge v2: connection receive budget exceeded",
			fmt.Errorf("%w: connection receive queues passed %d bytes", errSessionClosed, ConnQueueLimit))
	}
}

func (s *stream) read(ctx context.Context) (websocket.MessageType, []byte, error) {
	for {
		if s.dead.Load() {
			s.qmu.Lock()
			err := s.qerr
			s.qmu.Unlock()
			return 0, nil, err
		}
		if s.off < len(s.out) {
			kind := s.out[s.off]
			n := int(binary.LittleEndian.Uint32(s.out[s.off+1:]))
			p := s.out[s.off+5 : s.off+5+n]
			s.off += 5 + n
			if kind == RecordBinary {
				return websocket.MessageBinary, p, nil
			}
			return websocket.MessageText, p, nil
		}
		s.qmu.Lock()
		if len(s.in) > 0 {
			if !s.unbudgeted {
				s.m.queued.Add(-int64(len(s.in)))
			}
			s.in, s.out, s.off = s.out[:0], s.in, 0
			s.qmu.Unlock()
			continue
		}
		err := s.qerr
		s.qmu.Unlock()
		if err != nil {
			return 0, nil, err
		}
		select {
		case <-s.ready:
		case <-ctx.Done():
			_ = s.closeNow()
			return 0, nil, ctx.Err()
		}
	}
}

func (s *stream) write(ctx context.Context, typ websocket.MessageType, b []byte) error {
	kind := RecordText
	if typ == websocket.MessageBinary {
		kind = RecordBinary
	}
	m := s.m
	m.mu.Lock()
	for {
		if s.closed || m.err != nil {
			m.mu.Unlock()
			return s.endErr()
		}
		share := 0
		if s.gen == m.gen {
			share = s.pending
		}
		// A session's first record in a batch always fits until the
		// batch reaches batchLimit when small, so the quiet sessions'
		// frames get into every batch however large a flooding
		// session's records are.
		room := len(m.batch) == 0 || len(m.batch)+len(b) <= batchTarget ||
			share == 0 && len(b) <= SessionBatchShare && len(m.batch)+len(b) <= batchLimit
		if room && (share == 0 || share+len(b) <= SessionBatchShare) {
			break
		}
		m.waiting = true
		flushed := m.flushed
		m.mu.Unlock()
		select {
		case <-flushed:
		case <-m.done:
		case <-s.done: // the session ended: the loop returns endErr
		case <-ctx.Done():
			_ = s.closeNow()
			return ctx.Err()
		}
		m.mu.Lock()
	}
	if s.id == 0 {
		m.number(s)
	}
	if s.gen != m.gen {
		s.gen, s.pending = m.gen, 0
	}
	s.pending += len(b)
	m.batch = AppendRecord(m.batch, s.id, kind, b)
	m.mu.Unlock()
	m.stats.records.Add(1)
	m.kick()
	return nil
}

// endErr is what a send after the session's end returns.
func (s *stream) endErr() error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.qerr != nil {
		return s.qerr
	}
	return errSessionClosed
}

func (s *stream) close(code websocket.StatusCode, reason string) error {
	return s.finish(uint16(code), reason, errSessionClosed)
}

// closeNow ends the session with close code 1006: the peer sees it
// dropped, as a v1 peer sees a dropped connection.
func (s *stream) closeNow() error {
	return s.finish(uint16(websocket.StatusAbnormalClosure), "", errSessionClosed)
}

// finish ends the session from this side: it queues a RecordClose (the
// write loop sends it after the session's earlier records), fails later
// reads with err, and leaves the table.
func (s *stream) finish(code uint16, reason string, err error) error {
	m := s.m
	m.mu.Lock()
	if s.closed {
		// Ended by the peer or the connection (ended): what its reader
		// has not taken is dropped now.
		m.mu.Unlock()
		s.qmu.Lock()
		if s.qerr == nil { // ended is between its two locks
			s.qerr = err
		}
		s.unbudget()
		s.in = nil
		s.qmu.Unlock()
		s.dead.Store(true)
		s.signal()
		return nil
	}
	s.closed = true
	close(s.done)
	if m.err == nil && s.id != 0 {
		var p [2 + 123]byte
		m.batch = AppendRecord(m.batch, s.id, RecordClose, appendClosePayload(p[:0], code, reason))
		m.stats.records.Add(1)
	}
	m.mu.Unlock()
	m.kick()
	s.qmu.Lock()
	if s.qerr == nil {
		s.qerr = err
	}
	s.unbudget()
	s.in = nil
	s.qmu.Unlock()
	s.dead.Store(true)
	s.signal()
	s.leave()
	return nil
}

// ended ends the session because the peer closed it or the connection
// failed: reads return what was queued, then err. What is queued leaves
// the connection's budget (ConnQueueLimit) now: the session left the
// table, so shed could never end it to reclaim the bytes, and its queue
// can only shrink.
func (s *stream) ended(err error) {
	m := s.m
	m.mu.Lock()
	was := s.closed
	if !was {
		s.closed = true
		close(s.done)
	}
	m.mu.Unlock()
	s.qmu.Lock()
	if s.qerr == nil {
		s.qerr = err
	}
	s.unbudget()
	s.qmu.Unlock()
	s.signal()
	if !was {
		s.leave()
	}
}

// unbudget takes the session's queue out of the connection's queued
// bytes, once: the session has ended, so its queue grows no more. s.qmu
// is held.
func (s *stream) unbudget() {
	if !s.unbudgeted {
		s.unbudgeted = true
		s.m.queued.Add(-int64(len(s.in)))
	}
}

// leave removes the session from the table; it runs once per session,
// when closed turns true.
func (s *stream) leave() {
	m := s.m
	m.smu.Lock()
	if s.id != 0 {
		delete(m.sessions, s.id)
	}
	delete(m.unnumbered, s)
	m.smu.Unlock()
	if m.onGone != nil {
		m.onGone()
	}
}
