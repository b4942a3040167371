package callclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"
)

// loopbackEngine gathers host candidates on IPv4 loopback only, so tests
// use real sockets without touching other interfaces.
func loopbackEngine() *webrtc.SettingEngine {
	se := &webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	se.SetIPFilter(func(ip net.IP) bool { return ip.IsLoopback() })
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	return se
}

// echoServer is an in-test stand-in for Switchboard: an ICE-lite Pion
// answerer behind the signaling contract that sends every RTP payload back
// on its own track and every data-channel message back on the channel.
type echoServer struct {
	t         *testing.T
	srv       *httptest.Server
	dropEvery int // if > 0, drop every n-th packet instead of echoing it

	mu      sync.Mutex // guards the following
	pcs     map[string]*webrtc.PeerConnection
	deleted []string
	auth    []string
	readers sync.WaitGroup
}

func newEchoServer(t *testing.T) *echoServer {
	s := &echoServer{t: t, pcs: map[string]*webrtc.PeerConnection{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/calls", s.post)
	mux.HandleFunc("DELETE /v1/calls/{id}", s.delete)
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.close)
	return s
}

func (s *echoServer) close() {
	s.srv.Close()
	s.mu.Lock()
	pcs := s.pcs
	s.pcs = nil
	s.mu.Unlock()
	for _, pc := range pcs {
		_ = pc.Close()
	}
	s.readers.Wait()
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"message": msg}})
}

func (s *echoServer) post(w http.ResponseWriter, r *http.Request) {
	offer, err := io.ReadAll(r.Body)
	if err != nil || r.Header.Get("Content-Type") != "application/sdp" {
		httpError(w, http.StatusUnsupportedMediaType, "want application/sdp")
		return
	}
	s.mu.Lock()
	s.auth = append(s.auth, r.Header.Get("Authorization"))
	s.mu.Unlock()

	var me webrtc.MediaEngine
	codec := webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2, SDPFmtpLine: opusFmtp}
	if err := me.RegisterCodec(webrtc.RTPCodecParameters{RTPCodecCapability: codec, PayloadType: OpusPayloadType}, webrtc.RTPCodecTypeAudio); err != nil {
		httpError(w, 500, err.Error())
		return
	}
	se := loopbackEngine()
	se.SetLite(true)
	pc, err := webrtc.NewAPI(webrtc.WithMediaEngine(&me), webrtc.WithSettingEngine(*se)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		httpError(w, 500, err.Error())
		return
	}
	echo, err := webrtc.NewTrackLocalStaticRTP(codec, "echo", "echo-server")
	if err != nil {
		httpError(w, 500, err.Error())
		return
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: string(offer)}); err != nil {
		_ = pc.Close()
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	if _, err := pc.AddTrack(echo); err != nil {
		_ = pc.Close()
		httpError(w, 500, err.Error())
		return
	}

	s.mu.Lock()
	if s.pcs == nil { // closing
		s.mu.Unlock()
		_ = pc.Close()
		httpError(w, http.StatusServiceUnavailable, "closing")
		return
	}
	id := fmt.Sprint(len(s.pcs) + len(s.deleted) + 1)
	s.pcs[id] = pc
	s.readers.Add(1) // released by OnTrack's loop or on close without a track
	s.mu.Unlock()

	var once sync.Once
	done := func() { once.Do(s.readers.Done) }
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		if st == webrtc.PeerConnectionStateClosed || st == webrtc.PeerConnectionStateFailed {
			done()
		}
	})
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		defer done()
		for n := 1; ; n++ {
			p, _, err := tr.ReadRTP()
			if err != nil {
				return
			}
			if s.dropEvery > 0 && n%s.dropEvery == 0 {
				continue
			}
			if err := echo.WriteRTP(p); err != nil {
				return
			}
		}
	})
	pc.OnDataChannel(func(dc *webrtc.DataChannel) {
		dc.OnMessage(func(m webrtc.DataChannelMessage) {
			if m.IsString {
				_ = dc.SendText(string(m.Data))
			} else {
				_ = dc.Send(m.Data)
			}
		})
	})

	answer, err := pc.CreateAnswer(nil)
	if err != nil {
		httpError(w, 500, err.Error())
		return
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(answer); err != nil {
		httpError(w, 500, err.Error())
		return
	}
	<-gathered
	w.Header().Set("Content-Type", "application/sdp")
	w.Header().Set("Location", "/v1/calls/"+id)
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, pc.LocalDescription().SDP)
}

func (s *echoServer) delete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	pc, ok := s.pcs[id]
	if ok {
		delete(s.pcs, id)
		s.deleted = append(s.deleted, id)
	}
	s.mu.Unlock()
	if !ok {
		httpError(w, http.StatusNotFound, "no such session")
		return
	}
	_ = pc.Close()
	w.WriteHeader(http.StatusNoContent)
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

func TestRunEcho(t *testing.T) {
	s := newEchoServer(t)
	rep, err := Run(t.Context(), Options{
		URL:           s.srv.URL + "/v1/calls",
		AudioPath:     fixturePath,
		Duration:      time.Second,
		Timeout:       20 * time.Second,
		Logger:        testLogger(t),
		SettingEngine: loopbackEngine(),
		AuthToken:     "secret",
	})
	t.Logf("report:\n%s", rep)
	if err != nil {
		t.Fatal(err)
	}
	if rep.PacketsSent != 50 {
		t.Errorf("PacketsSent = %d, want 50 (1 s of 20 ms frames)", rep.PacketsSent)
	}
	if !rep.AudioEchoed || rep.PayloadMismatches != 0 {
		t.Errorf("AudioEchoed = %v, mismatches %d, received %d/%d", rep.AudioEchoed, rep.PayloadMismatches, rep.PacketsReceived, rep.PacketsSent)
	}
	if !rep.DataChannelEchoed {
		t.Error("DataChannelEchoed = false")
	}
	if want := s.srv.URL + "/v1/calls/1"; rep.SessionURL != want {
		t.Errorf("SessionURL = %q, want %q", rep.SessionURL, want)
	}
	st := rep.Setup
	for name, v := range map[string]float64{
		"signaling": st.SignalingMS, "ice": st.ICEConnectedMS, "dtls": st.DTLSConnectedMS,
		"data channel": st.DataChannelOpenMS, "first audio": st.FirstAudioMS,
	} {
		if v <= 0 {
			t.Errorf("setup time %s = %v, want > 0", name, v)
		}
	}
	if st.ICEConnectedMS > st.DTLSConnectedMS || st.DTLSConnectedMS > st.FirstAudioMS {
		t.Errorf("setup events out of order: %+v", st)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.deleted) != 1 || s.deleted[0] != "1" {
		t.Errorf("deleted sessions %v, want [1]", s.deleted)
	}
	if len(s.auth) != 1 || s.auth[0] != "Bearer secret" {
		t.Errorf("Authorization %q, want Bearer secret", s.auth)
	}

	var js map[string]any
	if err := json.Unmarshal([]byte(rep.String()), &js); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"setup_ms", "packets_sent", "packets_received", "audio_echoed", "payload_mismatches", "data_channel_echoed", "session_url"} {
		if _, ok := js[k]; !ok {
			t.Errorf("JSON report lacks %q: %s", k, rep)
		}
	}
}

func TestRunLossyEchoIsNotEchoed(t *testing.T) {
	s := newEchoServer(t)
	s.dropEvery = 5 // 80% come back: below the 90% bar
	rep, err := Run(t.Context(), Options{
		URL: s.srv.URL + "/v1/calls", AudioPath: fixturePath, Duration: 400 * time.Millisecond,
		Timeout: 20 * time.Second, SettingEngine: loopbackEngine(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.AudioEchoed || rep.PayloadMismatches != 0 || rep.PacketsReceived == 0 {
		t.Errorf("AudioEchoed %v, mismatches %d, received %d/%d; want false, 0, >0",
			rep.AudioEchoed, rep.PayloadMismatches, rep.PacketsReceived, rep.PacketsSent)
	}
}

func TestRunSignalingErrors(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{
			name: "json error",
			handler: func(w http.ResponseWriter, r *http.Request) {
				httpError(w, http.StatusUnauthorized, "token expired")
			},
			want: "token expired",
		},
		{
			name: "no location",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/sdp")
				w.WriteHeader(http.StatusCreated)
			},
			want: "without Location",
		},
		{
			name: "plain text 503",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "overloaded", http.StatusServiceUnavailable)
			},
			want: "overloaded",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			rep, err := Run(t.Context(), Options{
				URL: srv.URL + "/v1/calls", AudioPath: fixturePath, Timeout: 10 * time.Second,
				SettingEngine: loopbackEngine(),
			})
			if !errors.Is(err, ErrSignaling) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrSignaling containing %q", err, tt.want)
			}
			if rep.Error != err.Error() {
				t.Errorf("Report.Error = %q, want %q", rep.Error, err)
			}
		})
	}
}

func TestRunOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
	}{
		{name: "no URL", opts: Options{AudioPath: fixturePath}},
		{name: "bad scheme", opts: Options{URL: "ftp://x/v1/calls", AudioPath: fixturePath}},
		{name: "no audio", opts: Options{URL: "http://127.0.0.1:1/v1/calls"}},
		{name: "missing file", opts: Options{URL: "http://127.0.0.1:1/v1/calls", AudioPath: "testdata/nope.wav"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Run(context.Background(), tt.opts); !errors.Is(err, ErrOptions) {
				t.Fatalf("err = %v, want ErrOptions", err)
			}
		})
	}
}

func TestPayloadMismatches(t *testing.T) {
	p := func(s ...string) [][]byte {
		out := make([][]byte, len(s))
		for i := range s {
			out[i] = []byte(s[i])
		}
		return out
	}
	tests := []struct {
		name           string
		sent, received [][]byte
		want           int
	}{
		{name: "identical", sent: p("a", "b", "c"), received: p("a", "b", "c"), want: 0},
		{name: "losses", sent: p("a", "b", "c", "d"), received: p("a", "d"), want: 0},
		{name: "repeated silence", sent: p("s", "s", "s", "x"), received: p("s", "s", "x"), want: 0},
		{name: "reordered", sent: p("a", "b", "c"), received: p("b", "a", "c"), want: 1},
		{name: "foreign", sent: p("a", "b"), received: p("a", "z", "b"), want: 1},
		{name: "duplicate", sent: p("a", "b"), received: p("a", "a", "b"), want: 1},
		{name: "nothing", sent: p("a"), received: nil, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := payloadMismatches(tt.sent, tt.received); got != tt.want {
				t.Errorf("payloadMismatches = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestRunUserSpeechRates calls with speech files as a user makes them:
// espeak-ng's own 22,050 Hz output and the same speech at CD rate (sox),
// which the client resamples to 48 kHz before encoding.
func TestRunUserSpeechRates(t *testing.T) {
	for _, tool := range []string{"espeak-ng", "sox"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := tool + " is not installed (scripts/deps.sh test installs it)"
			if os.Getenv("CI") != "" {
				t.Fatal(msg + "; CI is set, and in CI a missing tool is an error")
			}
			t.Skip(msg)
		}
	}
	dir := t.TempDir()
	espeak := filepath.Join(dir, "espeak.wav")
	cd := filepath.Join(dir, "cd.wav")
	if out, err := exec.Command("espeak-ng", "-w", espeak, "Hello, can you hear me? This is a test of the switchboard.").CombinedOutput(); err != nil {
		t.Fatalf("espeak-ng: %v\n%s", err, out)
	}
	if out, err := exec.Command("sox", espeak, "-r", "44100", cd).CombinedOutput(); err != nil {
		t.Fatalf("sox: %v\n%s", err, out)
	}
	s := newEchoServer(t)
	for _, tc := range []struct {
		path string
		rate int
	}{{espeak, 22050}, {cd, 44100}} {
		w, err := LoadWAV(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if w.SampleRate != tc.rate {
			t.Fatalf("%s is %d Hz, want %d", tc.path, w.SampleRate, tc.rate)
		}
		rep, err := Run(t.Context(), Options{
			URL: s.srv.URL + "/v1/calls", AudioPath: tc.path, Duration: time.Second, Timeout: 20 * time.Second,
			Logger: testLogger(t), SettingEngine: loopbackEngine(),
		})
		if err != nil {
			t.Fatalf("%d Hz: %v", tc.rate, err)
		}
		if rep.PacketsSent != 50 || !rep.AudioEchoed || rep.PayloadMismatches != 0 {
			t.Errorf("%d Hz: sent %d, echoed %v, mismatches %d", tc.rate, rep.PacketsSent, rep.AudioEchoed, rep.PayloadMismatches)
		}
	}
}

// TestReportJSONKeepsBrackets: the report prints errors and addresses as
// they are; encoding/json's default turned "<" and ">" into \u003c and
// \u003e.
func TestReportJSONKeepsBrackets(t *testing.T) {
	s := Report{Error: `POST: 400 Bad Request: <no a=fingerprint> & more`}.String()
	if !strings.Contains(s, `"error": "POST: 400 Bad Request: <no a=fingerprint> & more"`) || strings.HasSuffix(s, "\n") {
		t.Errorf("report:\n%s", s)
	}
}
