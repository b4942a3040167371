package transceiver

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRTPHeader(t *testing.T) {
	rtpPkt := []byte{0x80, 111, 0x12, 0x34, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef, 0xfc}
	ssrc, seq, ok := rtpHeader(rtpPkt)
	if !ok || ssrc != 0xdeadbeef || seq != 0x1234 {
		t.Fatalf("RTP: got %x %x %v", ssrc, seq, ok)
	}
	rr := []byte{0x81, 201, 0, 7, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0}
	stunPkt := []byte{0, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42, 0, 0, 0, 0}
	dtls := []byte{22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	for name, b := range map[string][]byte{"RTCP RR": rr, "STUN": stunPkt, "DTLS": dtls, "short": rtpPkt[:11]} {
		if _, _, ok := rtpHeader(b); ok {
			t.Errorf("%s taken for RTP", name)
		}
	}
}

func TestDelayTable(t *testing.T) {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "d", Buckets: delayBuckets}, []string{"direction"})
	p := newDelayProbe(h)
	p.toBackend.enter(7, 16) // sampled
	p.toBackend.enter(7, 17) // not sampled
	p.toBackend.leave(7, 17) // not sampled
	p.toBackend.leave(8, 16) // another SSRC: never entered
	p.toBackend.leave(7, 16) // observed
	p.toBackend.leave(7, 16) // already observed
	p.toClient.leave(7, 24)  // never entered
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	count := func(dir string) uint64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == dir {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
		t.Fatalf("no series for %s", dir)
		return 0
	}
	if got := count(dirToBackend); got != 1 {
		t.Fatalf("to_backend observations %d, want 1", got)
	}
	if got := count(dirToClient); got != 0 {
		t.Fatalf("to_client observations %d, want 0", got)
	}
}
