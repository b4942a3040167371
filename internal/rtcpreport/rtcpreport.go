// Package rtcpreport sends the RTCP sender and receiver reports of RFC
// 3550 §6.4 for every peer connection of a process from one goroutine on
// a shared clock.
//
// Pion's report interceptors (interceptor/pkg/report) run two ticker
// goroutines per peer connection, one for sender reports and one for
// receiver reports; at thousands of sessions per process that is
// thousands of goroutines, each waking once a second to send one small
// packet. Here a Generator owns one goroutine and a timer wheel: each peer
// connection's Interceptor sits in one of its slots, the slots take turns
// across the report interval, and a slot's interceptors report when its
// turn comes, so the reports of many sessions are spread evenly over the
// interval instead of bunching on one tick.
//
// What a report carries:
//
//   - one SR (§6.4.1) per local stream that has sent RTP: the NTP time
//     and the RTP timestamp that corresponds to it (the last packet's
//     timestamp plus the wall time since, in clock-rate units), the
//     packet count and the payload octet count;
//   - a reception report block per remote stream that has sent RTP, in
//     the first SR or, when no local stream has sent anything, in an RR
//     (§6.4.2): the extended highest sequence number and cumulative loss
//     (Appendix A.1, A.3), the fraction lost since the previous report,
//     the interarrival jitter (A.8) and the LSR and DLSR of the source's
//     last SR, from which the source computes the round-trip time.
//
// The remote streams' SRs reach an Interceptor either through its RTCP
// reader (BindRTCPReader, when the application reads RTCP from Pion) or
// through HandleSenderReport, for an application that decrypts RTCP itself
// (internal/transceiver, over internal/peer). Such an application, without
// Pion's interceptor chain, reports its streams' packets with
// AddLocalStream and AddRemoteStream and starts the reports with Start.
//
// The report interval is fixed (no RFC 3550 §6.3 randomisation): each
// peer connection here has one remote party, so there is no group whose
// reports could synchronise.
package rtcpreport

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/pion/interceptor"
	"github.com/pion/rtcp"
	"github.com/pion/rtp"
)

// DefaultInterval is the report interval when NewGenerator gets 0: Pion's
// report interceptors' default, once a second.
const DefaultInterval = time.Second

// wheelSlots is the number of turns in one report interval: at the
// default interval, one every 50 ms.
const wheelSlots = 20

// maxBlocks is the largest number of report blocks one SR or RR holds
// (its 5-bit count, RFC 3550 §6.4.1).
const maxBlocks = 31

// Generator sends the reports of every Interceptor it made, from one
// goroutine. It is an interceptor.Factory: register it in each peer
// connection's interceptor.Registry (or use New for a handle to the
// instance).
type Generator struct {
	// Set once.
	interval time.Duration
	stop     chan struct{}
	done     chan struct{}

	mu        sync.Mutex
	wheel     [wheelSlots][]*Interceptor // guarded by mu
	next      int                        // guarded by mu: the slot the next interceptor joins
	started   bool                       // guarded by mu: run is running
	closed    bool                       // guarded by mu
	closeOnce sync.Once
}

// NewGenerator returns a Generator that reports every interval (0:
// DefaultInterval). Its goroutine starts with its first Interceptor's
// reports; Close stops it.
func NewGenerator(interval time.Duration) *Generator {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Generator{interval: interval, stop: make(chan struct{}), done: make(chan struct{})}
}

// Interval returns the report interval.
func (g *Generator) Interval() time.Duration { return g.interval }

// NewInterceptor returns a new Interceptor of g (interceptor.Factory).
func (g *Generator) NewInterceptor(string) (interceptor.Interceptor, error) { return g.New(), nil }

// New returns a new Interceptor of g. It reports once its RTCP writer is
// bound, until it is closed.
func (g *Generator) New() *Interceptor {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &Interceptor{g: g, ssrc: binary.BigEndian.Uint32(b[:]), slot: -1}
}

// Close stops the reports and waits for the goroutine. It is idempotent.
func (g *Generator) Close() {
	g.closeOnce.Do(func() {
		g.mu.Lock()
		g.closed = true
		started := g.started
		g.mu.Unlock()
		if started {
			close(g.stop)
			<-g.done
		}
	})
}

// run is the generator's goroutine: every interval/wheelSlots it reports
// the interceptors of the next slot.
func (g *Generator) run() {
	defer close(g.done)
	t := time.NewTicker(g.interval / wheelSlots)
	defer t.Stop()
	var due []*Interceptor
	for slot := 0; ; slot = (slot + 1) % wheelSlots {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		g.mu.Lock()
		due = append(due[:0], g.wheel[slot]...)
		g.mu.Unlock()
		now := time.Now()
		for _, i := range due {
			i.report(now)
		}
		clear(due) // hold no interceptor until the next turn
	}
}

// join puts i in the wheel, in the slot after the last one filled, so
// that interceptors spread evenly over the slots. An i already closed
// stays out: BindRTCPWriter calls join after releasing i.mu, and an
// Interceptor.Close in between finds i in no slot to leave (lock order:
// g.mu, then i.mu; nothing takes g.mu holding i.mu).
func (g *Generator) join(i *Interceptor) {
	g.mu.Lock()
	defer g.mu.Unlock()
	i.mu.Lock()
	closed := i.closed
	i.mu.Unlock()
	if g.closed || closed || i.slot >= 0 {
		return
	}
	if !g.started {
		g.started = true
		go g.run()
	}
	i.slot = g.next
	g.next = (g.next + 1) % wheelSlots
	g.wheel[i.slot] = append(g.wheel[i.slot], i)
}

// leave takes i out of the wheel.
func (g *Generator) leave(i *Interceptor) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i.slot < 0 {
		return
	}
	w := g.wheel[i.slot]
	if k := slices.Index(w, i); k >= 0 {
		w[k] = w[len(w)-1]
		w[len(w)-1] = nil
		g.wheel[i.slot] = w[:len(w)-1]
	}
	i.slot = -1
}

// Interceptor is the report state of one peer connection: its local
// (sent) and remote (received) streams. Pion calls its Bind methods; the
// Generator calls report.
type Interceptor struct {
	interceptor.NoOp

	// Set once.
	g    *Generator
	ssrc uint32 // the RR's sender SSRC when no local stream exists

	mu     sync.Mutex
	local  []*localStream         // guarded by mu
	remote []*remoteStream        // guarded by mu
	writer interceptor.RTCPWriter // guarded by mu; nil until bound
	closed bool                   // guarded by mu
	cname  string                 // guarded by mu; "" sends no SDES
	slot   int                    // guarded by g.mu; -1 when not in the wheel
}

// SetCNAME makes every compound report end with an SDES packet carrying
// cname for the reporting SSRC, as RFC 3550 §6.1 requires of every
// compound RTCP packet (unless reduced-size RTCP, RFC 5506, was agreed).
// "" (the default) sends none.
func (i *Interceptor) SetCNAME(cname string) {
	i.mu.Lock()
	i.cname = cname
	i.mu.Unlock()
}

// BindRTCPWriter keeps the writer reports are sent with and starts
// reporting.
func (i *Interceptor) BindRTCPWriter(w interceptor.RTCPWriter) interceptor.RTCPWriter {
	i.mu.Lock()
	first := i.writer == nil && !i.closed
	i.writer = w
	i.mu.Unlock()
	if first {
		i.g.join(i)
	}
	return w
}

// BindRTCPReader watches the RTCP read through it for the remote
// streams' sender reports.
func (i *Interceptor) BindRTCPReader(r interceptor.RTCPReader) interceptor.RTCPReader {
	return interceptor.RTCPReaderFunc(func(b []byte, a interceptor.Attributes) (int, interceptor.Attributes, error) {
		n, a, err := r.Read(b, a)
		if err != nil {
			return n, a, err
		}
		if pkts, perr := rtcp.Unmarshal(b[:n]); perr == nil {
			now := time.Now()
			for _, p := range pkts {
				if sr, ok := p.(*rtcp.SenderReport); ok {
					i.HandleSenderReport(sr, now)
				}
			}
		}
		return n, a, err
	})
}

// HandleSenderReport records sr, which arrived at now, for the LSR and
// DLSR of the next report block about its sender; an SR from a stream
// that is not bound is ignored. Calling it more than once for one SR
// changes nothing.
func (i *Interceptor) HandleSenderReport(sr *rtcp.SenderReport, now time.Time) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for _, s := range i.remote {
		if s.ssrc == sr.SSRC {
			s.senderReport(sr.NTPTime, now)
			return
		}
	}
}

// BindLocalStream counts what is sent on the stream for its sender
// reports.
func (i *Interceptor) BindLocalStream(info *interceptor.StreamInfo, w interceptor.RTPWriter) interceptor.RTPWriter {
	s := i.AddLocalStream(info.SSRC, info.ClockRate)
	return interceptor.RTPWriterFunc(func(h *rtp.Header, payload []byte, a interceptor.Attributes) (int, error) {
		s.Sent(h.SequenceNumber, h.Timestamp, len(payload), time.Now())
		return w.Write(h, payload, a)
	})
}

// LocalStream is a stream the peer connection sends, as an application
// that writes RTP without Pion's interceptor chain reports it.
type LocalStream struct{ s *localStream }

// AddLocalStream starts the sender reports of stream ssrc, whose RTP
// clock runs at clockRate Hz; the caller reports each packet it sends
// with Sent.
func (i *Interceptor) AddLocalStream(ssrc, clockRate uint32) LocalStream {
	s := &localStream{ssrc: ssrc, clockRate: clockRate}
	i.mu.Lock()
	i.local = append(i.local, s)
	i.mu.Unlock()
	return LocalStream{s}
}

// Sent records one RTP packet as it leaves at now: its sequence number,
// timestamp and payload length in bytes (no header, no padding).
func (l LocalStream) Sent(seq uint16, ts uint32, payloadLen int, now time.Time) {
	l.s.sent(seq, ts, payloadLen, now)
}

// UnbindLocalStream stops reporting the stream.
func (i *Interceptor) UnbindLocalStream(info *interceptor.StreamInfo) {
	i.mu.Lock()
	i.local = slices.DeleteFunc(i.local, func(s *localStream) bool { return s.ssrc == info.SSRC })
	i.mu.Unlock()
}

// BindRemoteStream tracks what arrives on the stream for its reception
// report block. It reads only the fixed RTP header's sequence number and
// timestamp, in place.
func (i *Interceptor) BindRemoteStream(info *interceptor.StreamInfo, r interceptor.RTPReader) interceptor.RTPReader {
	s := i.AddRemoteStream(info.SSRC, info.ClockRate)
	return interceptor.RTPReaderFunc(func(b []byte, a interceptor.Attributes) (int, interceptor.Attributes, error) {
		n, a, err := r.Read(b, a)
		if err != nil {
			return n, a, err
		}
		s.Received(b[:n], time.Now())
		return n, a, err
	})
}

// RemoteStream is a stream the peer connection receives, as an
// application that reads RTP without Pion's interceptor chain reports it.
type RemoteStream struct{ s *remoteStream }

// AddRemoteStream starts the reception report block of stream ssrc,
// whose RTP clock runs at clockRate Hz; the caller reports each packet it
// receives with Received.
func (i *Interceptor) AddRemoteStream(ssrc, clockRate uint32) RemoteStream {
	s := &remoteStream{ssrc: ssrc, clockRate: clockRate, epoch: time.Now()}
	i.mu.Lock()
	i.remote = append(i.remote, s)
	i.mu.Unlock()
	return RemoteStream{s}
}

// Received records RTP packet b (at least its fixed header; anything
// shorter, or not RTP version 2, is ignored), arrived at now.
func (r RemoteStream) Received(b []byte, now time.Time) {
	if seq, ts, ok := rtpSeqTS(b); ok {
		r.s.receivedPacket(seq, ts, now)
	}
}

// Start starts the reports, written with w, as BindRTCPWriter does for an
// application without Pion's interceptor chain.
func (i *Interceptor) Start(w func([]rtcp.Packet) error) {
	i.BindRTCPWriter(interceptor.RTCPWriterFunc(func(pkts []rtcp.Packet, _ interceptor.Attributes) (int, error) {
		return 0, w(pkts)
	}))
}

// UnbindRemoteStream stops reporting the stream.
func (i *Interceptor) UnbindRemoteStream(info *interceptor.StreamInfo) {
	i.mu.Lock()
	i.remote = slices.DeleteFunc(i.remote, func(s *remoteStream) bool { return s.ssrc == info.SSRC })
	i.mu.Unlock()
}

// Close stops the reports.
func (i *Interceptor) Close() error {
	i.mu.Lock()
	i.closed = true
	i.mu.Unlock()
	i.g.leave(i)
	return nil
}

// errNoWriter: report was called before an RTCP writer was bound.
var errNoWriter = errors.New("rtcpreport: no RTCP writer bound")

// report sends the peer connection's reports at now, if it has any.
func (i *Interceptor) report(now time.Time) error {
	pkts := i.reports(now)
	if len(pkts) == 0 {
		return nil
	}
	i.mu.Lock()
	w := i.writer
	i.mu.Unlock()
	if w == nil {
		return errNoWriter
	}
	_, err := w.Write(pkts, interceptor.Attributes{})
	return err
}

// reports returns the reports the peer connection sends at now: an SR
// per local stream that has sent, the first with the reception report
// blocks, or an RR with the blocks when no local stream has sent; nil
// when there is nothing to report.
func (i *Interceptor) reports(now time.Time) []rtcp.Packet {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return nil
	}
	// At most maxBlocks: block starts the stream's next interval (its
	// A.3 priors), so a stream left out must not be asked for one.
	var blocks []rtcp.ReceptionReport
	for _, s := range i.remote {
		if len(blocks) == maxBlocks {
			break
		}
		if b, ok := s.block(now); ok {
			blocks = append(blocks, b)
		}
	}
	var pkts []rtcp.Packet
	for _, s := range i.local {
		sr, ok := s.senderReport(now)
		if !ok {
			continue
		}
		if len(pkts) == 0 {
			sr.Reports = blocks
		}
		pkts = append(pkts, &sr)
	}
	if len(pkts) == 0 && len(blocks) > 0 {
		ssrc := i.ssrc
		if len(i.local) > 0 {
			ssrc = i.local[0].ssrc
		}
		pkts = append(pkts, &rtcp.ReceiverReport{SSRC: ssrc, Reports: blocks})
	}
	if len(pkts) > 0 && i.cname != "" {
		var ssrc uint32 // the first report's sender
		switch r := pkts[0].(type) {
		case *rtcp.SenderReport:
			ssrc = r.SSRC
		case *rtcp.ReceiverReport:
			ssrc = r.SSRC
		}
		pkts = append(pkts, &rtcp.SourceDescription{Chunks: []rtcp.SourceDescriptionChunk{{
			Source: ssrc,
			Items:  []rtcp.SourceDescriptionItem{{Type: rtcp.SDESCNAME, Text: i.cname}},
		}}})
	}
	return pkts
}
