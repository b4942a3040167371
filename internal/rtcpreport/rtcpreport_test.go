package rtcpreport

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/pion/interceptor"
	"github.com/pion/interceptor/pkg/report"
	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const opusRate = 48000

// t0 is an arbitrary start for the tests' clocks.
var t0 = time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)

// wire marshals an RTP packet as it would arrive: the tests feed the
// trackers real packets, read back through rtpSeqTS.
func wire(t *testing.T, seq uint16, ts uint32) []byte {
	t.Helper()
	b, err := (&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: ts, SSRC: 0x1234}, Payload: make([]byte, 60)}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// arrive feeds one packet to s at time at.
func arrive(t *testing.T, s *remoteStream, seq uint16, ts uint32, at time.Time) {
	t.Helper()
	seq2, ts2, ok := rtpSeqTS(wire(t, seq, ts))
	if !ok || seq2 != seq || ts2 != ts {
		t.Fatalf("rtpSeqTS(%d, %d) = %d, %d, %v", seq, ts, seq2, ts2, ok)
	}
	s.receivedPacket(seq2, ts2, at)
}

func newRemote() *remoteStream {
	return &remoteStream{ssrc: 0x1234, clockRate: opusRate, epoch: t0}
}

func TestRTPSeqTS(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"short", make([]byte, 11)},
		{"version 0", make([]byte, 12)},
		{"version 1", append([]byte{0x40}, make([]byte, 11)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, ok := rtpSeqTS(tc.b); ok {
				t.Fatal("accepted")
			}
		})
	}
}

// TestLoss: cumulative loss, the fraction lost per interval (RFC 3550
// A.3) and the extended highest sequence number.
func TestLoss(t *testing.T) {
	s := newRemote()
	at := t0
	// 100 packets, seq 1000–1099, every 10th missing: 10 lost of 100.
	for i := range 100 {
		at = at.Add(20 * time.Millisecond)
		if i%10 == 5 {
			continue
		}
		arrive(t, s, uint16(1000+i), uint32(i*960), at)
	}
	b, _ := s.block(at)
	if b.LastSequenceNumber != 1099 || b.TotalLost != 10 || b.FractionLost != 10*256/100 {
		t.Fatalf("interval 1: highest %d lost %d fraction %d, want 1099, 10, %d", b.LastSequenceNumber, b.TotalLost, b.FractionLost, 10*256/100)
	}
	// 100 more, a quarter missing: the fraction is this interval's,
	// the total cumulative.
	for i := 100; i < 200; i++ {
		at = at.Add(20 * time.Millisecond)
		if i%4 == 0 {
			continue
		}
		arrive(t, s, uint16(1000+i), uint32(i*960), at)
	}
	b, _ = s.block(at)
	if b.LastSequenceNumber != 1199 || b.TotalLost != 35 || b.FractionLost != 64 {
		t.Fatalf("interval 2: highest %d lost %d fraction %d, want 1199, 35, 64", b.LastSequenceNumber, b.TotalLost, b.FractionLost)
	}
	// No packet since: nothing expected, nothing lost.
	b, _ = s.block(at)
	if b.FractionLost != 0 || b.TotalLost != 35 {
		t.Fatalf("empty interval: lost %d fraction %d, want 35, 0", b.TotalLost, b.FractionLost)
	}
}

// TestSequenceWrap: the extended highest sequence number counts the
// wraps of the 16-bit sequence number (A.1), and a late packet from
// before the wrap neither moves it nor counts a cycle.
func TestSequenceWrap(t *testing.T) {
	s := newRemote()
	at := t0
	seq := uint16(65530)
	for i := range 20 { // 65530 … 65535, 0 … 13
		at = at.Add(20 * time.Millisecond)
		if seq == 2 { // late: arrives after 3
			seq++
			continue
		}
		arrive(t, s, seq, uint32(i*960), at)
		seq++
	}
	arrive(t, s, 2, 0, at)     // the late one
	arrive(t, s, 65534, 0, at) // a duplicate from before the wrap
	b, _ := s.block(at)
	if want := uint32(1<<16 + 13); b.LastSequenceNumber != want {
		t.Fatalf("extended highest %#x, want %#x", b.LastSequenceNumber, want)
	}
	// 20 expected, 21 received (one duplicate): a cumulative loss of −1,
	// 24-bit two's complement; no fraction lost.
	if b.TotalLost != 0xffffff || b.FractionLost != 0 {
		t.Fatalf("lost %#x fraction %d, want 0xffffff, 0", b.TotalLost, b.FractionLost)
	}
}

// TestSequenceRestart: a jump of more than MAX_DROPOUT is ignored until
// a second sequential packet confirms it; then counting starts afresh
// (A.1).
func TestSequenceRestart(t *testing.T) {
	s := newRemote()
	at := t0
	for i := range 10 {
		arrive(t, s, uint16(100+i), uint32(i*960), at)
	}
	arrive(t, s, 40000, 0, at) // one stray packet: not counted
	b, _ := s.block(at)
	if b.LastSequenceNumber != 109 || b.TotalLost != 0 {
		t.Fatalf("after a stray jump: highest %d lost %d, want 109, 0", b.LastSequenceNumber, b.TotalLost)
	}
	arrive(t, s, 50000, 0, at)
	arrive(t, s, 50001, 960, at) // sequential after the jump: restart
	arrive(t, s, 50002, 1920, at)
	b, _ = s.block(at)
	if b.LastSequenceNumber != 50002 || b.TotalLost != 0 {
		t.Fatalf("after a restart: highest %d lost %d, want 50002, 0", b.LastSequenceNumber, b.TotalLost)
	}
}

// TestJitter: interarrival jitter (A.8) against the defining recurrence
// J += (|D| − J)/16 in floating point.
func TestJitter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay func(i int) time.Duration // network delay of packet i
		want  func(float64) bool        // on the float reference
	}{
		{"constant delay", func(int) time.Duration { return 30 * time.Millisecond }, func(j float64) bool { return j == 0 }},
		{"alternating 0 and 2 ms", func(i int) time.Duration { return time.Duration(i%2) * 2 * time.Millisecond }, func(j float64) bool { return j > 90 }},
		{"ramp", func(i int) time.Duration { return time.Duration(i%7) * 700 * time.Microsecond }, func(j float64) bool { return j > 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRemote()
			var ref, prevTransit float64
			for i := range 300 {
				sent := time.Duration(i) * 20 * time.Millisecond
				at := t0.Add(sent + tc.delay(i))
				ts := uint32(1e6 + i*960)
				arrive(t, s, uint16(i), ts, at)
				transit := at.Sub(t0).Seconds()*opusRate - float64(ts)
				if i > 0 {
					ref += (math.Abs(transit-prevTransit) - ref) / 16
				}
				prevTransit = transit
			}
			b, _ := s.block(t0)
			if !tc.want(ref) {
				t.Fatalf("reference jitter %.2f: the case does not test what it says", ref)
			}
			// The integer form truncates the arrival clock and
			// rounds each step; it stays within a unit or two.
			if math.Abs(float64(b.Jitter)-ref) > 2 {
				t.Fatalf("jitter %d, reference %.2f (48 kHz units)", b.Jitter, ref)
			}
		})
	}
}

// TestLSRDLSR: a block echoes the middle 32 bits of the source's last SR
// and the delay since it arrived, in 1/65536 s (§6.4.1); RoundTrip turns
// the echo back into the round trip.
func TestLSRDLSR(t *testing.T) {
	s := newRemote()
	arrive(t, s, 1, 960, t0)
	if b, _ := s.block(t0); b.LastSenderReport != 0 || b.Delay != 0 {
		t.Fatalf("no SR yet: LSR %#x DLSR %d, want 0, 0", b.LastSenderReport, b.Delay)
	}
	remoteClock := t0.Add(-3 * time.Second) // the source's clock is 3 s behind
	sr := NTPTime(remoteClock)
	srArrived := t0.Add(10 * time.Millisecond)
	s.senderReport(sr, srArrived)
	at := srArrived.Add(1500 * time.Millisecond)
	b, _ := s.block(at)
	if b.LastSenderReport != uint32(sr>>16) {
		t.Fatalf("LSR %#x, want %#x", b.LastSenderReport, uint32(sr>>16))
	}
	if want := uint32(1.5 * 65536); b.Delay != want {
		t.Fatalf("DLSR %d, want %d", b.Delay, want)
	}
	// The block reaches the source 40 ms after it left: the source's
	// clock then reads remoteClock + 10 ms (one way) + 1.5 s + 40 ms.
	back := remoteClock.Add(10*time.Millisecond + 1500*time.Millisecond + 40*time.Millisecond)
	rtt, ok := RoundTrip(b, back)
	if !ok || (rtt-50*time.Millisecond).Abs() > 100*time.Microsecond {
		t.Fatalf("round trip %v %v, want 50ms", rtt, ok)
	}
	if _, ok := RoundTrip(rtcp.ReceptionReport{}, back); ok {
		t.Fatal("round trip from a block with no LSR")
	}
	if _, ok := RoundTrip(b, remoteClock); ok { // earlier than the SR: negative
		t.Fatal("negative round trip accepted")
	}
}

// TestSenderReport: packet and octet counts, and the RTP timestamp
// extrapolated to the report's NTP time.
func TestSenderReport(t *testing.T) {
	s := &localStream{ssrc: 7, clockRate: opusRate}
	if _, ok := s.senderReport(t0); ok {
		t.Fatal("SR before any packet")
	}
	at := t0
	for i := range 50 {
		s.sent(uint16(100+i), uint32(5000+i*960), 60+i%3, at)
		at = at.Add(20 * time.Millisecond)
	}
	s.sent(90, 1, 60, at) // a late write (a lower seq) counts but does not move the timestamp pair
	last := at.Add(-20 * time.Millisecond)
	now := last.Add(100 * time.Millisecond)
	sr, ok := s.senderReport(now)
	if !ok {
		t.Fatal("no SR")
	}
	wantOctets := uint32(0)
	for i := range 50 {
		wantOctets += uint32(60 + i%3)
	}
	wantOctets += 60
	if sr.SSRC != 7 || sr.PacketCount != 51 || sr.OctetCount != wantOctets {
		t.Fatalf("SR ssrc %d packets %d octets %d, want 7, 51, %d", sr.SSRC, sr.PacketCount, sr.OctetCount, wantOctets)
	}
	if want := uint32(5000 + 49*960 + 4800); sr.RTPTime != want {
		t.Fatalf("RTP time %d, want %d (last + 100 ms at 48 kHz)", sr.RTPTime, want)
	}
	if sr.NTPTime != NTPTime(now) {
		t.Fatalf("NTP time %#x, want %#x", sr.NTPTime, NTPTime(now))
	}
}

func TestNTPTime(t *testing.T) {
	// 2026-12-01 20:00:00.5 UTC: 3973521600 s since 1900, half a second.
	got := NTPTime(t0.Add(500 * time.Millisecond))
	if want := uint64(t0.Unix()+2208988800)<<32 | 1<<31; got != want {
		t.Fatalf("NTPTime %#x, want %#x", got, want)
	}
}

// rtcpCapture is an RTCP writer that keeps what is written, marshalled
// and parsed back as a peer would.
type rtcpCapture struct {
	mu   sync.Mutex
	pkts [][]rtcp.Packet
	got  chan struct{}
}

func (c *rtcpCapture) Write(pkts []rtcp.Packet, _ interceptor.Attributes) (int, error) {
	b, err := rtcp.Marshal(pkts)
	if err != nil {
		return 0, err
	}
	back, err := rtcp.Unmarshal(b)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.pkts = append(c.pkts, back)
	c.mu.Unlock()
	select {
	case c.got <- struct{}{}:
	default:
	}
	return len(b), nil
}

// TestInterceptor: streams bound through Pion's interceptor interfaces,
// fed real RTP both ways, give an SR with a report block on the wire from
// the generator's own clock, until the interceptor closes.
func TestInterceptor(t *testing.T) {
	g := NewGenerator(100 * time.Millisecond)
	defer g.Close()
	var reg interceptor.Registry
	reg.Add(g)
	chain, err := reg.Build("pc")
	if err != nil {
		t.Fatal(err)
	}
	capture := &rtcpCapture{got: make(chan struct{}, 1)}
	chain.BindRTCPWriter(capture)

	out := chain.BindLocalStream(&interceptor.StreamInfo{SSRC: 11, ClockRate: opusRate}, interceptor.RTPWriterFunc(
		func(h *rtp.Header, p []byte, _ interceptor.Attributes) (int, error) { return len(p), nil }))
	next := uint16(0)
	in := chain.BindRemoteStream(&interceptor.StreamInfo{SSRC: 22, ClockRate: opusRate}, interceptor.RTPReaderFunc(
		func(b []byte, a interceptor.Attributes) (int, interceptor.Attributes, error) {
			p := wire(t, next, uint32(next)*960)
			next += 2 // every other packet lost
			return copy(b, p), a, nil
		}))
	buf := make([]byte, 1500)
	for i := range 10 {
		if _, err := out.Write(&rtp.Header{Version: 2, SSRC: 11, SequenceNumber: uint16(i), Timestamp: uint32(i * 960)}, make([]byte, 80), nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := in.Read(buf, nil); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-capture.got:
	case <-time.After(5 * time.Second):
		t.Fatal("no report within 5 s")
	}
	capture.mu.Lock()
	first := capture.pkts[0]
	capture.mu.Unlock()
	checkTenSentHalfLost(t, first)
	if err := chain.Close(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, w := range g.wheel {
		if len(w) != 0 {
			t.Fatal("a closed interceptor is still in the wheel")
		}
	}
}

// checkTenSentHalfLost checks that a report is one SR from SSRC 11 that
// sent 10 packets of 80 bytes, with one block for SSRC 22 whose highest
// sequence number is 18 and 9 of whose packets were lost: what both
// TestInterceptor and TestDirect send and receive.
func checkTenSentHalfLost(t *testing.T, report []rtcp.Packet) {
	t.Helper()
	if len(report) != 1 {
		t.Fatalf("report %v, want one SR", report)
	}
	sr, ok := report[0].(*rtcp.SenderReport)
	if !ok {
		t.Fatalf("report %v, want one SR", report)
	}
	if sr.SSRC != 11 || sr.PacketCount != 10 || sr.OctetCount != 800 || len(sr.Reports) != 1 {
		t.Fatalf("SR %+v, want ssrc 11, 10 packets, 800 octets, one block", sr)
	}
	if b := sr.Reports[0]; b.SSRC != 22 || b.LastSequenceNumber != 18 || b.TotalLost != 9 {
		t.Fatalf("block %+v, want ssrc 22, highest 18, 9 lost", b)
	}
}

// TestDirect: the same streams reported without Pion's interceptor
// chain (AddLocalStream, AddRemoteStream, Start), as internal/transceiver
// does, give the same SR and block.
func TestDirect(t *testing.T) {
	g := NewGenerator(100 * time.Millisecond)
	defer g.Close()
	i := g.New()
	got := make(chan []rtcp.Packet, 4)
	i.Start(func(pkts []rtcp.Packet) error {
		select {
		case got <- pkts:
		default:
		}
		return nil
	})
	out := i.AddLocalStream(11, opusRate)
	in := i.AddRemoteStream(22, opusRate)
	now := time.Now()
	for k := range 10 {
		out.Sent(uint16(k), uint32(k*960), 80, now)
		in.Received(wire(t, uint16(2*k), uint32(2*k)*960), now)
	}
	in.Received([]byte{0x80, 1, 2}, now) // too short: ignored
	var first []rtcp.Packet
	select {
	case first = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no report within 5 s")
	}
	checkTenSentHalfLost(t, first)
	if err := i.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReceiverReportOnly: with nothing sent, the blocks go in an RR
// whose sender SSRC is the local stream's.
func TestReceiverReportOnly(t *testing.T) {
	g := NewGenerator(time.Hour)
	defer g.Close()
	i := g.New()
	i.BindLocalStream(&interceptor.StreamInfo{SSRC: 5, ClockRate: opusRate}, nil)
	s := &remoteStream{ssrc: 6, clockRate: opusRate, epoch: t0}
	i.remote = append(i.remote, s)
	if pkts := i.reports(t0); pkts != nil {
		t.Fatalf("reports before anything moved: %v", pkts)
	}
	arrive(t, s, 1, 960, t0)
	pkts := i.reports(t0)
	rr, ok := pkts[0].(*rtcp.ReceiverReport)
	if len(pkts) != 1 || !ok || rr.SSRC != 5 || len(rr.Reports) != 1 || rr.Reports[0].SSRC != 6 {
		t.Fatalf("reports %v, want one RR from 5 about 6", pkts)
	}
	i.SetCNAME("abc")
	pkts = i.reports(t0)
	sdes, ok := pkts[len(pkts)-1].(*rtcp.SourceDescription)
	if len(pkts) != 2 || !ok || len(sdes.Chunks) != 1 || sdes.Chunks[0].Source != 5 ||
		len(sdes.Chunks[0].Items) != 1 || sdes.Chunks[0].Items[0].Type != rtcp.SDESCNAME || sdes.Chunks[0].Items[0].Text != "abc" {
		t.Fatalf("reports %v, want the RR then an SDES with CNAME abc for 5", pkts)
	}
	if err := i.report(t0); err != errNoWriter {
		t.Fatalf("report with no writer: %v", err)
	}
}

// TestAgainstPionReceiver: fed the same packets at the same arrival
// times, our reception report block says what Pion's receiver-report
// interceptor says: extended highest sequence number across a wrap,
// cumulative loss, and interarrival jitter (Pion's in floating point,
// ours in A.8's integer form: within 2 units). The stream is in order
// with gaps: on duplicates and reordering the two count differently
// (RFC 3550 A.3 counts a duplicate as received; Pion's bitmap does not).
func TestAgainstPionReceiver(t *testing.T) {
	var mu sync.Mutex
	now := t0
	f, err := report.NewReceiverInterceptor(report.ReceiverInterval(50*time.Millisecond), report.ReceiverNow(func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}))
	if err != nil {
		t.Fatal(err)
	}
	pion, err := f.NewInterceptor("")
	if err != nil {
		t.Fatal(err)
	}
	defer pion.Close()
	capture := &rtcpCapture{got: make(chan struct{}, 1)}
	pion.BindRTCPWriter(capture)

	// 600 packets from seq 65200 (wrapping after 336), 20 ms apart
	// with a deterministic network delay of 0–9 ms, a burst of 7 lost
	// and every 13th lost.
	type pkt struct {
		b  []byte
		at time.Time
	}
	var pkts []pkt
	for i := range 600 {
		if i%13 == 12 || (i >= 200 && i < 207) {
			continue
		}
		delay := time.Duration((i*7919)%10) * time.Millisecond
		pkts = append(pkts, pkt{wire(t, uint16(65200+i), uint32(3e9)+uint32(i*960)), t0.Add(time.Duration(i)*20*time.Millisecond + delay)})
	}
	next := 0
	in := pion.BindRemoteStream(&interceptor.StreamInfo{SSRC: 0x1234, ClockRate: opusRate}, interceptor.RTPReaderFunc(
		func(b []byte, a interceptor.Attributes) (int, interceptor.Attributes, error) {
			return copy(b, pkts[next].b), a, nil
		}))
	ours := newRemote()
	buf := make([]byte, 1500)
	for next = range pkts {
		mu.Lock()
		now = pkts[next].at
		mu.Unlock()
		if _, _, err := in.Read(buf, nil); err != nil {
			t.Fatal(err)
		}
		seq, ts, _ := rtpSeqTS(pkts[next].b)
		ours.receivedPacket(seq, ts, pkts[next].at)
	}
	want, _ := ours.block(now)
	// Pion reports on its own ticker: wait for a report that covers
	// every packet (its counts are cumulative, whatever it reported in
	// between).
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-capture.got:
		case <-deadline:
			t.Fatal("no report from Pion's receiver interceptor covering every packet within 10 s")
		}
		capture.mu.Lock()
		last := capture.pkts[len(capture.pkts)-1]
		capture.mu.Unlock()
		rr, ok := last[0].(*rtcp.ReceiverReport)
		if !ok || len(rr.Reports) != 1 || rr.Reports[0].LastSequenceNumber != want.LastSequenceNumber {
			continue
		}
		got := rr.Reports[0]
		if got.TotalLost != want.TotalLost {
			t.Fatalf("cumulative lost: Pion %d, ours %d", got.TotalLost, want.TotalLost)
		}
		if d := int64(got.Jitter) - int64(want.Jitter); d < -2 || d > 2 {
			t.Fatalf("jitter: Pion %d, ours %d (48 kHz units)", got.Jitter, want.Jitter)
		}
		// And both are right: one wrap, 7 + 46 lost, jitter from a
		// 0–9 ms delay spread.
		if want.LastSequenceNumber != 65200+599 || want.TotalLost != 7+46 || want.Jitter < 48 {
			t.Fatalf("ours: highest %d lost %d jitter %d, want 65799, 53, a few ms", want.LastSequenceNumber, want.TotalLost, want.Jitter)
		}
		return
	}
}

// TestGeneratorLazy: a Generator nobody used holds no goroutine (goleak
// in TestMain checks), and Close is idempotent either way.
func TestGeneratorLazy(t *testing.T) {
	g := NewGenerator(0)
	if g.Interval() != DefaultInterval {
		t.Fatalf("interval %v, want %v", g.Interval(), DefaultInterval)
	}
	g.Close()
	g.Close()
	used := NewGenerator(time.Second)
	used.New().BindRTCPWriter(&rtcpCapture{got: make(chan struct{}, 1)})
	used.Close()
	used.Close()
	// An interceptor bound after Close does not restart it.
	used.New().BindRTCPWriter(&rtcpCapture{got: make(chan struct{}, 1)})
}

// wheelLen is the number of interceptors in g's wheel.
func wheelLen(g *Generator) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, w := range g.wheel {
		n += len(w)
	}
	return n
}

// TestBindCloseRace: an Interceptor closed between BindRTCPWriter's
// release of its lock and its join of the wheel stays out of the wheel
// (the interleaving, then the same race run for real under -race).
func TestBindCloseRace(t *testing.T) {
	g := NewGenerator(time.Hour)
	defer g.Close()

	// BindRTCPWriter's first half: the writer is set, join not yet
	// called. Close runs in full, then join.
	i := g.New()
	i.mu.Lock()
	i.writer = &rtcpCapture{got: make(chan struct{}, 1)}
	i.mu.Unlock()
	if err := i.Close(); err != nil {
		t.Fatal(err)
	}
	g.join(i)
	if n := wheelLen(g); n != 0 {
		t.Fatalf("%d closed interceptors in the wheel, want 0", n)
	}

	var wg sync.WaitGroup
	for range 200 {
		i := g.New()
		wg.Add(2)
		go func() {
			defer wg.Done()
			i.BindRTCPWriter(&rtcpCapture{got: make(chan struct{}, 1)})
		}()
		go func() {
			defer wg.Done()
			_ = i.Close()
		}()
	}
	wg.Wait()
	if n := wheelLen(g); n != 0 {
		t.Fatalf("%d closed interceptors in the wheel, want 0", n)
	}
}

// TestDLSRClamp: the delay since the last SR saturates at the DLSR
// field's largest value (16.16 s, RFC 3550 §6.4.1) instead of wrapping
// or overflowing, for a source that keeps sending RTP but stops sending
// SRs.
func TestDLSRClamp(t *testing.T) {
	for _, tc := range []struct {
		since time.Duration
		want  uint32
	}{
		{0, 0},
		{-time.Second, 0}, // an SR stamped after the report: a stepped clock
		{10 * time.Hour, 10 * 3600 * 65536},
		{65535 * time.Second, 65535 << 16},
		{65536 * time.Second, math.MaxUint32},
		{40 * time.Hour, math.MaxUint32}, // d × 65536 ns overflows an int64 here
		{1000 * time.Hour, math.MaxUint32},
	} {
		s := newRemote()
		arrive(t, s, 1, 960, t0)
		s.senderReport(NTPTime(t0), t0)
		b, _ := s.block(t0.Add(tc.since))
		if b.Delay != tc.want {
			t.Errorf("DLSR %v after the SR: %#x, want %#x", tc.since, b.Delay, tc.want)
		}
	}
}

// TestFractionLostAllLost: an interval in which every expected packet
// was lost reads 255/256, not 0 (the 8-bit field's wrap). The trackers
// cannot reach that state from packets (expected moves only with a
// received one); it is set up by hand.
func TestFractionLostAllLost(t *testing.T) {
	s := newRemote()
	arrive(t, s, 1, 960, t0)
	if b, _ := s.block(t0); b.FractionLost != 0 {
		t.Fatalf("fraction lost %d, want 0", b.FractionLost)
	}
	s.maxSeq += 10 // ten more expected, none received
	b, _ := s.block(t0)
	if b.FractionLost != 255 || b.TotalLost != 10 {
		t.Fatalf("fraction lost %d, total %d, want 255, 10", b.FractionLost, b.TotalLost)
	}
}

// TestMaxBlocks: one report holds at most 31 blocks (the 5-bit count),
// and a stream left out keeps its interval (A.3 priors) for a later
// report instead of losing it to a block that was never sent.
func TestMaxBlocks(t *testing.T) {
	g := NewGenerator(time.Hour)
	defer g.Close()
	i := g.New()
	var streams []*remoteStream
	for k := range maxBlocks + 2 {
		s := &remoteStream{ssrc: uint32(100 + k), clockRate: opusRate, epoch: t0}
		arrive(t, s, 1, 960, t0)
		arrive(t, s, 3, 2*960, t0.Add(40*time.Millisecond)) // seq 2 lost
		streams = append(streams, s)
	}
	i.remote = streams
	pkts := i.reports(t0.Add(time.Second))
	rr, ok := pkts[0].(*rtcp.ReceiverReport)
	if len(pkts) != 1 || !ok || len(rr.Reports) != maxBlocks {
		t.Fatalf("reports %v, want one RR with %d blocks", pkts, maxBlocks)
	}
	if _, err := rtcp.Marshal(pkts); err != nil {
		t.Fatal(err)
	}
	for _, s := range streams[maxBlocks:] {
		if s.expectedPrior != 0 || s.receivedPrior != 0 {
			t.Fatalf("stream %d, left out of the report, had its interval started: priors %d, %d", s.ssrc, s.expectedPrior, s.receivedPrior)
		}
		if b, _ := s.block(t0.Add(time.Second)); b.FractionLost != 256/3 {
			t.Fatalf("stream %d's next block: fraction lost %d, want %d (1 of 3)", s.ssrc, b.FractionLost, 256/3)
		}
	}
}
