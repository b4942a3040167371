package callclient

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

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
	}
	s := Summarize(LoadOptions{URLs: []string{"http://x"}, Duration: 2 * time.Second}, results, time.Second)
	if s.Sessions != 3 || s.Connected != 2 || s.OK != 1 || s.Failures[FailSignaling] != 1 || s.Failures[FailDataChannel] != 1 {
		t.Fatalf("counts: %+v", s)
	}
	if s.PacketsSent != 200 || s.PacketsReceived != 190 || s.Loss < 0.0499 || s.Loss > 0.0501 {
		t.Fatalf("packets: %+v", s)
	}
	if s.SetupMS != (Distribution{N: 2, P50: 10, P99: 30, Max: 30}) || s.MaxGapMS.P99 != 200 {
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
