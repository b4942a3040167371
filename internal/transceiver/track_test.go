package transceiver

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/interceptor"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// badPadding is a Pion interceptor (its own factory) that sets the P bit
// on the outgoing RTP packet whose sequence number is bad-1 (0: none),
// leaving the payload as it is. The receiver then reads the payload's
// last byte as the padding count (RFC 3550 §5.1); the test's payloads end
// in a byte larger than the payload, so the packet does not parse. It is
// bound before SRTP, which authenticates the packet as sent.
type badPadding struct {
	interceptor.NoOp
	bad atomic.Uint32
}

func (b *badPadding) NewInterceptor(string) (interceptor.Interceptor, error) { return b, nil }

func (b *badPadding) BindLocalStream(_ *interceptor.StreamInfo, w interceptor.RTPWriter) interceptor.RTPWriter {
	return interceptor.RTPWriterFunc(func(h *rtp.Header, payload []byte, a interceptor.Attributes) (int, error) {
		if uint32(h.SequenceNumber)+1 == b.bad.Load() {
			// Padding with a PaddingSize of 0: Pion marshals the header
			// with the P bit and the payload unchanged, adding no padding.
			hh := *h
			hh.Padding = true
			return w.Write(&hh, payload, a)
		}
		return w.Write(h, payload, a)
	})
}

// TestUnparsableRTPDropped: an RTP packet that SRTP authenticates but that
// does not parse (its padding count is larger than its payload) is
// dropped and counted as client_audio_dropped{invalid_rtp}, and the
// track's next packet still reaches the backend: the read loop goes on.
func TestUnparsableRTPDropped(t *testing.T) {
	frames := make(chan uint16, 1024) // the seq of each audio frame the backend gets
	backend := backendFunc(t, func(sc *bridge.ServerConn) {
		serveAudio(t, sc, func(a *bridge.AudioFrame) error {
			select {
			case frames <- a.Seq:
			default:
			}
			return nil
		})
	})
	s, api := directServer(t, func(c *Config) { c.BackendURL = backend })

	corrupt := &badPadding{}
	var me webrtc.MediaEngine
	if err := me.RegisterDefaultCodecs(); err != nil {
		t.Fatal(err)
	}
	var ir interceptor.Registry
	ir.Add(corrupt)
	var se webrtc.SettingEngine
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	pc, err := webrtc.NewAPI(webrtc.WithMediaEngine(&me), webrtc.WithInterceptorRegistry(&ir), webrtc.WithSettingEngine(se)).
		NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	track := addOpusTrack(t, pc)
	if _, err := pc.CreateDataChannel(EventsLabel, nil); err != nil {
		t.Fatal(err)
	}
	connected := whenConnected(pc)
	offerCall(t, api, pc)
	waitFor(t, connected, 10*time.Second, "the client's connection")

	// A 20 ms Opus silence frame (RFC 6716 §3.1: CELT fullband, one
	// frame); its last byte, 0xfe, read as a padding count, is far larger
	// than the 3-byte payload.
	payload := []byte{0xf8, 0xff, 0xfe}
	seq := uint16(0)
	send := func() {
		t.Helper()
		p := &rtp.Packet{Header: rtp.Header{Version: 2, SequenceNumber: seq, Timestamp: uint32(seq) * 960}, Payload: payload}
		if err := track.WriteRTP(p); err != nil {
			t.Fatal(err)
		}
		seq++
	}
	dropped := s.metrics.clientAudioDropped.WithLabelValues("invalid_rtp")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second) // liveness bound, not a latency assertion
	var bad uint16
	for {
		select {
		case got := <-frames:
			if corrupt.bad.Load() == 0 {
				// Audio flows: the next packet is the bad one.
				bad = seq
				corrupt.bad.Store(uint32(bad) + 1)
				send()
				continue
			}
			if got == bad {
				t.Fatalf("the backend got the unparsable packet (seq %d)", bad)
			}
			if got == bad+1 {
				if n := testutil.ToFloat64(dropped); n != 1 {
					t.Fatalf("client_audio_dropped{invalid_rtp} = %v, want 1", n)
				}
				return
			}
		case <-tick.C:
			send()
		case <-deadline:
			t.Fatalf("the backend did not get seq %d, the packet after the unparsable one (seq %d; invalid_rtp = %v)",
				bad+1, bad, testutil.ToFloat64(dropped))
		}
	}
}
