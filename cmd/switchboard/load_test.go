package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/demo"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// TestLoadAgainstDemo runs `switchboard load` against the demo (relay,
// transceiver and echo agent on loopback) for a few sessions and seconds,
// with the counter payload and with speech encoded to Opus, and checks the
// summary: every session connected, echoed its audio and its data-channel
// ping, and hung up.
func TestLoadAgainstDemo(t *testing.T) {
	logs := &logbuf.Buffer{}
	d, err := demo.Start(demo.Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Agent: "echo", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("demo log tail:\n%s", logs.Tail(40))
		}
	}()
	defer d.Close()
	url := d.URL() + "/v1/calls"
	for _, tc := range []struct {
		name string
		args []string
		n    int
	}{
		{"counter", []string{"-sessions", "4", "-duration", "3s", "-ramp", "20ms"}, 4},
		{"speech", []string{"-sessions", "2", "-duration", "2s", "-audio", "../../testdata/speech.wav"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			args := append([]string{url, "-progress", "500ms", "-sessions-json"}, tc.args...)
			if err := runLoad(context.Background(), args, &out); err != nil {
				t.Fatalf("load: %v\n%s", err, out.String())
			}
			// Session lines first, then the indented summary.
			dec := json.NewDecoder(strings.NewReader(out.String()))
			var sessions []callclient.SessionResult
			var sum callclient.LoadSummary
			for dec.More() {
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					t.Fatalf("output is not JSON values: %v\n%s", err, out.String())
				}
				if bytes.Contains(raw, []byte(`"urls"`)) {
					if err := json.Unmarshal(raw, &sum); err != nil {
						t.Fatal(err)
					}
					continue
				}
				var r callclient.SessionResult
				if err := json.Unmarshal(raw, &r); err != nil {
					t.Fatal(err)
				}
				sessions = append(sessions, r)
			}
			if len(sessions) != tc.n || sum.Sessions != tc.n || sum.Connected != tc.n || sum.OK != tc.n || len(sum.Failures) != 0 {
				t.Fatalf("want %d sessions all ok; got %d session lines and summary %+v", tc.n, len(sessions), sum)
			}
			if sum.SetupMS.N != tc.n || sum.SetupMS.P50 <= 0 || sum.MaxGapMS.N != tc.n {
				t.Fatalf("summary distributions: setup %+v, gap %+v", sum.SetupMS, sum.MaxGapMS)
			}
			// Loopback loses nothing, but a loaded CI machine may drop a
			// packet or two at a socket buffer.
			if sum.PacketsSent < tc.n*50 || sum.Loss > 0.02 {
				t.Fatalf("sent %d packets, received %d (loss %.3f)", sum.PacketsSent, sum.PacketsReceived, sum.Loss)
			}
			for _, r := range sessions {
				if !r.DCOpen || !r.DCEchoEnd || r.Session == "" || r.Duplicates != 0 {
					t.Fatalf("session %+v", r)
				}
			}
		})
	}
	if n := d.Transceiver().Sessions(); n != 0 {
		t.Fatalf("%d sessions still live on the transceiver after the load ended", n)
	}
	// The transceiver measured the delay of sampled packets both ways.
	resp, err := http.Get(d.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, dir := range []string{"to_backend", "to_client"} {
		m := regexp.MustCompile(`switchboard_transceiver_media_delay_seconds_count\{direction="` + dir + `"\} (\d+)`).FindSubmatch(body)
		if m == nil || string(m[1]) == "0" {
			t.Errorf("media delay %s: no observations in /metrics", dir)
		}
	}
}

// TestLoadMarkAndVanish runs `switchboard load` against the demo with
// -connected-json, sends it SIGUSR1 once both sessions connected, and
// checks that the summary then carries the gaps after the mark; then a
// -vanish run, whose sessions must all connect and vanish.
func TestLoadMarkAndVanish(t *testing.T) {
	d, err := demo.Start(demo.Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Agent: "echo", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	url := d.URL() + "/v1/calls"

	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := runLoad(context.Background(), []string{url, "-sessions", "2", "-duration", "3s", "-progress", "0", "-connected-json"}, pw)
		pw.Close()
		errc <- err
	}()
	dec := json.NewDecoder(pr)
	connected := 0
	var sum callclient.LoadSummary
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatal(err)
		}
		var ev connectedEvent
		if !bytes.Contains(raw, []byte(`"event":"connected"`)) {
			if err := json.Unmarshal(raw, &sum); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Session == "" || ev.SetupMS <= 0 || !bytes.Contains(raw, []byte(`"url_index":0`)) {
			t.Errorf("connected event %s", raw)
		}
		if connected++; connected == 2 {
			if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if connected != 2 || sum.OK != 2 {
		t.Fatalf("%d connected events, summary %+v", connected, sum)
	}
	if sum.MarkGapMS == nil || sum.MarkGapMS.N != 2 || sum.MarkGapMS.P50 <= 0 {
		t.Fatalf("mark_gap_ms after SIGUSR1: %+v", sum.MarkGapMS)
	}

	var out bytes.Buffer
	if err := runLoad(context.Background(), []string{url, "-sessions", "3", "-vanish", "200ms", "-ramp", "20ms", "-progress", "0"}, &out); err != nil {
		t.Fatalf("vanish: %v\n%s", err, out.String())
	}
	sum = callclient.LoadSummary{}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Sessions != 3 || sum.OK != 3 || sum.Vanished != 3 || sum.PacketsSent != 0 || sum.MarkGapMS != nil {
		t.Fatalf("vanish summary %+v", sum)
	}
}

// TestLoadSessionLinesKeepBrackets: -sessions-json prints each session's
// error as it is, as the summary does; its lines were encoded before the
// encoder stopped escaping, so a refusal quoting "<" and ">" read
// \u003c and \u003e there.
func TestLoadSessionLinesKeepBrackets(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "offer refused: <no a=fingerprint> & more", http.StatusBadRequest)
	}))
	defer srv.Close()
	var out bytes.Buffer
	err := runLoad(context.Background(), []string{srv.URL + "/v1/calls", "-sessions", "1", "-progress", "0", "-sessions-json"}, &out)
	if err == nil {
		t.Fatalf("load against a server refusing every offer succeeded:\n%s", out.String())
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if !strings.Contains(first, "<no a=fingerprint> & more") || strings.Contains(out.String(), `\u003c`) {
		t.Errorf("output escapes the refusal's brackets:\n%s", out.String())
	}
}
