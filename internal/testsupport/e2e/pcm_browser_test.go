package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/demo"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
)

// speechBackend is a PCM backend: when the client sends {"type":"play"} on
// oai-events, it sends a whole reply (speech.wav at 24 kHz, looped to
// 10 s) in one burst, as a TTS engine would.
type speechBackend struct {
	t     *testing.T
	reply []byte
	wg    sync.WaitGroup

	mu      sync.Mutex
	cleared []bridge.Control
}

func (b *speechBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sc, err := bridge.Accept(w, r, bridge.AcceptOptions{Formats: []string{bridge.FormatPCM24k}})
	if err != nil {
		return
	}
	b.wg.Go(func() {
		defer sc.Close()
		ctx := context.Background()
		for {
			m, err := sc.Recv(ctx)
			if err != nil {
				return
			}
			switch {
			case m.Event != nil:
				var ev struct{ Type string }
				if json.Unmarshal(m.Event, &ev) == nil && ev.Type == "play" {
					_ = sc.SendControl(ctx, bridge.Control{Type: bridge.TypeOutputResponse, ID: "resp_speech"})
					_ = sc.SendAudio(ctx, bridge.AudioFrame{Payload: b.reply})
				}
			case m.Control != nil && m.Control.Type == bridge.TypeOutputCleared:
				b.mu.Lock()
				b.cleared = append(b.cleared, *m.Control)
				b.mu.Unlock()
			case m.End != nil:
				_ = sc.End(ctx, m.End.Reason)
				return
			}
		}
	})
}

// pcmPageJS calls the transceiver from the page with the fake microphone,
// plays what comes back, and keeps oai-events messages in
// window.pcmTest.events.
const pcmPageJS = `(() => {
	const t = window.pcmTest = {events: [], open: false, error: null};
	(async () => {
		try {
			const pc = t.pc = new RTCPeerConnection();
			const mic = await navigator.mediaDevices.getUserMedia({audio: true});
			mic.getTracks().forEach((tr) => pc.addTrack(tr, mic));
			const dc = t.dc = pc.createDataChannel("oai-events");
			dc.onopen = () => { t.open = true; };
			dc.onmessage = (ev) => { try { t.events.push(JSON.parse(ev.data)); } catch (e) {} };
			pc.ontrack = (ev) => {
				const a = new Audio();
				a.srcObject = ev.streams[0] || new MediaStream([ev.track]);
				a.play().catch((e) => { t.error = "play: " + e; });
			};
			await pc.setLocalDescription(await pc.createOffer());
			await new Promise((ok) => {
				if (pc.iceGatheringState === "complete") return ok();
				pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") ok(); };
			});
			const resp = await fetch("/v1/calls", {method: "POST", headers: {"Content-Type": "application/sdp"}, body: pc.localDescription.sdp});
			if (resp.status !== 201) throw new Error("POST /v1/calls: " + resp.status);
			await pc.setRemoteDescription({type: "answer", sdp: await resp.text()});
		} catch (e) { t.error = String(e); }
	})();
})()`

// pcmStatsJS reads the inbound audio's getStats.
const pcmStatsJS = `(async () => {
	let s = {packetsReceived: 0, totalAudioEnergy: 0, audioLevel: 0};
	(await window.pcmTest.pc.getStats()).forEach((r) => {
		if (r.type === "inbound-rtp" && r.kind === "audio") {
			s = {packetsReceived: r.packetsReceived, totalAudioEnergy: r.totalAudioEnergy || 0, audioLevel: r.audioLevel || 0};
		}
	});
	return s;
})()`

type inboundStats struct {
	PacketsReceived  int64   `json:"packetsReceived"`
	TotalAudioEnergy float64 `json:"totalAudioEnergy"`
	AudioLevel       float64 `json:"audioLevel"`
	at               time.Time
}

// TestBrowserPCMPlayoutAndClear: a PCM backend sends 10 s of speech in one
// burst; Chromium receives it at real-time pace (getStats), hears speech,
// and its output_audio_buffer.clear on oai-events silences it and brings
// output_audio_buffer.cleared.
func TestBrowserPCMPlayoutAndClear(t *testing.T) {
	chromium := chromiumPath(t)
	wavPath, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := callclient.LoadWAV(wavPath)
	if err != nil {
		t.Fatal(err)
	}
	backend := &speechBackend{t: t}
	for len(backend.reply) < 10*24000*2 { // 48 → 24 kHz, looped to 10 s
		for i := 0; i+1 < len(w.Samples) && len(backend.reply) < 10*24000*2; i += 2 {
			backend.reply = binary.LittleEndian.AppendUint16(backend.reply, uint16(int16((int(w.Samples[i])+int(w.Samples[i+1]))/2)))
		}
	}
	d := startTestDemo(t, demo.Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Backend: backend}, slog.LevelInfo, backend.wg.Wait)
	ctx := startBrowser(t, chromium, wavPath)
	if err := chromedp.Do(ctx, chromedp.Navigate(d.URL()+"/")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](pcmPageJS)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "oai-events open", `window.pcmTest.error || window.pcmTest.open`, 15*time.Second)
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.pcmTest.dc.send(JSON.stringify({type: "play"}))`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "output_audio_buffer.started", `window.pcmTest.events.some((e) => e.type === "output_audio_buffer.started" && e.response_id === "resp_speech")`, 10*time.Second)

	stats := func() inboundStats {
		s, err := chromedp.Run(ctx, chromedp.Evaluate[inboundStats](pcmStatsJS, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("getStats: %v", err)
		}
		s.at = time.Now()
		return s
	}
	time.Sleep(500 * time.Millisecond) // past the start
	s1 := stats()
	time.Sleep(2 * time.Second)
	s2 := stats()
	rate := float64(s2.PacketsReceived-s1.PacketsReceived) / s2.at.Sub(s1.at).Seconds()
	speechEnergy := (s2.TotalAudioEnergy - s1.TotalAudioEnergy) / s2.at.Sub(s1.at).Seconds()
	t.Logf("during the reply: %.1f packets/s at the browser, audio energy %.4f/s, audio level %.3f", rate, speechEnergy, s2.AudioLevel)
	if rate < 45 || rate > 55 {
		t.Errorf("the browser received %.1f packets/s of a reply sent in one burst, want 50 (real time)", rate)
	}
	if speechEnergy <= 0 {
		t.Errorf("no audio energy at the browser during the reply")
	}

	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.pcmTest.dc.send(JSON.stringify({type: "output_audio_buffer.clear"}))`)); err != nil {
		t.Fatal(err)
	}
	clearAt := time.Now()
	waitJS(t, ctx, "output_audio_buffer.cleared", `window.pcmTest.events.some((e) => e.type === "output_audio_buffer.cleared" && e.response_id === "resp_speech")`, 5*time.Second)
	t.Logf("output_audio_buffer.cleared seen by the page %v after it sent the clear (polled)", time.Since(clearAt).Round(time.Millisecond))
	s3 := stats()
	// The browser's jitter buffer (tens of ms) plays out and its loss
	// concealment fades; then the energy must stop growing.
	time.Sleep(300 * time.Millisecond)
	s3b := stats()
	time.Sleep(time.Second)
	s4 := stats()
	after := s4.PacketsReceived - s3.PacketsReceived
	s3 = s3b
	silentEnergy := (s4.TotalAudioEnergy - s3.TotalAudioEnergy) / s4.at.Sub(s3.at).Seconds()
	t.Logf("after the clear: %d packets in the 1.3 s after the cleared event; from 0.3 s on, audio energy %.5f/s, audio level %.4f", after, silentEnergy, s4.AudioLevel)
	// The clear sends 3 packets of silence after the cut reply
	// (docs/bridge.md §6.3), on the ticks after it.
	if after > 1+3 {
		t.Errorf("the browser received %d packets after the cleared event, want at most the one in flight and the clear's 3 of silence", after)
	}
	if silentEnergy > speechEnergy/10 {
		t.Errorf("audio energy after the clear %.5f/s, during speech %.5f/s: not silenced", silentEnergy, speechEnergy)
	}
	backend.mu.Lock()
	cleared := backend.cleared
	backend.mu.Unlock()
	if len(cleared) != 1 || cleared[0].PlayedMs < 2000 {
		t.Errorf("backend got output.cleared %+v, want one with played_ms ≥ 2000", cleared)
	} else {
		t.Logf("backend: output.cleared played_ms %d", cleared[0].PlayedMs)
	}
}

// waitJS polls a JavaScript expression until it is truthy; a string value
// is the page's error.
func waitJS(t *testing.T, ctx context.Context, what, expr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[any](expr))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		switch v := v.(type) {
		case string:
			t.Fatalf("%s: page error %s", what, v)
		case bool:
			if v {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
