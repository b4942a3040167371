package rtcpreport

import (
	"encoding/binary"
	"math"
	"sync"
	"time"

	"github.com/pion/rtcp"
)

// Sequence-number tracking bounds of RFC 3550 Appendix A.1.
const (
	maxDropout  = 3000 // a forward jump up to this is a gap, not a restart
	maxMisorder = 100  // a backward jump up to this is a late packet
	seqMod      = 1 << 16
)

// localStream is the state behind the sender report of one stream this
// peer connection sends (RFC 3550 §6.4.1).
type localStream struct {
	ssrc      uint32
	clockRate uint32

	mu sync.Mutex
	// The latest RTP timestamp sent and when: the pair an SR's RTP
	// timestamp is extrapolated from. Guarded by mu, as are the counts.
	lastTS   uint32
	lastSent time.Time
	lastSeq  uint16
	packets  uint32 // packets sent, wrapping as RFC 3550 allows
	octets   uint32 // payload octets sent (no header, no padding), wrapping
}

// sent records one RTP packet as it leaves.
func (s *localStream) sent(seq uint16, ts uint32, payloadLen int, now time.Time) {
	s.mu.Lock()
	// Only a packet that is newer than the last one moves the RTP/NTP
	// pair: a retransmission or reordered write must not pull the SR's
	// timestamp back.
	if s.packets == 0 || int16(seq-s.lastSeq) > 0 {
		s.lastSeq = seq
		if s.packets == 0 || ts != s.lastTS {
			s.lastTS, s.lastSent = ts, now
		}
	}
	s.packets++
	s.octets += uint32(payloadLen)
	s.mu.Unlock()
}

// senderReport returns the stream's SR at now, or false before its first
// packet: until then it has no RTP timestamp to map (RFC 3550 §6.4: a
// participant that has sent nothing sends RRs).
func (s *localStream) senderReport(now time.Time) (rtcp.SenderReport, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.packets == 0 {
		return rtcp.SenderReport{}, false
	}
	// The RTP timestamp that corresponds to now on the media clock: the
	// last one sent plus the wall time since, in clock-rate units (the
	// NTP/RTP pair an RTCP receiver uses for lip sync and, with the
	// counts, to estimate the sender's rate).
	elapsed := now.Sub(s.lastSent)
	return rtcp.SenderReport{
		SSRC:        s.ssrc,
		NTPTime:     NTPTime(now),
		RTPTime:     s.lastTS + clockUnits(elapsed, s.clockRate),
		PacketCount: s.packets,
		OctetCount:  s.octets,
	}, true
}

// remoteStream is the reception state of one stream this peer connection
// receives: what its reception report block says (RFC 3550 §6.4.1,
// Appendix A.1, A.3, A.8).
type remoteStream struct {
	ssrc      uint32
	clockRate uint32
	epoch     time.Time // arrival times count from here, in clock-rate units

	mu sync.Mutex
	// Guarded by mu.
	started  bool
	maxSeq   uint16 // highest sequence number seen
	cycles   uint32 // sequence-number wraps, × 2^16
	baseSeq  uint32 // first sequence number of this source (A.1 base_seq)
	badSeq   uint32 // the next sequence number after a large jump (A.1 bad_seq)
	received uint32 // packets received, counted as A.1 counts them

	expectedPrior, receivedPrior uint32 // at the last report (A.3)

	transit uint32 // relative transit time of the previous packet (A.8)
	jitter  uint32 // interarrival jitter × 16, in clock-rate units (A.8)

	lastSR     uint32    // middle 32 bits of the last SR's NTP timestamp (LSR)
	lastSRTime time.Time // when that SR arrived; zero: none yet
}

// receivedPacket records one RTP packet from the source: seq and ts from its
// header, arrived at now.
func (s *remoteStream) receivedPacket(seq uint16, ts uint32, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.started = true
		s.restart(seq)
	} else if !s.updateSeq(seq) {
		return
	}
	s.received++

	// Interarrival jitter, RFC 3550 A.8: the difference D of relative
	// transit times between this packet and the previous one, smoothed
	// with gain 1/16. The arrival clock has the same units as the RTP
	// timestamps; both wrap, and the difference of wrapped uint32s is
	// right as long as the two packets are less than 2^31 units apart.
	arrival := clockUnits(now.Sub(s.epoch), s.clockRate)
	transit := arrival - ts
	if s.received > 1 {
		d := int32(transit - s.transit)
		if d < 0 {
			d = -d
		}
		// J += (|D| - J) / 16, in units of 1/16 (A.8's integer form).
		s.jitter += uint32(d) - ((s.jitter + 8) >> 4)
	}
	s.transit = transit
}

// restart starts counting the source afresh at seq (A.1 init_seq).
func (s *remoteStream) restart(seq uint16) {
	s.baseSeq = uint32(seq)
	s.maxSeq = seq
	s.badSeq = seqMod + 1 // matches no sequence number
	s.cycles = 0
	s.received, s.receivedPrior, s.expectedPrior = 0, 0, 0
}

// updateSeq is A.1's update_seq without the probation of new sources (the
// SSRC is signalled, not guessed): it reports whether seq counts as
// received.
func (s *remoteStream) updateSeq(seq uint16) bool {
	delta := seq - s.maxSeq
	switch {
	case delta < maxDropout:
		// In order, with a permissible gap.
		if seq < s.maxSeq {
			s.cycles += seqMod // wrapped
		}
		s.maxSeq = seq
	case uint32(delta) <= seqMod-maxMisorder:
		// A very large jump. Two sequential packets after it mean the
		// sender restarted its numbering: count from there.
		if uint32(seq) == s.badSeq {
			s.restart(seq)
			return true
		}
		s.badSeq = (uint32(seq) + 1) & (seqMod - 1)
		return false
	default:
		// A duplicate or a packet from before maxSeq: it still arrived.
	}
	return true
}

// senderReport records an SR from the source, arrived at now, for the
// LSR and DLSR fields of the next report block.
func (s *remoteStream) senderReport(ntp uint64, now time.Time) {
	s.mu.Lock()
	s.lastSR = uint32(ntp >> 16)
	s.lastSRTime = now
	s.mu.Unlock()
}

// block returns the source's reception report block at now and starts
// the next reporting interval, or false when nothing has arrived yet.
func (s *remoteStream) block(now time.Time) (rtcp.ReceptionReport, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		return rtcp.ReceptionReport{}, false
	}
	extMax := s.cycles + uint32(s.maxSeq)
	expected := extMax - s.baseSeq + 1

	// Cumulative loss (A.3): expected − received, which duplicates can
	// make negative; 24-bit signed on the wire, clamped to its range.
	lost := int64(expected) - int64(s.received)
	lost = max(min(lost, 0x7fffff), -0x800000)

	// Fraction lost since the last report, 8-bit fixed point; 0 when
	// duplicates outnumber losses.
	expInterval := expected - s.expectedPrior
	recvInterval := s.received - s.receivedPrior
	s.expectedPrior, s.receivedPrior = expected, s.received
	var fraction uint8
	if lostInterval := int64(expInterval) - int64(recvInterval); expInterval != 0 && lostInterval > 0 {
		// Below 256 as long as a packet arrived in the interval, which
		// it did if expected moved (maxSeq moves only on a received
		// packet); clamped so that an interval with everything lost
		// reads 255, not 0.
		fraction = uint8(min((lostInterval<<8)/int64(expInterval), 255))
	}

	var dlsr uint32
	if !s.lastSRTime.IsZero() {
		dlsr = delaySince(now.Sub(s.lastSRTime))
	}
	return rtcp.ReceptionReport{
		SSRC:               s.ssrc,
		FractionLost:       fraction,
		TotalLost:          uint32(lost) & 0xffffff,
		LastSequenceNumber: extMax,
		Jitter:             s.jitter >> 4,
		LastSenderReport:   s.lastSR,
		Delay:              dlsr,
	}, true
}

// delaySince returns d as a DLSR, in units of 1/65536 s (RFC 3550
// §6.4.1's 16.16 fixed point), clamped to the field's range: 0 for a
// negative d, 2^32 − 1 (just under 65536 s, about 18 h) for a longer d,
// from a source that sent RTP but no SR for that long. Clamping d first
// keeps d × 65536 in nanoseconds within an int64, which it leaves from
// about 39 h.
func delaySince(d time.Duration) uint32 {
	d = max(min(d, 65536*time.Second), 0)
	return uint32(min(d*65536/time.Second, math.MaxUint32))
}

// clockUnits converts d to units of a clockRate Hz clock, modulo 2^32
// like RTP timestamps, without overflowing for any d.
func clockUnits(d time.Duration, clockRate uint32) uint32 {
	secs, rem := d/time.Second, d%time.Second
	return uint32(int64(secs)*int64(clockRate) + int64(rem)*int64(clockRate)/int64(time.Second))
}

// rtpSeqTS reads the sequence number and timestamp of an RTP packet's
// fixed header (RFC 3550 §5.1) without decoding the rest; ok is false for
// anything shorter than a fixed header or not RTP version 2.
func rtpSeqTS(b []byte) (seq uint16, ts uint32, ok bool) {
	if len(b) < 12 || b[0]>>6 != 2 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint16(b[2:4]), binary.BigEndian.Uint32(b[4:8]), true
}

// NTPTime returns t as a 64-bit NTP timestamp (RFC 5905 §6: seconds
// since 1900 in the high 32 bits, the fraction in the low 32).
func NTPTime(t time.Time) uint64 {
	const ntpEpochOffset = 2208988800 // seconds from 1900 to 1970
	secs := uint64(t.Unix()) + ntpEpochOffset
	frac := uint64(t.Nanosecond()) << 32 / uint64(time.Second)
	return secs<<32 | frac
}

// NTPMiddle returns the middle 32 bits of t's NTP timestamp, the unit
// (1/65536 s) of the LSR and DLSR fields (RFC 3550 §6.4.1).
func NTPMiddle(t time.Time) uint32 { return uint32(NTPTime(t) >> 16) }

// RoundTrip returns the round-trip time a reception report block gives
// when it arrives at now: A − LSR − DLSR (RFC 3550 §6.4.1), and false
// when the block echoes no sender report or the result is not plausible
// (negative, which a wrapped value or a clock step shows as huge, or over
// 10 s).
func RoundTrip(rr rtcp.ReceptionReport, now time.Time) (time.Duration, bool) {
	if rr.LastSenderReport == 0 {
		return 0, false
	}
	rtt := NTPMiddle(now) - rr.LastSenderReport - rr.Delay
	if rtt >= 10<<16 {
		return 0, false
	}
	return time.Duration(int64(rtt) * int64(time.Second) / 65536), true
}
