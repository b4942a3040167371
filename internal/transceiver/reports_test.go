package transceiver

import (
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pion/interceptor"
	"github.com/pion/interceptor/pkg/stats"
	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// histogram reads a histogram's sample count and sum.
func histogram(t *testing.T, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestRTCPReportsWithPionClient: a Pion client with Pion's own report and
// stats interceptors calls the transceiver, sends audio with every tenth
// packet missing and reads the echo. The transceiver's reports
// (rtcpreport, from the shared generator) must give the client what
// Pion's report interceptors would: a round trip from our report blocks'
// LSR/DLSR, its loss, and our sender counts; and the client's reports must
// give the transceiver its round-trip metric (our SR's NTP time echoed).
// One malformed RTCP packet from the client is dropped and counted, and
// none of its well-formed ones are.
func TestRTCPReportsWithPionClient(t *testing.T) {
	s, apiURL := directServer(t, func(c *Config) { c.ReportInterval = 200 * time.Millisecond })

	var me webrtc.MediaEngine
	if err := me.RegisterDefaultCodecs(); err != nil {
		t.Fatal(err)
	}
	var ir interceptor.Registry
	sf, err := stats.NewInterceptor()
	if err != nil {
		t.Fatal(err)
	}
	getters := make(chan stats.Getter, 1)
	sf.OnNewPeerConnection(func(_ string, g stats.Getter) { getters <- g })
	ir.Add(sf)
	// After the stats interceptor, so that it sees the SRs the report
	// interceptor writes (the chain wraps the writer in order).
	if err := webrtc.ConfigureRTCPReports(&ir); err != nil {
		t.Fatal(err)
	}
	var se webrtc.SettingEngine
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	pc, err := webrtc.NewAPI(webrtc.WithMediaEngine(&me), webrtc.WithInterceptorRegistry(&ir), webrtc.WithSettingEngine(se)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	getter := <-getters

	track, err := webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "client")
	if err != nil {
		t.Fatal(err)
	}
	sender, err := pc.AddTrack(track)
	if err != nil {
		t.Fatal(err)
	}
	clientSSRC := uint32(sender.GetParameters().Encodings[0].SSRC)
	if _, err := pc.CreateDataChannel(EventsLabel, nil); err != nil {
		t.Fatal(err)
	}
	// The client's interceptors see RTCP only as it is read.
	drain := func(r interface {
		Read([]byte) (int, interceptor.Attributes, error)
	}) {
		buf := make([]byte, 1500)
		for {
			if _, _, err := r.Read(buf); err != nil {
				return
			}
		}
	}
	go drain(sender)
	echoSSRC := make(chan uint32, 1)
	pc.OnTrack(func(tr *webrtc.TrackRemote, recv *webrtc.RTPReceiver) {
		echoSSRC <- uint32(tr.SSRC())
		go drain(recv)
		for {
			if _, _, err := tr.ReadRTP(); err != nil {
				return
			}
		}
	})
	connected := make(chan struct{})
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		if st == webrtc.PeerConnectionStateConnected {
			close(connected)
		}
	})
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	<-gathered
	resp, err := http.Post(apiURL+"/v1/calls", "application/sdp", strings.NewReader(pc.LocalDescription().SDP))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("offer: status %d: %s", resp.StatusCode, answer)
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(answer)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, connected, 10*time.Second, "connection")

	// 20 ms Opus packets (one 20 ms frame, TOC configuration 15), every
	// tenth never sent, until both sides have what they need.
	payload := make([]byte, 60)
	payload[0] = 15 << 3
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	var echo uint32
	for seq := uint16(0); ; seq++ {
		select {
		case <-tick.C:
		case <-deadline:
			n, _ := histogram(t, s.metrics.rtt)
			t.Fatalf("after 20 s: transceiver RTT samples %d, malformed RTCP %v; client sees %+v and %+v", n,
				testutil.ToFloat64(s.metrics.rtcpDropped.WithLabelValues(rtcpMalformed)), getter.Get(clientSSRC), getter.Get(echo))
		}
		if seq%10 != 9 {
			if err := track.WriteRTP(&rtp.Packet{Header: rtp.Header{Version: 2, SequenceNumber: seq, Timestamp: uint32(seq) * 960}, Payload: payload}); err != nil {
				t.Fatal(err)
			}
		}
		if echo == 0 {
			select {
			case echo = <-echoSSRC:
			default:
				continue
			}
			// Transport-wide congestion control feedback (RFC 4585
			// 6.1, FMT 15) about our audio with only its SSRCs:
			// SRTCP finds where it goes, a full parse fails.
			bad := rtcp.RawPacket{0x80 | 15, byte(rtcp.TypeTransportSpecificFeedback), 0, 2, 0, 0, 0, 0, 0, 0, 0, 0}
			binary.BigEndian.PutUint32(bad[4:], clientSSRC)
			binary.BigEndian.PutUint32(bad[8:], echo)
			if err := pc.WriteRTCP([]rtcp.Packet{&bad}); err != nil {
				t.Fatal(err)
			}
		}
		if seq%25 != 0 {
			continue
		}
		rtts, sum := histogram(t, s.metrics.rtt)
		out, in := getter.Get(clientSSRC), getter.Get(echo)
		if rtts == 0 || out == nil || in == nil {
			continue
		}
		ri, ro := out.RemoteInboundRTPStreamStats, in.RemoteOutboundRTPStreamStats
		// Wait for a block covering 100 packets or more, after the
		// first round trip. The client derives PacketsReceived from the
		// block: its extended highest sequence number less its
		// cumulative loss, so received + lost is what the block
		// expected, however the report intervals fell.
		expected := int64(ri.PacketsReceived) + ri.PacketsLost
		dropped := testutil.ToFloat64(s.metrics.rtcpDropped.WithLabelValues(rtcpMalformed))
		if ri.RoundTripTimeMeasurements < 2 || expected < 100 || ro.PacketsSent == 0 || dropped == 0 {
			continue
		}
		if dropped != 1 {
			t.Fatalf("%v client RTCP packets dropped as malformed, want 1", dropped)
		}
		if mean := sum / float64(rtts); mean <= 0 || mean > 0.5 {
			t.Fatalf("transceiver RTT mean %.4f s over %d samples: not a loopback round trip", mean, rtts)
		}
		if ri.RoundTripTime <= 0 || ri.RoundTripTime > 500*time.Millisecond {
			t.Fatalf("client's RTT from our report blocks: %v", ri.RoundTripTime)
		}
		// Every tenth packet never sent: a tenth of what the block
		// expected is lost, give or take the one gap at either end
		// (and one more for a packet lost on loopback, which nothing
		// here expects).
		if want := expected / 10; ri.PacketsLost < want-1 || ri.PacketsLost > want+2 {
			t.Fatalf("our block says %d lost of %d expected, want about %d (every tenth)", ri.PacketsLost, expected, want)
		}
		if sent := out.OutboundRTPStreamStats.PacketsSent; expected-ri.PacketsLost > int64(sent) {
			t.Fatalf("our block says %d received of the client's %d sent", expected-ri.PacketsLost, sent)
		}
		// The session's call quality, once at its end: the client's
		// reports about our audio (the echo, none of it lost). The
		// session leaves the table before its teardown records them,
		// so wait for the teardown's last histogram too.
		_ = pc.Close()
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if n, _ := histogram(t, s.metrics.sessionRTT); s.Sessions() == 0 && n > 0 {
				break
			}
			if time.Now().After(end) {
				t.Errorf("10 s after the client closed: %d sessions, call quality not recorded", s.Sessions())
				break
			}
		}
		for _, h := range []struct {
			name     string
			h        prometheus.Histogram
			min, max float64
		}{
			{"session_rtt_seconds", s.metrics.sessionRTT, 1e-6, 0.5},
			{"session_jitter_seconds", s.metrics.sessionJitter, 0, 0.1},
			{"session_loss_ratio", s.metrics.sessionLoss, 0, 0.02},
		} {
			if n, v := histogram(t, h.h); n != 1 || v < h.min || v > h.max {
				t.Errorf("%s: %d samples, sum %v; want the one session's, from %v to %v", h.name, n, v, h.min, h.max)
			}
		}
		return
	}
}

// TestCallQualitySummary: a session's figure is the mean round trip and
// jitter over its reports and the last report's cumulative loss over the
// packets sent up to it, counted from the first sequence number sent
// across a wrap.
func TestCallQualitySummary(t *testing.T) {
	var q callQuality
	if n, _, _, _, _ := q.summary(0); n != 0 {
		t.Fatalf("no reports: %d", n)
	}
	q.add(rtcp.ReceptionReport{TotalLost: 2, LastSequenceNumber: 65535}, 0.002, 0, false)
	q.add(rtcp.ReceptionReport{TotalLost: 5, LastSequenceNumber: 1<<16 | 99}, 0.004, 40*time.Millisecond, true)
	q.add(rtcp.ReceptionReport{TotalLost: 5, LastSequenceNumber: 1<<16 | 149}, 0.006, 60*time.Millisecond, true)
	n, rtt, ok, jitter, loss := q.summary(65500) // 36 + 150 = 186 packets expected
	if n != 3 || !ok || rtt != 50*time.Millisecond || jitter < 0.00399 || jitter > 0.00401 || loss < 5.0/186-1e-9 || loss > 5.0/186+1e-9 {
		t.Fatalf("summary = %d reports, rtt %v (%v), jitter %v, loss %v; want 3, 50ms, 4ms, 5/186", n, rtt, ok, jitter, loss)
	}
}

// TestCallQualityDuplicates: the cumulative number of packets lost is a
// signed 24-bit field, negative when the client received duplicates
// (RFC 3550 §6.4.1): a session whose client got more packets than were
// sent lost none, not all.
func TestCallQualityDuplicates(t *testing.T) {
	var q callQuality
	q.add(rtcp.ReceptionReport{TotalLost: 1<<24 - 3, LastSequenceNumber: 1099}, 0.002, 0, false) // −3
	if _, _, _, _, loss := q.summary(100); loss != 0 {
		t.Errorf("loss %v with 3 duplicates, want 0", loss)
	}
	q.add(rtcp.ReceptionReport{TotalLost: 10, LastSequenceNumber: 1099}, 0.002, 0, false)
	if _, _, _, _, loss := q.summary(100); loss != 0.01 {
		t.Errorf("loss %v with 10 of 1000 lost, want 0.01", loss)
	}
}
