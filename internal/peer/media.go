package peer

import (
	"bytes"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/pion/rtcp"
	"github.com/pion/rtp"
)

// SRTP inline (RFC 3711).
//
// The read loop decrypts each SRTP packet into a buffer from a pool the
// whole process shares and queues it for the session's media reader
// (ReadRTP), which copies it out and returns the buffer: no buffer is
// held per session (but for the few datagrams that may come before the
// keys, earlyMax), and a reader that falls behind loses packets, counted
// (DropRTPQueueFull), rather than stalling the read loop every session
// shares. SRTCP is decrypted into the read loop's scratch buffer and handed
// to SessionConfig.OnRTCP there and then.
//
// Writes encrypt on the writer's goroutine into pooled buffers and go to
// the socket at once (a socket that batches RTP, internal/hop, copies them
// into its batch).

// srtpOverhead is the most SRTP adds to an RTP packet: the AEAD tag of
// the GCM profiles (RFC 7714 §7.2, 16 bytes; HMAC-SHA1-80 adds 10).
const srtpOverhead = 16

// bufSize is the size of pooled packet buffers: the longest datagram the
// path carries (internal/hop.MaxPayload) and SRTP's tag.
const bufSize = 1500 + 32

var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	*b = (*b)[:cap(*b)]
	bufPool.Put(b)
}

// isRTCP reports whether an RTP-range datagram (first byte 128–191) is
// RTCP: with rtcp-mux its second byte is an RTCP packet type, 192–223
// (RFC 5761 §4).
func isRTCP(b []byte) bool {
	return len(b) > 1 && b[1] >= 192 && b[1] <= 223
}

// earlyMax is how many SRTP and SRTCP datagrams a session keeps that came
// before its keys: the DTLS peer that completes the handshake first (the
// server, whose Finished ends it) may send media at once, while the last
// flight is still on its way to the other; 16 is 320 ms of 20 ms audio.
const earlyMax = 16

// handleSRTP decrypts one SRTP or SRTCP datagram from the client address
// from. Read loop.
func (s *Session) handleSRTP(rd *reader, b []byte, from netip.AddrPort) DropReason {
	k := s.keys.Load()
	if k == nil {
		s.emu.Lock()
		if k = s.keys.Load(); k == nil {
			// Kept for startSRTP, which decrypts them before it
			// publishes the keys.
			defer s.emu.Unlock()
			if len(s.early) == earlyMax {
				return DropSRTPNotReady
			}
			s.early = append(s.early, bytes.Clone(b))
			return dropNone
		}
		s.emu.Unlock()
	}
	return s.decrypt(&rd.dec, k, b, from)
}

// setKeys decrypts the datagrams that came before k, then publishes k to
// the read loop. The session's goroutine.
func (s *Session) setKeys(k *srtpKeys) {
	s.emu.Lock()
	defer s.emu.Unlock()
	var scratch decryptScratch
	for _, e := range s.early {
		// Their addresses are not kept: they confirm no move.
		if r := s.decrypt(&scratch, k, e, netip.AddrPort{}); r != dropNone {
			s.e.drop(r)
		}
	}
	s.early = nil
	s.keys.Store(k)
}

// decryptScratch is what decrypt reuses from one datagram to the next.
type decryptScratch struct {
	rtpHdr  rtp.Header
	rtcpHdr rtcp.Header
	rtcpBuf []byte
}

// decrypt decrypts one SRTP or SRTCP datagram with k and hands it on: the
// read loop, or startSRTP for those that came before the keys (from is
// then invalid). A datagram that authenticates and passes the replay
// window is fresh from the client: it refreshes consent, and from a
// candidate address it moves the media there (Session.authenticated).
func (s *Session) decrypt(rd *decryptScratch, k *srtpKeys, b []byte, from netip.AddrPort) DropReason {
	if isRTCP(b) {
		if rd.rtcpBuf == nil {
			rd.rtcpBuf = make([]byte, 0, bufSize)
		}
		out, err := k.remote.DecryptRTCP(rd.rtcpBuf[:0], b, &rd.rtcpHdr)
		if err != nil {
			return DropSRTPAuth
		}
		s.authenticated(from)
		if s.cfg.OnRTCP != nil {
			s.cfg.OnRTCP(out)
		}
		return dropNone
	}
	bp := getBuf()
	out, err := k.remote.DecryptRTP((*bp)[:0], b, &rd.rtpHdr)
	if err != nil {
		putBuf(bp)
		return DropSRTPAuth
	}
	s.authenticated(from)
	*bp = out
	select {
	case s.rtpq <- bp:
		return dropNone
	default:
		putBuf(bp)
		return DropRTPQueueFull
	}
}

// ReadRTP reads the next decrypted RTP packet from the client into b and
// returns its length (a packet longer than b is cut). It fails with a
// net.Error whose Timeout is true past the read deadline, and with
// ErrClosed once the session is closed. One goroutine reads.
func (s *Session) ReadRTP(b []byte) (int, error) {
	select {
	case bp := <-s.rtpq:
		n := copy(b, *bp)
		putBuf(bp)
		return n, nil
	case <-s.ctx.Done():
		return 0, ErrClosed
	case <-s.rdline.Done():
		return 0, os.ErrDeadlineExceeded
	}
}

// SetReadDeadline sets the deadline of ReadRTP; the zero time means none.
func (s *Session) SetReadDeadline(t time.Time) error {
	s.rdline.Set(t)
	return nil
}

// WriteRTP encrypts one RTP packet (h and payload) and sends it to the
// client. Safe for concurrent use; it fails with ErrNotConnected before
// the handshake completed.
func (s *Session) WriteRTP(h *rtp.Header, payload []byte) error {
	k := s.keys.Load()
	if k == nil {
		return ErrNotConnected
	}
	hl := h.MarshalSize()
	if n := hl + len(payload) + srtpOverhead; n > s.e.cfg.MaxPayload || n > bufSize {
		return ErrTooBig
	}
	plain, enc := getBuf(), getBuf()
	defer putBuf(plain)
	defer putBuf(enc)
	p := (*plain)[:hl+len(payload)]
	if _, err := h.MarshalTo(p); err != nil {
		return err
	}
	copy(p[hl:], payload)
	s.wmu.Lock()
	out, err := k.local.EncryptRTP((*enc)[:0], p, &s.whdr)
	s.wmu.Unlock()
	if err != nil {
		return err
	}
	return s.write(out)
}

// WriteRTCP encrypts one compound RTCP packet of pkts and sends it to the
// client. Safe for concurrent use.
func (s *Session) WriteRTCP(pkts []rtcp.Packet) error {
	k := s.keys.Load()
	if k == nil {
		return ErrNotConnected
	}
	raw, err := rtcp.Marshal(pkts)
	if err != nil {
		return err
	}
	enc := getBuf()
	defer putBuf(enc)
	s.wmu.Lock()
	out, err := k.local.EncryptRTCP((*enc)[:0], raw, &s.wrtcp)
	s.wmu.Unlock()
	if err != nil {
		return err
	}
	return s.write(out)
}

func (s *Session) write(b []byte) error {
	if s.closing.Load() {
		return ErrClosed
	}
	a := s.remote()
	if !a.IsValid() {
		return errNoAddress
	}
	_, err := s.e.conn.WriteToAddrPort(b, a)
	return err
}
