package transceiver

import (
	"io"
	"sync"
	"time"

	"github.com/pion/interceptor"
	"github.com/pion/rtcp"
	"github.com/pion/transport/v5/packetio"

	"github.com/switchboard-rtc/switchboard/internal/rtcpreport"
)

// RTCP, without a goroutine per session for it.
//
// Sending: the session's reports come from an rtcpreport.Interceptor, one
// of the Server's rtcpreport.Generator, which sends every session's
// reports from one goroutine on a timer wheel, where Pion's report
// interceptors would run two ticker goroutines per session.
//
// Receiving: Pion's SRTCP session decrypts each compound RTCP packet from
// the client and writes its packets into the read buffer of every SSRC
// they concern
// (srtp.ReadStreamSRTCP), for someone to read: a goroutine per stream
// blocked in RTPSender.Read or RTPReceiver.Read. The buffers come from
// SettingEngine.BufferFactory, so ours are rtcpSinks: Write handles the
// packet there and then, on the SRTCP session's own goroutine, and keeps
// nothing. That takes the reading goroutine away, and with it two
// problems of reading RTCP through Pion: nobody read the receiver's
// stream, so its buffer filled with the client's sender reports (up to
// srtp's 100 KB limit per session, over a long session), and Pion's
// receiver-report interceptor never saw them, so the LSR and DLSR of our
// receiver reports stayed 0 and the client could not measure the round
// trip from them.

// rtpBufferLimit bounds a session's buffer of decrypted RTP waiting for
// its track reader (onTrack): about 20 s of 20 ms Opus packets, where
// srtp's default is 1 MB. It only fills when the reader stalls; what does
// not fit is dropped, as srtp drops it.
const rtpBufferLimit = 100 * 1000

// bufferFactory returns the SettingEngine.BufferFactory of sess: an
// rtcpSink per SRTCP stream, a bounded packetio buffer per SRTP stream.
func (sess *session) bufferFactory(kind packetio.BufferPacketType, ssrc uint32) io.ReadWriteCloser {
	if kind == packetio.RTCPBufferPacket {
		return &rtcpSink{sess: sess, ssrc: ssrc, closed: make(chan struct{})}
	}
	b := packetio.NewBuffer()
	b.SetLimitSize(rtpBufferLimit)
	return rtpBuffer{b}
}

// rtpBuffer is a packetio.Buffer as an io.ReadWriteCloser that keeps the
// packets' attributes, which srtp's read stream looks for.
type rtpBuffer struct{ *packetio.Buffer }

func (b rtpBuffer) Read(p []byte) (int, error) {
	n, _, err := b.Buffer.Read(p, nil)
	return n, err
}

func (b rtpBuffer) Write(p []byte) (int, error) { return b.Buffer.Write(p, nil) }

func (b rtpBuffer) ReadWithAttributes(p []byte, a packetio.Attributes) (int, packetio.Attributes, error) {
	return b.Buffer.Read(p, a)
}

func (b rtpBuffer) WriteWithAttributes(p []byte, a packetio.Attributes) (int, error) {
	return b.Buffer.Write(p, a)
}

// rtcpSink is the read buffer of one SRTCP stream (ssrc): it handles each
// decrypted compound packet as it is written and keeps nothing to read.
//
// The SRTCP session writes each packet of a compound into the sink of
// every SSRC the packet concerns: the client's SR both into its own
// stream's sink and into ours, which its report blocks are about. So that each part
// is handled once, a sink handles only the part addressed to its own
// SSRC: an SR whose sender is ssrc (a remote stream: its NTP time for our
// LSR), and report blocks about ssrc (a local stream: loss, jitter, round
// trip).
type rtcpSink struct {
	sess      *session
	ssrc      uint32
	closeOnce sync.Once
	closed    chan struct{}
}

// rtcpMalformed is the reason label of client RTCP that does not parse.
const rtcpMalformed = "malformed"

// Write handles one decrypted RTCP packet. It never fails: one that does
// not parse is dropped and counted (rtcp_dropped_total{reason="malformed"}).
//
// srtp (v3.1) splits each compound packet on its length fields and
// writes the packets one at a time into the sinks of the SSRCs they
// name, which it reads with only as much parsing as finding them takes
// (rtcp.RawPacket.ParseDestinationSSRC): a packet whose framing is
// broken never gets here, but one with an SSRC where it should be and
// the rest wrong (a transport-wide feedback message shorter than its
// fixed fields, say) does.
func (k *rtcpSink) Write(b []byte) (int, error) {
	pkts, err := rtcp.Unmarshal(b)
	if err != nil {
		k.sess.srv.metrics.rtcpDropped.WithLabelValues(rtcpMalformed).Inc()
		return len(b), nil
	}
	now := time.Now()
	for _, p := range pkts {
		var blocks []rtcp.ReceptionReport
		switch p := p.(type) {
		case *rtcp.SenderReport:
			if p.SSRC == k.ssrc {
				k.sess.reports.HandleSenderReport(p, now)
			}
			blocks = p.Reports
		case *rtcp.ReceiverReport:
			blocks = p.Reports
		}
		for _, rr := range blocks {
			if rr.SSRC == k.ssrc {
				k.sess.observeReport(rr, now)
			}
		}
	}
	return len(b), nil
}

// Read blocks until the sink is closed: nothing is kept to read. Nothing
// reads RTCP from a session's senders or receivers.
func (k *rtcpSink) Read([]byte) (int, error) {
	<-k.closed
	return 0, io.EOF
}

// Close ends Read. It is idempotent.
func (k *rtcpSink) Close() error {
	k.closeOnce.Do(func() { close(k.closed) })
	return nil
}

// observeReport records one reception report block about our audio:
// loss, jitter (Opus RTP clock, 48 kHz) and, when it echoes one of our
// sender reports, the round-trip time (rtcpreport.RoundTrip).
func (sess *session) observeReport(rr rtcp.ReceptionReport, now time.Time) {
	m := sess.srv.metrics
	m.loss.Observe(float64(rr.FractionLost) / 256)
	m.jitter.Observe(float64(rr.Jitter) / float64(opusCodec.ClockRate))
	if rtt, ok := rtcpreport.RoundTrip(rr, now); ok {
		m.rtt.Observe(rtt.Seconds())
	}
}

// reportFactory hands Pion the session's own rtcpreport.Interceptor: the
// API, and so the interceptor registry, is the session's (newAPI).
type reportFactory struct{ i *rtcpreport.Interceptor }

func (f reportFactory) NewInterceptor(string) (interceptor.Interceptor, error) { return f.i, nil }
