package transceiver

import (
	"bufio"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/apm"
	"github.com/switchboard-rtc/switchboard/internal/audio"
)

func TestParseCleaning(t *testing.T) {
	for _, tc := range []struct {
		name      string
		raw       string
		interrupt bool
		want      cleanSetting
		err       bool
	}{
		{"default with interruption", `{"type":"server_vad"}`, true, cleanSetting{echo: defaultEchoCancellation, guard: defaultEchoCancellation}, false},
		{"default without interruption", `{"type":"server_vad","interrupt_response":false}`, false, cleanSetting{}, false},
		{"off", `{"echo_cancellation":null}`, true, cleanSetting{}, false},
		{"on, backend audio", `{"echo_cancellation":{"backend_audio":true}}`, false, cleanSetting{echo: true, backendAudio: true, guard: true}, false},
		{"near field", `{"echo_cancellation":null,"noise_reduction":{"type":"near_field"}}`, true, cleanSetting{noise: apm.NearField}, false},
		{"far field and echo", `{"echo_cancellation":{},"noise_reduction":{"type":"far_field"}}`, false, cleanSetting{echo: true, noise: apm.FarField, guard: true}, false},
		{"guard", `{"echo_cancellation":{"guard_first_reply":true}}`, false, cleanSetting{echo: true, guard: true}, false},
		{"no guard", `{"echo_cancellation":{"guard_first_reply":false}}`, false, cleanSetting{echo: true}, false},
		{"noise null", `{"noise_reduction":null}`, false, cleanSetting{}, false},
		{"bad type", `{"noise_reduction":{"type":"studio"}}`, false, cleanSetting{}, true},
		{"no type", `{"noise_reduction":{}}`, false, cleanSetting{}, true},
		{"echo not an object", `{"echo_cancellation":true}`, false, cleanSetting{}, true},
		{"echo unknown member", `{"echo_cancellation":{"enabled":false}}`, true, cleanSetting{}, true},
		{"echo misspelt member", `{"echo_cancellation":{"backend_audo":true}}`, true, cleanSetting{}, true},
		{"noise unknown member", `{"noise_reduction":{"type":"near_field","level":3}}`, false, cleanSetting{}, true},
		{"noise a string", `{"noise_reduction":"near_field"}`, false, cleanSetting{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCleaning(json.RawMessage(tc.raw), tc.interrupt)
			if tc.err {
				if !errors.Is(err, apm.ErrConfig) {
					t.Fatalf("err %v, want apm.ErrConfig", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseCleaning(%s) = %+v, %v; want %+v", tc.raw, got, err, tc.want)
			}
		})
	}
}

// TestBridgeDocCleaningExample: the turn_detection example of
// docs/bridge.md §4.8 with cleaning members parses, as printed.
func TestBridgeDocCleaningExample(t *testing.T) {
	f, err := os.Open("../../docs/bridge.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var example string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if l := sc.Text(); strings.HasPrefix(l, "{") && strings.Contains(l, `"noise_reduction"`) {
			example = l
		}
	}
	if example == "" {
		t.Fatal("docs/bridge.md has no turn_detection example with noise_reduction")
	}
	td, err := parseTurnDetection(json.RawMessage(example))
	if err != nil || td == nil {
		t.Fatalf("%s: %v", example, err)
	}
	cs, err := parseCleaning(json.RawMessage(example), td.InterruptResponse)
	if err != nil || !cs.echo || cs.backendAudio || cs.noise != apm.FarField {
		t.Fatalf("%s: %+v, %v", example, cs, err)
	}
}

// TestPlayedRingDrainDoesNotBlockPush: while the track goroutine decodes
// the played packets (drain's f), the clock's worker can still record
// the next one (push): SendPacket must not block its worker. The packets
// come out in order, the one pushed meanwhile at the next drain.
func TestPlayedRingDrainDoesNotBlockPush(t *testing.T) {
	var r playedRing
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		r.push(t0.Add(time.Duration(i)*20*time.Millisecond), uint32(960*i), []byte{byte(i)})
	}
	var got []uint32
	r.drain(func(at time.Time, ts uint32, payload []byte) {
		if len(got) == 0 {
			pushed := make(chan struct{})
			go func() { r.push(t0.Add(60*time.Millisecond), 960*3, []byte{3}); close(pushed) }()
			select {
			case <-pushed:
			case <-time.After(10 * time.Second):
				t.Fatal("push waited 10 s for drain's f: the clock's worker blocks while the track goroutine decodes")
			}
		}
		if len(payload) != 1 || uint32(payload[0])*960 != ts {
			t.Errorf("packet ts %d has payload %v", ts, payload)
		}
		got = append(got, ts)
	})
	r.drain(func(at time.Time, ts uint32, payload []byte) {
		if len(payload) != 1 || uint32(payload[0])*960 != ts {
			t.Errorf("packet ts %d has payload %v", ts, payload)
		}
		got = append(got, ts)
	})
	if want := []uint32{0, 960, 1920, 2880}; !slices.Equal(got, want) {
		t.Errorf("drained %v, want %v", got, want)
	}
	// The ring still drops the oldest when full, and counts it.
	for i := range playedSlots + 2 {
		r.push(t0, uint32(i), nil)
	}
	var first uint32
	n := 0
	lost := r.drain(func(_ time.Time, ts uint32, _ []byte) {
		if n == 0 {
			first = ts
		}
		n++
	})
	if n != playedSlots || first != 2 || lost != 2 {
		t.Errorf("full ring: drained %d from ts %d, lost %d; want %d from 2, lost 2", n, first, lost, playedSlots)
	}
	if lost := r.drain(func(time.Time, uint32, []byte) { t.Error("a drained ring gave a packet") }); lost != 0 {
		t.Errorf("the next drain reports %d lost again", lost)
	}
}

// TestCleanShortPackets: a client sending 5 ms packets hands the
// detector partial frames of 5 and 15 ms. Cleaning takes the first 10 ms
// once, when there is that much, and the rest with the whole frame: it
// stays on, and every frame is cleaned, where a 5 ms partial used to
// fail the cleaner (not whole 10 ms frames) and switch cleaning off for
// the rest of the session.
func TestCleanShortPackets(t *testing.T) {
	const rate = 24000
	m := &mediaPath{log: slog.New(slog.DiscardHandler)}
	var err error
	if m.dec, err = audio.NewDecoder(rate); err != nil {
		t.Fatal(err)
	}
	m.clean.next.Store(&cleanSetting{echo: true, noise: apm.FarField})
	m.applyCleaning()
	defer m.stopCleaning()
	if m.clean.c == nil {
		t.Fatal("cleaning did not start")
	}
	live := apm.Live()
	frame := make([]byte, 2*rate/50) // 20 ms
	for i := range frame {
		frame[i] = byte(i * 31)
	}
	now := time.Unix(1000, 0)
	for k := range 50 {
		ts := uint32(k * rate / 50)
		for _, ms := range []int{5, 10, 15} {
			got := m.cleanPartial(ts, frame[:2*rate*ms/1000], now)
			if m.clean.c == nil {
				t.Fatalf("frame %d: a %d ms partial switched cleaning off", k, ms)
			}
			if ms >= 10 && len(got) != 2*rate/100 {
				t.Fatalf("frame %d: a %d ms partial gave the detector %d bytes, want its first 10 ms", k, ms, len(got))
			}
		}
		pcm := append([]byte(nil), frame...)
		m.cleanFrame(ts, pcm, now)
		if m.clean.c == nil {
			t.Fatalf("frame %d switched cleaning off", k)
		}
		now = now.Add(20 * time.Millisecond)
	}
	if st := m.clean.c.Stats(); st.Frames != 100 {
		t.Errorf("the cleaner saw %d 10 ms frames of 50 20 ms frames, want 100 (each once)", st.Frames)
	}
	m.stopCleaning()
	if n := apm.Live(); n != live-1 {
		t.Errorf("%d Cleaners live after stopCleaning, want %d", n, live-1)
	}
}
