package transceiver

import (
	"encoding/binary"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
)

// TestPtimeTen: with Ptime 10 the answer asks for 10 ms packets
// (a=ptime:10 in its audio section); the client's 10 ms packets reach a
// PCM backend as the bridge's 20 ms frames, in order and without
// concealment; and a reply from the backend comes back to the client in
// 10 ms Opus packets, numbered and timestamped 480 apart.
func TestPtimeTen(t *testing.T) {
	const rate, replyMs = 24000, 400
	frames := make(chan bridge.AudioFrame, 256) // what the backend gets
	backend := backendFormat(t, bridge.FormatPCM24k, func(sc *bridge.ServerConn) {
		replied := false
		serveAudio(t, sc, func(a *bridge.AudioFrame) error {
			select {
			case frames <- bridge.AudioFrame{Seq: a.Seq, Timestamp: a.Timestamp, Payload: append([]byte(nil), a.Payload...), Concealed: a.Concealed}:
			default:
			}
			if replied {
				return nil
			}
			// A reply in one burst: a 440 Hz tone.
			replied = true
			pcm := make([]byte, 0, 2*rate*replyMs/1000)
			for i := range rate * replyMs / 1000 {
				pcm = binary.LittleEndian.AppendUint16(pcm, uint16(int16(8000*math.Sin(2*math.Pi*440*float64(i)/rate))))
			}
			return sc.SendAudio(t.Context(), bridge.AudioFrame{Payload: pcm})
		})
	})
	_, api := directServer(t, func(c *Config) { c.BackendURL, c.Ptime = backend, 10 })

	pc := webrtctest.PeerConnection(t)
	track := addOpusTrack(t, pc)
	connected := whenConnected(pc)
	type got struct {
		seq uint16
		ts  uint32
		dur int
	}
	received := make(chan got, 256)
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		for {
			p, _, err := tr.ReadRTP()
			if err != nil {
				return
			}
			dur, err := audio.PacketDuration(p.Payload)
			if err != nil {
				dur = -1
			}
			select {
			case received <- got{p.SequenceNumber, p.Timestamp, dur}:
			default:
			}
		}
	})
	if answer := offerCall(t, api, pc); !ptimeInAudioSection(answer, "a=ptime:10") {
		t.Fatalf("the answer's audio section has no a=ptime:10:\n%s", answer)
	}
	waitFor(t, connected, 10*time.Second, "the client's connection")

	// The client sends 10 ms packets of a tone, as a browser that honours
	// the answer's ptime does.
	enc, err := audio.NewEncoderConfig(audio.EncoderConfig{Rate: 48000, FrameMs: 10})
	if err != nil {
		t.Fatal(err)
	}
	const sent = 40 // 400 ms
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := range sent {
			pcm := make([]byte, 0, 960)
			for k := range 480 {
				pcm = binary.LittleEndian.AppendUint16(pcm, uint16(int16(6000*math.Sin(2*math.Pi*300*float64(i*480+k)/48000))))
			}
			ps, err := enc.Write(pcm)
			if err != nil || len(ps) != 1 {
				return
			}
			if err := track.WriteRTP(&rtp.Packet{Header: rtp.Header{Version: 2, SequenceNumber: uint16(i), Timestamp: uint32(i * 480)}, Payload: ps[0].Payload}); err != nil {
				return
			}
			<-tick.C
		}
	}()

	// The backend gets 20 ms frames at 24 kHz, one per two packets.
	deadline := time.After(20 * time.Second) // liveness bound, not a latency assertion
	var in []bridge.AudioFrame
	for len(in) < sent/2 {
		select {
		case f := <-frames:
			in = append(in, f)
		case <-deadline:
			t.Fatalf("the backend got %d frames of the %d the client's %d packets make", len(in), sent/2, sent)
		}
	}
	for i, f := range in {
		if len(f.Payload) != 2*rate/50 || f.Concealed {
			t.Fatalf("frame %d: %d bytes, concealed %v; want 20 ms at 24 kHz (%d bytes), decoded", i, len(f.Payload), f.Concealed, 2*rate/50)
		}
		if i > 0 && (f.Seq != in[i-1].Seq+1 || f.Timestamp != in[i-1].Timestamp+rate/50) {
			t.Fatalf("frame %d (seq %d, ts %d) after (seq %d, ts %d): want consecutive 20 ms frames", i, f.Seq, f.Timestamp, in[i-1].Seq, in[i-1].Timestamp)
		}
	}

	// The reply comes back in 10 ms packets.
	var out []got
	for len(out) < replyMs/10 {
		select {
		case g := <-received:
			out = append(out, g)
		case <-deadline:
			t.Fatalf("the client got %d packets of the reply's %d", len(out), replyMs/10)
		}
	}
	for i, g := range out {
		if g.dur != 480 {
			t.Fatalf("reply packet %d is %d samples at 48 kHz, want 480 (10 ms)", i, g.dur)
		}
		if i > 0 && (g.seq != out[i-1].seq+1 || g.ts != out[i-1].ts+480) {
			t.Fatalf("reply packet %d (seq %d, ts %d) after (seq %d, ts %d): want seq +1, timestamp +480", i, g.seq, g.ts, out[i-1].seq, out[i-1].ts)
		}
	}
}

// backendFormat is backendFunc with a backend that takes format.
func backendFormat(t *testing.T, format string, serve func(sc *bridge.ServerConn)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{Formats: []string{format}})
		if err != nil {
			return
		}
		serve(sc)
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/bridge"
}

// ptimeInAudioSection reports whether line is an attribute of sdp's
// audio m-section.
func ptimeInAudioSection(sdp, line string) bool {
	audio := false
	for l := range strings.Lines(sdp) {
		l = strings.TrimRight(l, "\r\n")
		if strings.HasPrefix(l, "m=") {
			audio = strings.HasPrefix(l, "m=audio ")
		}
		if audio && l == line {
			return true
		}
	}
	return false
}

// TestAnswerPtime: the answer asks for 10 ms packets only at -ptime 10;
// at the default 20 ms it carries no a=ptime (peer.AnswerParams.Ptime 0).
func TestAnswerPtime(t *testing.T) {
	for _, tc := range []struct{ ptime, want int }{{10, 10}, {DefaultPtime, 0}} {
		if got := (&Config{Ptime: tc.ptime}).answerPtime(); got != tc.want {
			t.Errorf("ptime %d: answer ptime %d, want %d", tc.ptime, got, tc.want)
		}
	}
}

func TestConfigPtime(t *testing.T) {
	for _, tc := range []struct {
		ptime, want int
		ok          bool
	}{{0, 20, true}, {10, 10, true}, {20, 20, true}, {15, 0, false}, {40, 0, false}, {-10, 0, false}} {
		c := Config{ID: 1, Advertise: "192.0.2.1:3478", BackendURL: DefaultBackendURL, Ptime: tc.ptime}
		err := c.Validate()
		switch {
		case tc.ok && (err != nil || c.Ptime != tc.want):
			t.Errorf("ptime %d: %v, ptime %d; want ptime %d", tc.ptime, err, c.Ptime, tc.want)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "ptime")):
			t.Errorf("ptime %d: %v, want an error naming ptime", tc.ptime, err)
		}
	}
}
