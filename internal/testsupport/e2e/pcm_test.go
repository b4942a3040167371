package e2e

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"
	"github.com/pion/webrtc/v4/pkg/media"
	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/audio/audiotest"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// The PCM tests run a relay and a transceiver on loopback with a backend
// of the test's choosing, and a Pion client that records every RTP packet
// it receives with its arrival time.

type pcmStack struct {
	trx   *transceiver.Server
	reg   *prometheus.Registry
	calls string // signaling URL
}

// startPCMStack serves backend (unless nil: mutate then sets BackendURL)
// behind a relay and a transceiver.
func startPCMStack(t testing.TB, backend http.Handler, mutate func(*transceiver.Config)) *pcmStack {
	t.Helper()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, err := token.NewKeyring(token.Key{ID: 2, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	backendURL := ""
	if backend != nil {
		be := httptest.NewServer(backend)
		t.Cleanup(be.Close)
		backendURL = "ws" + strings.TrimPrefix(be.URL, "http") + "/v1/bridge"
	}
	log := slog.New(slog.DiscardHandler)
	members := &membership.Table{}
	rly, err := relay.New(relay.Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: 5, Workers: 1}, keys, members, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rly.Close() })
	cfg := transceiver.Config{
		ID: 11, Cluster: 5, ListenAddr: "127.0.0.1:0",
		Advertise:   rly.PublicAddr().String(),
		AllowRelays: []string{netip.PrefixFrom(rly.InternalAddr().Addr(), 32).String()},
		BackendURL:  backendURL,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	reg := prometheus.NewRegistry()
	trx, err := transceiver.New(cfg, keys, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = trx.Close() })
	if err := members.Set(map[uint32]netip.AddrPort{11: trx.HopAddr().(*net.UDPAddr).AddrPort()}); err != nil {
		t.Fatal(err)
	}
	sig := httptest.NewServer(trx.Handler())
	t.Cleanup(sig.Close)
	return &pcmStack{trx: trx, reg: reg, calls: sig.URL + "/v1/calls"}
}

// rxPacket is one RTP packet the client received.
type rxPacket struct {
	at      time.Time
	seq     uint16
	ts      uint32
	marker  bool
	payload []byte
}

// testClient is a Pion client with an Opus track and oai-events.
type testClient struct {
	t     testing.TB
	pc    *webrtc.PeerConnection
	track *webrtc.TrackLocalStaticSample
	dc    *webrtc.DataChannel
	open  chan struct{}
	read  sync.WaitGroup

	mu     sync.Mutex
	rx     []rxPacket
	events []map[string]any
}

func dialClient(t testing.TB, url string) *testClient {
	t.Helper()
	return dialClientWith(t, url, nil)
}

// dialClientWith is dialClient with more done to the peer connection
// before the offer (nil: nothing).
func dialClientWith(t testing.TB, url string, more func(*webrtc.PeerConnection)) *testClient {
	t.Helper()
	c := &testClient{t: t, pc: webrtctest.PeerConnection(t), open: make(chan struct{})}
	var err error
	c.track, err = webrtc.NewTrackLocalStaticSample(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "mic", "client")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.pc.AddTrack(c.track); err != nil {
		t.Fatal(err)
	}
	if c.dc, err = c.pc.CreateDataChannel(webrtctest.EventsLabel, nil); err != nil {
		t.Fatal(err)
	}
	c.dc.OnOpen(func() { close(c.open) })
	c.dc.OnMessage(func(m webrtc.DataChannelMessage) {
		var ev map[string]any
		if json.Unmarshal(m.Data, &ev) == nil {
			c.mu.Lock()
			c.events = append(c.events, ev)
			c.mu.Unlock()
		}
	})
	c.read.Add(1)
	started := false
	c.pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		if started {
			return
		}
		started = true
		defer c.read.Done()
		for {
			p, _, err := tr.ReadRTP()
			if err != nil {
				return
			}
			now := time.Now()
			c.mu.Lock()
			c.rx = append(c.rx, rxPacket{now, p.SequenceNumber, p.Timestamp, p.Marker, slices.Clone(p.Payload)})
			c.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = c.pc.Close()
		if started {
			c.read.Wait()
		} else {
			c.read.Done()
		}
	})
	if more != nil {
		more(c.pc)
	}
	offer := webrtctest.Offer(t, c.pc)
	resp, err := http.Post(url, "application/sdp", strings.NewReader(offer))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST offer: %d %s", resp.StatusCode, answer)
	}
	if err := c.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(answer)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.open:
	case <-time.After(10 * time.Second):
		t.Fatal("oai-events did not open")
	}
	return c
}

// received returns a copy of the packets received so far.
func (c *testClient) received() []rxPacket {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.rx)
}

// receivedFrom returns the packets received after the first n.
func (c *testClient) receivedFrom(n int) []rxPacket {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.rx[min(n, len(c.rx)):])
}

// eventTypes returns the types of the oai-events messages received so far.
func (c *testClient) eventTypes() []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

func (c *testClient) send(v any) {
	b, _ := json.Marshal(v)
	if err := c.dc.SendText(string(b)); err != nil {
		c.t.Fatal(err)
	}
}

// decode48k decodes received packets, in order, into 48 kHz samples: the
// audio that came back, without the gaps a timestamp jump would put in
// the client's playout (timestampGaps counts those).
func decode48k(t *testing.T, pkts []rxPacket) []int16 {
	t.Helper()
	dec, err := opus.NewDecoder(48000, 1)
	if err != nil {
		t.Fatal(err)
	}
	var out []int16
	buf := make([]int16, 5760)
	for _, p := range pkts {
		n, err := dec.Decode(p.payload, buf)
		if err != nil {
			t.Fatalf("client decode: %v", err)
		}
		out = append(out, buf[:n]...)
	}
	return out
}

// timestampGaps counts the packets whose RTP timestamp jumps past the end
// of the previous one, and the total jump in milliseconds.
func timestampGaps(pkts []rxPacket) (n int, ms float64) {
	for i := 1; i < len(pkts); i++ {
		if d := pkts[i].ts - pkts[i-1].ts; d > 960 {
			n++
			ms += float64(d-960) / 48
		}
	}
	return n, ms
}

// TestPCMEchoSpeech sends speech from a Pion client through the relay and
// the transceiver to the PCM echo agent and back: decoded at the client,
// it is still the speech.
func TestPCMEchoSpeech(t *testing.T) {
	for _, format := range []string{bridge.FormatPCM24k, bridge.FormatPCM16k} {
		t.Run(format, func(t *testing.T) {
			echo, err := agent.NewEchoConfig(agent.EchoConfig{Logger: slog.New(slog.DiscardHandler), Format: format})
			if err != nil {
				t.Fatal(err)
			}
			s := startPCMStack(t, echo, nil)
			c := dialClient(t, s.calls)
			w, err := callclient.LoadWAV(speech)
			if err != nil {
				t.Fatal(err)
			}
			enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
			if err != nil {
				t.Fatal(err)
			}
			_ = enc.SetInBandFEC(true)
			buf := make([]byte, 1275)
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			frames := len(w.Samples) / 960
			for i := range frames {
				n, err := enc.Encode(w.Samples[i*960:(i+1)*960], buf)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.track.WriteSample(media.Sample{Data: buf[:n], Duration: 20 * time.Millisecond}); err != nil {
					t.Fatal(err)
				}
				<-tick.C
			}
			deadline := time.Now().Add(10 * time.Second)
			for len(c.received()) < frames && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			rx := c.received()
			got := decode48k(t, rx)
			rate := bridge.SampleRate(format)
			wave, env, lag := audiotest.Similarity(audiotest.Decimate(w.Samples, 48000/rate), audiotest.Decimate(got, 48000/rate), rate, rate/5)
			gaps, gapMs := timestampGaps(rx)
			t.Logf("%s echo: sent %d packets, received %d (%d timestamp jumps, %.0f ms); correlation with the original at %d Hz: waveform %.3f, 10 ms envelope %.3f, lag %.1f ms",
				format, frames, len(rx), gaps, gapMs, rate, wave, env, float64(lag)*1000/float64(rate))
			if len(rx) < frames*9/10 {
				t.Errorf("received %d packets of %d", len(rx), frames)
			}
			// Two Opus generations (the client's, the transceiver's) keep
			// the speech, not the waveform's phase: see audiotest.Similarity.
			if env < 0.9 || wave < 0.8 {
				t.Errorf("the echo is not the speech: waveform %.3f (want ≥ 0.8), envelope %.3f (want ≥ 0.9)", wave, env)
			}
		})
	}
}

// scripted is a backend the test drives by hand: each session's ServerConn
// goes to conns.
type scripted struct {
	opts  bridge.AcceptOptions
	conns chan *bridge.ServerConn
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sc, err := bridge.Accept(w, r, s.opts)
	if err != nil {
		return
	}
	s.conns <- sc
}

// backendMsg is a message the scripted backend received, with its time.
type backendMsg struct {
	at  time.Time
	ctl bridge.Control
}

// backendSession drives one scripted session: it reads in the background
// and collects control messages.
type backendSession struct {
	sc   *bridge.ServerConn
	msgs chan backendMsg
	done chan struct{}
}

func acceptSession(t *testing.T, s *scripted) *backendSession {
	t.Helper()
	var sc *bridge.ServerConn
	select {
	case sc = <-s.conns:
	case <-time.After(10 * time.Second):
		t.Fatal("no backend session")
	}
	b := &backendSession{sc: sc, msgs: make(chan backendMsg, 1024), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for {
			m, err := sc.Recv(context.Background())
			if err != nil {
				return
			}
			if m.Control != nil {
				b.msgs <- backendMsg{time.Now(), *m.Control}
			}
			if m.End != nil {
				_ = sc.End(context.Background(), m.End.Reason)
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = sc.Close()
		<-b.done
	})
	return b
}

// next returns the next control message of the given type, failing the
// test after timeout; others are skipped (and returned in skipped).
func (b *backendSession) next(t *testing.T, typ string, timeout time.Duration) backendMsg {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m := <-b.msgs:
			if m.ctl.Type == typ {
				return m
			}
			t.Logf("backend got %+v while waiting for %s", m.ctl, typ)
		case <-deadline:
			t.Fatalf("backend got no %s within %v", typ, timeout)
		}
	}
}

func (b *backendSession) control(t *testing.T, c bridge.Control) {
	t.Helper()
	if err := b.sc.SendControl(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

// tone returns d of a 440 Hz tone as 24 kHz PCM16.
func tone(d time.Duration) []byte {
	n := int(d.Seconds() * 24000)
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(int16(8000*math.Sin(2*math.Pi*440*float64(i)/24000))))
	}
	return b
}

// TestPCMBurstPacedClearMarks: a backend sends 10 s of PCM in one burst
// with a mark after each second; the client receives it at real-time pace,
// in order, and the marks come back in order after their audio. Then a
// second burst is cleared after 1 s by the backend, and a third by the
// client's output_audio_buffer.clear.
func TestPCMBurstPacedClearMarks(t *testing.T) {
	be := &scripted{opts: bridge.AcceptOptions{Formats: []string{bridge.FormatPCM24k}}, conns: make(chan *bridge.ServerConn, 1)}
	s := startPCMStack(t, be, nil)
	c := dialClient(t, s.calls)
	b := acceptSession(t, be)
	ctx := context.Background()
	second := tone(time.Second)

	// 1. Ten seconds in one burst, with marks.
	b.control(t, bridge.Control{Type: bridge.TypeOutputResponse, ID: "resp_burst"})
	burstAt := time.Now()
	for k := range 10 {
		if err := b.sc.SendAudio(ctx, bridge.AudioFrame{Seq: uint16(k), Timestamp: uint32(k * 24000), Payload: second}); err != nil {
			t.Fatal(err)
		}
		b.control(t, bridge.Control{Type: bridge.TypeOutputMark, Name: "m" + string(rune('0'+k))})
	}
	t.Logf("backend sent 10 s of PCM and 10 marks in %v", time.Since(burstAt).Round(time.Microsecond))
	b.next(t, bridge.TypeOutputStarted, 5*time.Second)
	for k := range 10 {
		m := b.next(t, bridge.TypeOutputMark, 10*time.Second)
		if want := "m" + string(rune('0'+k)); m.ctl.Name != want || m.ctl.Cleared {
			t.Fatalf("mark %d = %+v, want %s", k, m.ctl, want)
		}
		// The mark comes back once the second of audio before it has
		// played: paced at real time from the run's first packet, sent
		// after burstAt, that is (k+1) s after the burst was sent at the
		// earliest (docs/bridge.md §6.4; 1 ms for the pacing clock's
		// rounding to the sample); and soon after (a loaded machine
		// under -race delays the events by a few hundred ms; the playout
		// unit tests pin the exact turn).
		if at := m.at.Sub(burstAt); at < time.Duration(k+1)*time.Second-time.Millisecond || at > time.Duration(k+1)*time.Second+time.Second {
			t.Errorf("mark %s came back %v after the burst, want about %d s", m.ctl.Name, at.Round(time.Millisecond), k+1)
		}
		if k == 0 {
			first := c.received()[0].at
			if got := countBefore(c.received(), first.Add(time.Second)); got > 75 {
				t.Errorf("the client had %d packets (%d ms) one second after the first, want ≤ 75 (1.5 s)", got, got*20)
			}
		}
	}
	stopped := b.next(t, bridge.TypeOutputStopped, 10*time.Second)
	if stopped.ctl.PlayedMs != 10000 {
		t.Errorf("output.stopped played_ms %d, want 10000", stopped.ctl.PlayedMs)
	}
	// output.stopped goes to the backend as the last packet goes to the
	// client: the packet may still be on its way (UDP, then the client's
	// SRTP read loop).
	run := waitReceived(t, c, 500)
	if len(run) != 500 {
		t.Fatalf("client received %d packets of the burst, want 500", len(run))
	}
	for i, p := range run {
		if p.seq != run[0].seq+uint16(i) || p.ts != run[0].ts+uint32(960*i) || p.marker != (i == 0) {
			t.Fatalf("packet %d: seq %d ts %d marker %v after seq %d ts %d: want consecutive, marker on the first only", i, p.seq, p.ts, p.marker, run[0].seq, run[0].ts)
		}
	}
	span := run[499].at.Sub(run[0].at)
	t.Logf("burst of 10 s: 500 packets over %v at the client; output.stopped %d ms", span.Round(time.Millisecond), stopped.ctl.PlayedMs)
	if span < 9700*time.Millisecond || span > 10500*time.Millisecond {
		t.Errorf("500 packets arrived over %v, want about 9.98 s", span)
	}
	waitEvents(t, c, "output_audio_buffer.started", "output_audio_buffer.stopped")
	if ev := c.eventTypes(); ev[0]["response_id"] != "resp_burst" || ev[1]["response_id"] != "resp_burst" {
		t.Errorf("client events %v, want response_id resp_burst", ev)
	}

	// 2. A backend clear after one second.
	before := len(c.received())
	b.control(t, bridge.Control{Type: bridge.TypeOutputResponse, ID: "resp_clear"})
	sentAt := time.Now()
	for range 10 {
		if err := b.sc.SendAudio(ctx, bridge.AudioFrame{Payload: second}); err != nil {
			t.Fatal(err)
		}
	}
	b.control(t, bridge.Control{Type: bridge.TypeOutputMark, Name: "never"})
	b.next(t, bridge.TypeOutputStarted, 5*time.Second)
	time.Sleep(time.Second)
	clearAt := time.Now()
	b.control(t, bridge.Control{Type: bridge.TypeOutputClear})
	dropped := b.next(t, bridge.TypeOutputMark, 10*time.Second)
	cleared := b.next(t, bridge.TypeOutputCleared, 10*time.Second)
	rx, tail := withoutClearTail(t, waitClearTail(t, c, before))
	if tail != clearTailPackets {
		t.Errorf("the clear sent %d silence packets after the reply, want %d (docs/bridge.md §6.3)", tail, clearTailPackets)
	}
	after := len(rx) - countBefore(rx, clearAt)
	t.Logf("backend clear after ~1 s: played_ms %d, client received %d packets (%d ms), %d after the clear was sent; answer in %v",
		cleared.ctl.PlayedMs, len(rx), 20*len(rx), after, cleared.at.Sub(clearAt).Round(time.Microsecond))
	if !dropped.ctl.Cleared || dropped.ctl.Name != "never" {
		t.Errorf("the queued mark came back as %+v, want never with cleared", dropped.ctl)
	}
	// The clear stopped it: the client got exactly what played_ms says was
	// handed to it (below: the one packet a clear may find on its way is in
	// both), and played_ms is no more than real time allows between the
	// burst and the clear plus that packet. The clear takes effect at some
	// moment before output.cleared comes back, not when it was sent (on a
	// loaded machine the answer took 130 ms, 6 packets more), so real time
	// is counted up to the answer. The playout unit tests pin the exact
	// tick.
	if limit := cleared.at.Sub(sentAt).Milliseconds() + 20; cleared.ctl.PlayedMs > limit {
		t.Errorf("played_ms %d with output.cleared back %v after the audio was sent: faster than real time", cleared.ctl.PlayedMs, cleared.at.Sub(sentAt))
	}
	if d := cleared.ctl.PlayedMs - int64(20*len(rx)); d < -20 || d > 20 {
		t.Errorf("played_ms %d, the client received %d ms: want within 20 ms", cleared.ctl.PlayedMs, 20*len(rx))
	}
	if cleared.ctl.PlayedMs < 500 {
		t.Errorf("played_ms %d after a clear at ~1 s", cleared.ctl.PlayedMs)
	}
	waitEvents(t, c, "output_audio_buffer.started", "output_audio_buffer.stopped", "output_audio_buffer.started", "output_audio_buffer.cleared")

	// 3. The client interrupts: output_audio_buffer.clear on oai-events.
	before = len(c.received())
	if err := b.sc.SendAudio(ctx, bridge.AudioFrame{Payload: tone(5 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	b.next(t, bridge.TypeOutputStarted, 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	c.send(map[string]string{"type": "output_audio_buffer.clear"})
	cleared = b.next(t, bridge.TypeOutputCleared, 10*time.Second)
	rx, _ = withoutClearTail(t, waitClearTail(t, c, before))
	if d := cleared.ctl.PlayedMs - int64(20*len(rx)); d < -20 || d > 20 {
		t.Errorf("client clear: played_ms %d, the client received %d ms", cleared.ctl.PlayedMs, 20*len(rx))
	}
	waitEvents(t, c, "output_audio_buffer.started", "output_audio_buffer.stopped", "output_audio_buffer.started", "output_audio_buffer.cleared",
		"output_audio_buffer.started", "output_audio_buffer.cleared")
	if got := counterValue(t, s.reg, "switchboard_transceiver_output_clears_total", "client"); got != 1 {
		t.Errorf("client clears counted %v, want 1", got)
	}
	// Sequence numbers ran on across the three runs.
	all := c.received()
	for i := 1; i < len(all); i++ {
		if all[i].seq != all[i-1].seq+1 {
			t.Fatalf("sequence gap between packets %d and %d: %d → %d", i-1, i, all[i-1].seq, all[i].seq)
		}
	}
}

// TestPCMBackendErrors: bad backend input gets its documented answer and
// is counted; the session goes on.
func TestPCMBackendErrors(t *testing.T) {
	be := &scripted{opts: bridge.AcceptOptions{Formats: []string{bridge.FormatPCM16k}, NoOutputAudioBufferEvents: true}, conns: make(chan *bridge.ServerConn, 1)}
	s := startPCMStack(t, be, func(c *transceiver.Config) { c.OutputQueueMax = time.Second })
	c := dialClient(t, s.calls)
	b := acceptSession(t, be)
	ctx := context.Background()
	send := func(payload []byte) {
		if err := b.sc.SendAudio(ctx, bridge.AudioFrame{Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	expectError := func(code string) {
		t.Helper()
		if m := b.next(t, bridge.TypeError, 10*time.Second); m.ctl.Code != code {
			t.Fatalf("error %+v, want code %s", m.ctl, code)
		} else {
			t.Logf("%s: %s", code, m.ctl.Message)
		}
	}
	// A clear with nothing queued is answered with played_ms 0.
	b.control(t, bridge.Control{Type: bridge.TypeOutputClear})
	if m := b.next(t, bridge.TypeOutputCleared, 10*time.Second); m.ctl.PlayedMs != 0 {
		t.Fatalf("idle clear: %+v", m.ctl)
	}
	// A mark on an idle queue comes back at once.
	b.control(t, bridge.Control{Type: bridge.TypeOutputMark, Name: "now"})
	if m := b.next(t, bridge.TypeOutputMark, 10*time.Second); m.ctl.Name != "now" {
		t.Fatalf("idle mark: %+v", m.ctl)
	}
	send(make([]byte, 641))
	expectError(bridge.ErrCodeOddLength)
	b.control(t, bridge.Control{Type: bridge.TypeOutputMark, Name: strings.Repeat("x", bridge.MaxMarkName+1)})
	expectError(bridge.ErrCodeMarkName)
	b.control(t, bridge.Control{Type: bridge.TypeOutputStarted})
	expectError(bridge.ErrCodeUnexpected)
	// Over the 1 s cap: 2 s refused whole, with one error for the episode.
	send(make([]byte, 2*16000*2))
	send(make([]byte, 2*16000*2))
	expectError(bridge.ErrCodeQueueFull)
	// Within the cap: played.
	send(make([]byte, 16000)) // 0.5 s
	if m := b.next(t, bridge.TypeOutputStopped, 10*time.Second); m.ctl.PlayedMs != 500 {
		t.Fatalf("output.stopped %+v, want 500 ms", m.ctl)
	}
	b.control(t, bridge.Control{Type: bridge.TypeOutputClear})
	b.next(t, bridge.TypeOutputCleared, 10*time.Second)
	for reason, want := range map[string]float64{
		"pcm_odd_length": 1, "invalid_mark_name": 1, "unexpected_type": 1, "output_queue_full": 2, "clear_idle": 2,
	} {
		if got := counterValue(t, s.reg, "switchboard_transceiver_backend_input_refused_total", reason); got != want {
			t.Errorf("refused{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	// The backend opted out of output_audio_buffer.* events.
	for _, ev := range c.eventTypes() {
		if strings.HasPrefix(ev["type"].(string), "output_audio_buffer.") {
			t.Errorf("client got %v although the backend's hello opted out", ev)
		}
	}
}

func countBefore(pkts []rxPacket, at time.Time) int {
	n := 0
	for _, p := range pkts {
		if p.at.Before(at) {
			n++
		}
	}
	return n
}

// waitReceived waits until the client has received n packets, and
// returns what it received then.
func waitReceived(t *testing.T, c *testClient, n int) []rxPacket {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rx := c.received()
		if len(rx) >= n || time.Now().After(deadline) {
			return rx
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// clearTailPackets is how many packets of silence a clear sends after the
// reply it cuts (docs/bridge.md §6.3; playout's default ClearTailTicks).
const clearTailPackets = 3

// waitClearTail waits until the packets the client received after its
// first before end in a clear's tail of silence, and returns them. The
// tail is the last thing a clear sends, one packet a tick from the turn
// after output.cleared went to the backend; the reply's packets before it
// have arrived once it has. It then waits 100 ms more, so that a packet
// past the tail, if one were sent, shows in what it returns.
func waitClearTail(t *testing.T, c *testClient, before int) []rxPacket {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rx := c.received()[before:]
		if _, tail := withoutClearTail(t, rx); tail >= clearTailPackets {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no clear tail (%d packets of silence) among the client's last packets in 10 s; %d packets since the clear's run", clearTailPackets, len(rx))
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	return c.received()[before:]
}

// withoutClearTail returns the packets before the silence a clear sends
// after the cut reply (docs/bridge.md §6.3), and how many of those there
// were.
func withoutClearTail(t *testing.T, rx []rxPacket) ([]rxPacket, int) {
	t.Helper()
	silence, err := transceiver.ClearTailPacket()
	if err != nil {
		t.Fatal(err)
	}
	n := len(rx)
	for n > 0 && string(rx[n-1].payload) == string(silence) {
		n--
	}
	return rx[:n], len(rx) - n
}

// waitEvents waits until the client's output_audio_buffer.* events are
// exactly want.
func waitEvents(t *testing.T, c *testClient, want ...string) {
	t.Helper()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		got = got[:0]
		for _, ev := range c.eventTypes() {
			if typ, _ := ev["type"].(string); strings.HasPrefix(typ, "output_audio_buffer.") {
				got = append(got, typ)
			}
		}
		if slices.Equal(got, want) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("client events %q, want %q", got, want)
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return 0
}

// TestPCMGreetingBeforeConnect: audio a backend sends as soon as the
// session starts, before the client is connected, waits in the queue and
// reaches the client whole, from its start.
func TestPCMGreetingBeforeConnect(t *testing.T) {
	be := &scripted{opts: bridge.AcceptOptions{Formats: []string{bridge.FormatPCM24k}}, conns: make(chan *bridge.ServerConn, 1)}
	s := startPCMStack(t, be, nil)
	greeted := make(chan error, 1)
	go func() {
		sc := <-be.conns
		be.conns <- sc // for acceptSession
		greeted <- sc.SendAudio(context.Background(), bridge.AudioFrame{Payload: tone(time.Second)})
	}()
	c := dialClient(t, s.calls)
	if err := <-greeted; err != nil {
		t.Fatal(err)
	}
	b := acceptSession(t, be)
	stopped := b.next(t, bridge.TypeOutputStopped, 5*time.Second)
	rx := c.received()
	if stopped.ctl.PlayedMs != 1000 || len(rx) != 50 || !rx[0].marker {
		t.Fatalf("greeting: output.stopped %d ms, client got %d packets (first marker %v); want 1000 ms, 50, marker",
			stopped.ctl.PlayedMs, len(rx), len(rx) > 0 && rx[0].marker)
	}
}

// TestPCMSecondAudioTrackIgnored: a client offering two audio tracks gets
// its first one decoded for the backend; the second is ignored and counted
// (one decoder per session: two tracks must not share it).
func TestPCMSecondAudioTrackIgnored(t *testing.T) {
	echo, err := agent.NewEchoConfig(agent.EchoConfig{Logger: slog.New(slog.DiscardHandler), Format: bridge.FormatPCM16k})
	if err != nil {
		t.Fatal(err)
	}
	s := startPCMStack(t, echo, nil)
	second, err := webrtc.NewTrackLocalStaticSample(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "mic2", "client2")
	if err != nil {
		t.Fatal(err)
	}
	c := dialClientWith(t, s.calls, func(pc *webrtc.PeerConnection) {
		if _, err := pc.AddTrack(second); err != nil {
			t.Fatal(err)
		}
	})
	enc, _ := opus.NewEncoder(48000, 1, opus.AppVoIP)
	buf := make([]byte, 1275)
	pcm := make([]int16, 960)
	for i := range pcm {
		pcm[i] = int16(6000 * math.Sin(float64(i)*0.05))
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for range 50 {
		n, _ := enc.Encode(pcm, buf)
		_ = c.track.WriteSample(media.Sample{Data: buf[:n], Duration: 20 * time.Millisecond})
		_ = second.WriteSample(media.Sample{Data: buf[:n], Duration: 20 * time.Millisecond})
		<-tick.C
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(c.received()) < 45 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(c.received()); n < 45 {
		t.Fatalf("echo of the first track: %d packets of 50", n)
	}
	if got := gaugeOrCounter(t, s.reg, "switchboard_transceiver_client_tracks_ignored_total"); got != 1 {
		t.Fatalf("tracks ignored %v, want 1", got)
	}
}

func gaugeOrCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}
