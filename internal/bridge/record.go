package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
)

// SubprotocolV2 is the WebSocket subprotocol of bridge version 2
// (docs/bridge.md §12): many sessions per WebSocket. A transceiver that
// speaks both offers it before Subprotocol; Serve selects it.
const SubprotocolV2 = "switchboard.bridge.v2"

// VersionV2 is the "version" of the v2 connection-level hello.
const VersionV2 = 2

// Record kinds: the byte after a v2 record's session index
// (docs/bridge.md §12.2).
const (
	// RecordBinary carries one v1 binary message (an audio frame, §5).
	RecordBinary byte = 0x01
	// RecordText carries one v1 text message (a JSON object, §4).
	RecordText byte = 0x02
	// RecordClose ends one session: a 2-byte big-endian close code (the
	// v1 WebSocket close codes, §7) then a UTF-8 reason of at most 123
	// bytes.
	RecordClose byte = 0x03
)

const (
	// MaxBatchSize is the largest v2 WebSocket message, in bytes, that a
	// bridge endpoint reads (a batch of records); larger ones close the
	// connection with 1009. Writers keep batches under 2 MiB.
	MaxBatchSize = 4 << 20
	// batchTarget: a sender waits for the writer rather than grow the
	// pending batch past this, unless the batch is empty, or the sender
	// has added nothing to it yet and its record is at most
	// SessionBatchShare: that one may grow it to batchLimit. One session's
	// large record (up to MaxMessageSize, a whole reply) thus cannot keep
	// the other sessions' frames out of the batch.
	batchTarget = 1 << 20
	// batchLimit is what a batch may reach with the records of sessions
	// that had nothing in it (see batchTarget); a batch is at most
	// batchLimit, or one record, whichever is larger: under 2 MiB.
	batchLimit = 2 << 20
	// SessionBatchShare bounds, in payload bytes, what one session may
	// add to one batch unless it has added nothing yet; beyond it the
	// session's send waits for the next batch, so one session sending a
	// burst (a whole PCM reply) cannot crowd the others out of a batch.
	SessionBatchShare = 64 << 10
	// SessionQueueLimit bounds, in payload bytes, the records received
	// for one session and not yet taken by its Recv (one record always
	// fits). A session whose reader falls further behind is ended with
	// CloseQueueFull, and the receiver counts DropQueueFull; the other
	// sessions on the connection are not held up.
	SessionQueueLimit = 4 << 20
	// ConnQueueLimit bounds, in bytes, the records received on one v2
	// connection and queued for its sessions' Recv (the queues
	// SessionQueueLimit bounds one by one; 128 sessions at 4 MiB would be
	// 512 MiB). Past it the session with the largest queue is ended with
	// CloseQueueFull, counted as DropQueueFull, until the connection is
	// under the limit again. Only sessions that have not ended count: an
	// ended session's queue, which can only shrink, leaves the count when
	// the session ends.
	ConnQueueLimit = 32 << 20
	// CloseQueueFull is the close code of a v2 session ended because its
	// receive queue passed SessionQueueLimit, or was the largest when the
	// connection's passed ConnQueueLimit.
	CloseQueueFull = 4003
)

// Record is one v2 record: a message of one session.
type Record struct {
	// Session is the session index, ≥ 1 (0 is the connection itself:
	// the hello). The transceiver assigns indexes in increasing order and
	// never reuses one on a connection.
	Session uint64
	// Kind is RecordBinary, RecordText, RecordClose or a later kind.
	Kind byte
	// Payload aliases the batch it was parsed from.
	Payload []byte
}

// ErrRecord reports a record that cannot be parsed: a truncated or
// overlong varint, or a length past the end of the batch or above
// MaxMessageSize. The rest of its batch cannot be framed and is dropped.
var ErrRecord = fmt.Errorf("%w: malformed v2 record", ErrProtocol)

// AppendRecord appends one record to dst (docs/bridge.md §12.2):
//
//	uvarint session | kind (1 byte) | uvarint len(payload) | payload
//
// The varints are unsigned LEB128 as in encoding/binary (Protocol
// Buffers' varint). It does not allocate when dst has room.
func AppendRecord(dst []byte, session uint64, kind byte, payload []byte) []byte {
	dst = binary.AppendUvarint(dst, session)
	dst = append(dst, kind)
	dst = binary.AppendUvarint(dst, uint64(len(payload)))
	return append(dst, payload...)
}

// ParseRecord parses the record at the start of b and returns it and the
// bytes after it. Errors wrap ErrRecord. It never panics and does not
// allocate; the record's Payload aliases b.
func ParseRecord(b []byte) (Record, []byte, error) {
	id, n := binary.Uvarint(b)
	if n <= 0 {
		return Record{}, nil, fmt.Errorf("%w: session index", ErrRecord)
	}
	b = b[n:]
	if len(b) == 0 {
		return Record{}, nil, fmt.Errorf("%w: no kind", ErrRecord)
	}
	kind := b[0]
	b = b[1:]
	l, n := binary.Uvarint(b)
	if n <= 0 {
		return Record{}, nil, fmt.Errorf("%w: length", ErrRecord)
	}
	b = b[n:]
	if l > MaxMessageSize || l > uint64(len(b)) {
		return Record{}, nil, fmt.Errorf("%w: length %d, %d bytes left", ErrRecord, l, len(b))
	}
	return Record{Session: id, Kind: kind, Payload: b[:l:l]}, b[l:], nil
}

// appendClosePayload appends a RecordClose payload: code, then reason
// cut to 123 bytes on a rune boundary.
func appendClosePayload(dst []byte, code uint16, reason string) []byte {
	reason = truncReason(reason)
	dst = binary.BigEndian.AppendUint16(dst, code)
	return append(dst, reason...)
}

// parseClosePayload reads a RecordClose payload; a payload shorter than
// the code reads as 1005 (no status, RFC 6455 §7.1.5). The reason, from
// the network, is cut to 123 bytes and invalid UTF-8 in it replaced with
// U+FFFD (docs/bridge.md §12.3), since it ends up in CloseError and logs.
func parseClosePayload(p []byte) (uint16, string) {
	if len(p) < 2 {
		return 1005, ""
	}
	reason := p[2:]
	if len(reason) > maxCloseReason {
		reason = reason[:maxCloseReason]
	}
	return binary.BigEndian.Uint16(p), truncReason(strings.ToValidUTF8(string(reason), "\uFFFD"))
}

// DropReason is why a v2 endpoint dropped something it received. Its
// String is the reason label of drop counters; the zero value is no drop.
type DropReason uint8

// Drop reasons, counted in MuxStats.
const (
	// DropMalformed: a record that does not parse (ErrRecord); the rest
	// of its batch is dropped with it (counted once).
	DropMalformed DropReason = iota + 1
	// DropUnknownKind: a record kind this version does not know
	// (ignored, for forward compatibility).
	DropUnknownKind
	// DropUnknownSession: a record for a session index never opened, or
	// for index 0 after the hello.
	DropUnknownSession
	// DropClosedSession: a record for a session already ended (normal
	// when both sides end a session at once).
	DropClosedSession
	// DropQueueFull: a record that would pass its session's
	// SessionQueueLimit; the session is ended with CloseQueueFull.
	DropQueueFull
	// DropTextMessage: a WebSocket text message (v2 sends only binary
	// batches).
	DropTextMessage
	// NumDropReasons is one more than the largest DropReason.
	NumDropReasons
)

var dropNames = [NumDropReasons]string{
	0:                  "none",
	DropMalformed:      "malformed",
	DropUnknownKind:    "unknown_kind",
	DropUnknownSession: "unknown_session",
	DropClosedSession:  "closed_session",
	DropQueueFull:      "queue_full",
	DropTextMessage:    "text_message",
}

// String returns the reason's name, e.g. "malformed", as used for the
// "reason" label of drop counters.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

// DropReasons lists every DropReason, for creating counters up front.
func DropReasons() []DropReason {
	r := make([]DropReason, 0, NumDropReasons-1)
	for i := DropReason(1); i < NumDropReasons; i++ {
		r = append(r, i)
	}
	return r
}

// MuxStats counts what v2 connections did, and the timeouts of v1
// connections opened with the same Pool or AcceptOptions. The zero value
// is ready; methods are safe for concurrent use.
type MuxStats struct {
	drops         [NumDropReasons]atomic.Uint64
	batches       atomic.Uint64
	records       atomic.Uint64
	writeTimeouts atomic.Uint64
	pongTimeouts  atomic.Uint64
	setupFailures atomic.Uint64
}

// Drops returns how many received items were dropped for reason r.
func (s *MuxStats) Drops(r DropReason) uint64 {
	if r >= NumDropReasons {
		return 0
	}
	return s.drops[r].Load()
}

// Batches returns how many WebSocket messages (batches) were written;
// each is one write to the connection, usually one syscall.
func (s *MuxStats) Batches() uint64 { return s.batches.Load() }

// Records returns how many records were written in those batches,
// session close records included.
func (s *MuxStats) Records() uint64 { return s.records.Load() }

// WriteTimeouts returns how many connections, v1 or v2, failed because a
// write did not complete within the write timeout (the peer stopped
// reading; docs/bridge.md §12.5). A v2 one ended all its sessions, a v1
// one its session.
func (s *MuxStats) WriteTimeouts() uint64 { return s.writeTimeouts.Load() }

// PongTimeouts returns how many connections, v1 or v2, failed because a
// keepalive ping got no pong within the keepalive period (a half-open
// connection; docs/bridge.md §12.5).
func (s *MuxStats) PongTimeouts() uint64 { return s.pongTimeouts.Load() }

// SetupFailures returns how many v2 sessions a backend's Serve ended
// during their setup (bad or missing hello or session.start, version or
// format mismatch, handshake timeout; docs/bridge.md §12.3). Serve passes
// only the first of each connection to AcceptOptions.HandshakeError.
func (s *MuxStats) SetupFailures() uint64 { return s.setupFailures.Load() }

func (s *MuxStats) drop(r DropReason) { s.drops[r].Add(1) }

var errSessionClosed = errors.New("bridge: v2 session closed")

// errWriteTimeout: a write did not complete within the write timeout;
// the connection was closed.
var errWriteTimeout = errors.New("bridge: write timeout")
