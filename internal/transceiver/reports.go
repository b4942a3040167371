package transceiver

import (
	"sync"
	"time"

	"github.com/pion/rtcp"

	"github.com/switchboard-rtc/switchboard/internal/rtcpreport"
)

// RTCP, without a goroutine per session for it.
//
// Sending: the session's reports come from an rtcpreport.Interceptor, one
// of the Server's rtcpreport.Generator, which sends every session's
// reports from one goroutine on a timer wheel (two ticker goroutines per
// session with Pion's report interceptors). The session tells it each
// packet it sends (SendPacket, media.go) and receives (fromClient), and
// the reports go out through the peer session's SRTCP (peer.WriteRTCP).
//
// Receiving: the peer endpoint decrypts each compound RTCP packet from the
// client on its read loop and hands it to onRTCP there and then: the
// client's sender reports feed the LSR and DLSR of our reception report
// blocks (so the client can measure the round trip), and the client's
// report blocks about our audio give the loss, jitter and round-trip
// metrics. Nothing is kept and no goroutine waits for RTCP.

// rtcpMalformed is the reason label of client RTCP that does not parse.
const rtcpMalformed = "malformed"

// onRTCP handles one decrypted compound RTCP packet from the client, on
// the peer endpoint's read loop. One that does not parse is dropped and
// counted (rtcp_dropped_total{reason="malformed"}).
func (sess *session) onRTCP(b []byte) {
	pkts, err := rtcp.Unmarshal(b)
	if err != nil {
		sess.srv.metrics.rtcpDropped.WithLabelValues(rtcpMalformed).Inc()
		return
	}
	now := time.Now()
	for _, p := range pkts {
		var blocks []rtcp.ReceptionReport
		switch p := p.(type) {
		case *rtcp.SenderReport:
			sess.reports.HandleSenderReport(p, now)
			blocks = p.Reports
		case *rtcp.ReceiverReport:
			blocks = p.Reports
		}
		for _, rr := range blocks {
			if rr.SSRC == sess.outSSRC {
				sess.observeReport(rr, now)
			}
		}
	}
}

// observeReport records one reception report block about our audio:
// loss, jitter (Opus RTP clock, 48 kHz) and, when it echoes one of our
// sender reports, the round-trip time (rtcpreport.RoundTrip), per report
// and in the session's call quality.
func (sess *session) observeReport(rr rtcp.ReceptionReport, now time.Time) {
	m := sess.srv.metrics
	jitter := float64(rr.Jitter) / float64(opusClockRate)
	m.loss.Observe(float64(rr.FractionLost) / 256)
	m.jitter.Observe(jitter)
	rtt, ok := rtcpreport.RoundTrip(rr, now)
	if ok {
		m.rtt.Observe(rtt.Seconds())
	}
	sess.quality.add(rr, jitter, rtt, ok)
}

// callQuality sums up a session's receiver reports about the audio it
// sends, for one figure per session at its end: the per-report
// histograms weigh long calls by their length, these count each call
// once ("what share of calls had a round trip over 300 ms").
type callQuality struct {
	mu      sync.Mutex
	reports int
	rttN    int
	rttSum  time.Duration
	jitter  float64 // sum of the reports' jitter, s
	lost    int32   // the latest report's cumulative packets lost, signed (RFC 3550 §6.4.1)
	highest uint32  // its extended highest sequence number received
}

func (q *callQuality) add(rr rtcp.ReceptionReport, jitter float64, rtt time.Duration, rttOK bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.reports++
	q.jitter += jitter
	if rttOK {
		q.rttN++
		q.rttSum += rtt
	}
	// A signed 24-bit field: negative when duplicates outnumber losses.
	q.lost, q.highest = int32(rr.TotalLost<<8)>>8, rr.LastSequenceNumber
}

// summary returns the session's mean round-trip time (ok false without
// one), mean jitter, and the fraction of the packets sent up to the
// latest report that the client lost, given the first sequence number
// sent (firstSeq; its cycle count starts at 0 there); reports is 0 when
// the client sent none.
func (q *callQuality) summary(firstSeq uint16) (reports int, rtt time.Duration, rttOK bool, jitter, loss float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.reports == 0 {
		return 0, 0, false, 0, 0
	}
	if q.rttN > 0 {
		rtt, rttOK = q.rttSum/time.Duration(q.rttN), true
	}
	if expected := int64(q.highest) - int64(firstSeq) + 1; expected > 0 {
		loss = min(1, max(0, float64(q.lost)/float64(expected)))
	}
	return q.reports, rtt, rttOK, q.jitter / float64(q.reports), loss
}

// observeQuality records the session's call quality once, at its end,
// and returns it as log attributes.
func (sess *session) observeQuality() []any {
	first, sent := sess.media.firstSent()
	if !sent {
		return nil
	}
	n, rtt, rttOK, jitter, loss := sess.quality.summary(first)
	if n == 0 {
		return nil
	}
	m := sess.srv.metrics
	m.sessionJitter.Observe(jitter)
	m.sessionLoss.Observe(loss)
	attrs := []any{"receiver_reports", n, "jitter", time.Duration(jitter * float64(time.Second)).Round(time.Microsecond), "loss", loss}
	if rttOK {
		m.sessionRTT.Observe(rtt.Seconds())
		attrs = append(attrs, "rtt", rtt.Round(time.Microsecond))
	}
	return attrs
}
