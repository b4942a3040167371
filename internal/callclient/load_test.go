package callclient

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/audio"
)

func TestExtendSeq(t *testing.T) {
	tests := []struct {
		maxExt uint64
		any    bool
		seq    uint16
		want   uint64
	}{
		{0, false, 7, 7},
		{10, true, 11, 11},
		{10, true, 5, 5},                    // late
		{65535, true, 0, 65536},             // wrap forward
		{65536 + 2, true, 65534, 65534},     // late, from before the wrap
		{3<<16 | 100, true, 90, 3<<16 | 90}, // late within a later cycle
		{3<<16 | 65530, true, 4, 4<<16 | 4}, // wrap in a later cycle
	}
	for _, tt := range tests {
		if got := extendSeq(tt.maxExt, tt.any, tt.seq); got != tt.want {
			t.Errorf("extendSeq(%d, %v, %d) = %d, want %d", tt.maxExt, tt.any, tt.seq, got, tt.want)
		}
	}
}

func TestLoadSessionCountsDuplicatesAndReorder(t *testing.T) {
	r := &SessionResult{}
	s := &loadSession{r: r}
	for i, seq := range []uint16{0, 1, 3, 2, 3} {
		s.receive(seq, int64(i))
	}
	if len(s.arrivals) != 4 || r.Duplicates != 1 || r.Reordered != 1 {
		t.Fatalf("arrivals %d, duplicates %d, reordered %d; want 4, 1, 1", len(s.arrivals), r.Duplicates, r.Reordered)
	}
}

func TestSummarize(t *testing.T) {
	results := []SessionResult{
		{ConnectedNS: 1, SetupMS: 10, Sent: 100, Received: 100, MaxGapMS: 20},
		{ConnectedNS: 1, SetupMS: 30, Sent: 100, Received: 90, MaxGapMS: 200, Failure: FailDataChannel},
		{Failure: FailSignaling},
		{ConnectedNS: 1, SetupMS: 20, Sent: 100}, // nothing came back
	}
	s := Summarize(LoadOptions{URLs: []string{"http://x"}, Duration: 2 * time.Second}, results, time.Second)
	if s.Sessions != 4 || s.Connected != 3 || s.OK != 2 || s.NoAudio != 1 || s.Failures[FailSignaling] != 1 || s.Failures[FailDataChannel] != 1 {
		t.Fatalf("counts: %+v", s)
	}
	if s.PacketsSent != 300 || s.PacketsReceived != 190 || s.Loss < 0.3666 || s.Loss > 0.3667 {
		t.Fatalf("packets: %+v", s)
	}
	if s.SetupMS != (Distribution{N: 3, P50: 20, P99: 30, Max: 30}) || s.MaxGapMS != (Distribution{N: 2, P50: 20, P99: 200, Max: 200}) {
		t.Fatalf("distributions: setup %+v gap %+v", s.SetupMS, s.MaxGapMS)
	}
}

func TestNewLoadOptions(t *testing.T) {
	for _, o := range []LoadOptions{
		{Sessions: 1, Duration: time.Second},
		{URLs: []string{"ftp://x"}, Sessions: 1, Duration: time.Second},
		{URLs: []string{"http://x"}, Duration: time.Second},
		{URLs: []string{"http://x"}, Sessions: 1},
		{URLs: []string{"http://x"}, Sessions: 1, Duration: time.Second, Ramp: -1},
	} {
		if _, err := NewLoad(o); !errors.Is(err, ErrOptions) {
			t.Errorf("NewLoad(%+v) = %v, want ErrOptions", o, err)
		}
	}
}

// TestCounterPayloadIsOpus20ms checks that the counter payload parses as
// one 20 ms Opus frame (RFC 6716 §3.1), the duration a transceiver paces
// its echo by, whatever index it carries.
func TestCounterPayloadIsOpus20ms(t *testing.T) {
	p := newCounterPayload()
	for _, idx := range []uint64{0, 1, 255, 1 << 40} {
		binary.BigEndian.PutUint64(p[1:], idx)
		got, err := audio.PacketDuration(p)
		if err != nil {
			t.Fatalf("index %d: %v", idx, err)
		}
		if got != 960 { // 20 ms at 48 kHz
			t.Errorf("index %d: Opus duration %d samples, want 960 (20 ms)", idx, got)
		}
		if i := binary.BigEndian.Uint64(p[1:]); i != idx {
			t.Errorf("index read back %d, want %d", i, idx)
		}
	}
	if len(p) != loadPayloadSize {
		t.Errorf("payload %d bytes, want %d", len(p), loadPayloadSize)
	}
}

// TestLoadVanish runs vanishing sessions against the in-test echo server
// and checks that each connected, then left with nothing said: no DELETE,
// no DTLS close_notify (the server's DTLS transport is still up when its
// ICE agent notices the silence), and a summary that counts them.
func TestLoadVanish(t *testing.T) {
	srv := newEchoServer(t)
	const n = 3
	l, err := NewLoad(LoadOptions{
		URLs: []string{srv.srv.URL + "/v1/calls"}, Sessions: n, Vanish: 300 * time.Millisecond,
		Ramp: 20 * time.Millisecond, SettingEngine: loopbackEngine(),
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := l.Run(t.Context(), nil, 0)
	if sum.Sessions != n || sum.OK != n || sum.Vanished != n || len(sum.Failures) != 0 {
		t.Fatalf("summary %+v, want %d sessions vanished with no failure", sum, n)
	}
	connected := 0
	for _, r := range l.Results() {
		if r.VanishedNS == 0 || r.VanishedNS < r.PostedNS || r.Sent != 0 {
			t.Errorf("session %d: %+v", r.I, r)
		}
		// A session whose DTLS came up before it vanished has a real
		// setup time; one that vanished first has none.
		want := 0.0
		if r.ConnectedNS != 0 {
			connected++
			want = float64(r.ConnectedNS-r.PostedNS) / 1e6
		}
		if r.SetupMS != want || (r.ConnectedNS != 0 && want <= 0) {
			t.Errorf("session %d: setup %v ms, want %v (posted %d, connected %d)", r.I, r.SetupMS, want, r.PostedNS, r.ConnectedNS)
		}
	}
	if connected == 0 {
		t.Errorf("no session connected before vanishing (a random 0 to 300 ms after ICE): setup times untested")
	}
	if sum.Connected != connected || sum.SetupMS.N != connected || sum.SetupMS.P50 <= 0 {
		t.Errorf("summary: %d connected, setup %+v; want %d sessions with setup times above 0", sum.Connected, sum.SetupMS, connected)
	}
	srv.mu.Lock()
	deleted := len(srv.deleted)
	pcs := make([]*webrtc.PeerConnection, 0, len(srv.pcs))
	for _, pc := range srv.pcs {
		pcs = append(pcs, pc)
	}
	srv.mu.Unlock()
	if deleted != 0 || len(pcs) != n {
		t.Fatalf("server: %d DELETEs, %d sessions left; want 0 and %d", deleted, len(pcs), n)
	}
	// Pion's ICE agent calls a silent peer disconnected after 5 s.
	deadline := time.Now().Add(15 * time.Second)
	for _, pc := range pcs {
		for pc.ICEConnectionState() != webrtc.ICEConnectionStateDisconnected && pc.ICEConnectionState() != webrtc.ICEConnectionStateFailed {
			if time.Now().After(deadline) {
				t.Fatalf("server session still %v 15 s after its client vanished", pc.ICEConnectionState())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if st := pc.SCTP().Transport().State(); st == webrtc.DTLSTransportStateClosed {
			t.Errorf("server DTLS transport %v: the client said goodbye", st)
		}
	}
}
