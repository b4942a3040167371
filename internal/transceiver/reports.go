package transceiver

import (
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
// sender reports, the round-trip time (rtcpreport.RoundTrip).
func (sess *session) observeReport(rr rtcp.ReceptionReport, now time.Time) {
	m := sess.srv.metrics
	m.loss.Observe(float64(rr.FractionLost) / 256)
	m.jitter.Observe(float64(rr.Jitter) / float64(opusClockRate))
	if rtt, ok := rtcpreport.RoundTrip(rr, now); ok {
		m.rtt.Observe(rtt.Seconds())
	}
}
