package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/apm"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// TestPCMInputCleaningSwitch: a PCM session whose backend switches input
// cleaning during the call (docs/bridge.md §4.8) while the client sends
// steady white noise and the agent talks. With noise_reduction the
// backend gets the noise suppressed; a cleaning member that is not valid
// is refused (invalid_turn_detection) and changes nothing; with turn
// detection off the backend gets the noise as sent; with
// echo_cancellation null nothing is cleaned, and the default turn
// detection (with interruption) cancels echo. Each setting holds
// one Cleaner (its C memory) and frees it when the next one comes, and
// the session's end frees the last (apm.Live).
func TestPCMInputCleaningSwitch(t *testing.T) {
	live0 := apm.Live()
	hello := json.RawMessage(`{"type":"server_vad","interrupt_response":false,"noise_reduction":{"type":"far_field"}}`)
	be := &scripted{opts: bridge.AcceptOptions{Formats: []string{bridge.FormatPCM24k}, TurnDetection: hello}, conns: make(chan *bridge.ServerConn, 1)}
	s := startPCMStack(t, be, nil)
	c := dialClient(t, s.calls)
	var sc *bridge.ServerConn
	select {
	case sc = <-be.conns:
	case <-time.After(10 * time.Second):
		t.Fatal("no backend session")
	}

	// The backend: the received audio's power per frame, by arrival.
	type framePow struct {
		at  time.Time
		pow float64
	}
	var (
		mu     sync.Mutex
		frames []framePow
	)
	errs := make(chan bridge.Control, 8)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			m, err := sc.Recv(context.Background())
			if err != nil {
				return
			}
			switch {
			case m.Audio != nil:
				var e float64
				p := m.Audio.Payload
				for i := 0; i+1 < len(p); i += 2 {
					v := float64(int16(binary.LittleEndian.Uint16(p[i:])))
					e += v * v
				}
				mu.Lock()
				frames = append(frames, framePow{time.Now(), e / float64(max(1, len(p)/2))})
				mu.Unlock()
			case m.Control != nil && m.Control.Type == bridge.TypeError:
				errs <- *m.Control
			}
		}
	}()
	t.Cleanup(func() { _ = sc.Close(); <-readDone })
	// The client: white noise at about -24 dBFS, 20 ms packets.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
		if err != nil {
			t.Error(err)
			return
		}
		rng := rand.New(rand.NewPCG(3, 4))
		pcm, buf := make([]int16, 960), make([]byte, 1275)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for i := range pcm {
				pcm[i] = int16(max(-32768, min(32767, 2000*rng.NormFloat64())))
			}
			n, err := enc.Encode(pcm, buf)
			if err != nil {
				t.Error(err)
				return
			}
			if err := c.track.WriteSample(media.Sample{Data: buf[:n], Duration: 20 * time.Millisecond}); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	// meanDB is the backend's received power (dBFS) over frames that
	// arrived in the window, waiting for it to pass first.
	meanDB := func(from, to time.Time) float64 {
		t.Helper()
		time.Sleep(time.Until(to))
		mu.Lock()
		defer mu.Unlock()
		var sum float64
		n := 0
		for _, f := range frames {
			if !f.at.Before(from) && f.at.Before(to) {
				sum += f.pow
				n++
			}
		}
		if n < 10 {
			t.Fatalf("the backend got %d frames from %v to %v", n, from.Format(time.StampMilli), to.Format(time.StampMilli))
		}
		return 10 * math.Log10(sum/float64(n)/(32768*32768)+1e-12)
	}
	setTD := func(td string) {
		t.Helper()
		if err := sc.SendControl(context.Background(), bridge.Control{Type: bridge.TypeInputTurnDetection, TurnDetection: json.RawMessage(td)}); err != nil {
			t.Fatal(err)
		}
	}
	waitLive := func(want int64, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for apm.Live()-live0 != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d Cleaners live, want %d", what, apm.Live()-live0, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	noReply := func(what string) {
		t.Helper()
		select {
		case e := <-errs:
			t.Fatalf("%s: error %+v", what, e)
		default:
		}
	}

	// far_field from the hello; the suppressor learns the noise in about
	// a second.
	waitLive(1, "noise_reduction far_field")
	now := time.Now()
	suppressed := meanDB(now.Add(1500*time.Millisecond), now.Add(3*time.Second))
	noReply("far_field")

	// Echo cancellation on, its audio to the backend, while the agent
	// talks (the far end fills the played ring): a new Cleaner, the old
	// one freed.
	if err := sc.SendAudio(context.Background(), bridge.AudioFrame{Payload: tone(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	setTD(`{"type":"server_vad","interrupt_response":false,"echo_cancellation":{"backend_audio":true}}`)
	time.Sleep(time.Second)
	waitLive(1, "echo_cancellation")
	noReply("echo_cancellation")

	// A bad cleaning member: refused, the setting stays.
	setTD(`{"type":"server_vad","noise_reduction":{"type":"near_field","level":3}}`)
	select {
	case e := <-errs:
		if e.Code != bridge.ErrCodeTurnDetection {
			t.Fatalf("bad noise_reduction: error %+v, want %s", e, bridge.ErrCodeTurnDetection)
		}
		t.Logf("bad noise_reduction: %s", e.Message)
	case <-time.After(10 * time.Second):
		t.Fatal("bad noise_reduction: no error")
	}
	waitLive(1, "after the refused setting")

	// Turn detection off: no cleaning, the Cleaner freed mid-call, the
	// noise as the client sent it.
	setTD(`null`)
	waitLive(0, "turn detection off")
	now = time.Now()
	raw := meanDB(now.Add(500*time.Millisecond), now.Add(2*time.Second))
	t.Logf("white noise at the backend: %.1f dBFS with far_field, %.1f dBFS without cleaning", suppressed, raw)
	if raw-suppressed < 6 {
		t.Errorf("far_field took %.1f dB off steady white noise, want at least 6 (docs/vad.md: 13-14)", raw-suppressed)
	}
	if raw < -40 {
		t.Errorf("without cleaning the backend got the noise at %.1f dBFS: the client's noise did not arrive", raw)
	}

	// Turned off, nothing is cleaned; the default turn detection (with
	// interruption) cancels echo; then the session ends: its end frees
	// the Cleaner.
	setTD(`{"type":"server_vad","echo_cancellation":null}`)
	if err := sc.SendAudio(context.Background(), bridge.AudioFrame{Payload: tone(time.Second)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	waitLive(0, "echo cancellation null")
	setTD(`{"type":"server_vad"}`)
	waitLive(1, "the default turn detection")
	_ = sc.Close() // the backend goes: the session ends
	waitLive(0, "after the session ended")
}
