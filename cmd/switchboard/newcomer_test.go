package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/demo"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// TestCallChecksTheEcho: `switchboard call` used to exit 0 when nothing
// came back (the parrot answers turns, it does not echo). It fails unless
// the audio and the ping came back, saying what usually causes it, and
// -echo=false takes a backend that answers instead.
func TestCallChecksTheEcho(t *testing.T) {
	for _, tt := range []struct {
		mode, echo string
		fail       string // "" for success
	}{
		{agent.ModeEcho, "true", ""},
		{agent.ModeParrot, "true", "connected, but the echo did not come back (audio: "},
		{agent.ModeParrot, "false", ""},
	} {
		t.Run(tt.mode+" -echo="+tt.echo, func(t *testing.T) {
			logs := &logbuf.Buffer{}
			d, err := demo.Start(demo.Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Agent: tt.mode, Logger: slog.New(slog.NewTextHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			var out bytes.Buffer
			err = runCall(context.Background(), []string{d.URL() + "/v1/calls", "-audio", "../../testdata/speech.wav", "-duration", "1s", "-echo=" + tt.echo}, &out)
			var rep callclient.Report
			if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
				t.Fatalf("report is not JSON: %v\n%s", jerr, out.String())
			}
			switch {
			case tt.fail == "" && err != nil:
				t.Errorf("call: %v\n%s", err, out.String())
			case tt.fail != "" && (err == nil || !strings.Contains(err.Error(), tt.fail) || !strings.Contains(err.Error(), "-echo=false")):
				t.Errorf("call: %v, want an error with %q and -echo=false", err, tt.fail)
			}
			if rep.Setup.DTLSConnectedMS == 0 {
				t.Errorf("the call did not connect:\n%s", out.String())
			}
		})
	}
}

// TestConnectTimeoutSaysWhy: a session whose answer came but whose ICE
// never connects (here the answer advertises a UDP port that reads and
// answers nothing, as a relay that drops every check does) fails in call
// and load with what usually causes it and the advertised address; load
// shows its reasons as "reason count" with the first error of each, not
// as a Go map.
func TestConnectTimeoutSaysWhy(t *testing.T) {
	silent, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	backend := httptest.NewServer(mustAgent(t, agent.ModeEcho))
	defer backend.Close()
	keys, err := token.NewKeyring(token.Key{ID: 0, Secret: bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	trx, err := transceiver.New(transceiver.Config{ID: 1, Cluster: 1, ListenAddr: "127.0.0.1:0", Advertise: silent.LocalAddr().String(),
		BackendURL: "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge"}, keys, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer trx.Close()
	api := httptest.NewServer(trx.Handler())
	defer api.Close()
	url := api.URL + "/v1/calls"
	hint := "usually the relay drops the checks: the relays' and transceivers' -token-key differ, or the relay's -members lacks the transceiver's -id"
	where := silent.LocalAddr().String() + "/udp"

	var out bytes.Buffer
	err = runCall(context.Background(), []string{url, "-audio", "../../testdata/speech.wav", "-timeout", "4s"}, &out)
	if err == nil || !strings.Contains(err.Error(), hint) || !strings.Contains(err.Error(), where) {
		t.Errorf("call: %v\nwant the hint %q and the address %s", err, hint, where)
	}
	if !strings.Contains(out.String(), hint) {
		t.Errorf("the report's error lacks the hint:\n%s", out.String())
	}

	out.Reset()
	err = runLoad(context.Background(), []string{url, "-sessions", "2", "-ramp", "10ms", "-duration", "1s", "-connect-timeout", "3s", "-progress", "0"}, &out)
	if err == nil || !strings.Contains(err.Error(), "2 of 2 sessions failed: connect_timeout 2\n  connect_timeout, first: not connected after 3s; "+hint) {
		t.Errorf("load: %v", err)
	}
	if err != nil && strings.Contains(err.Error(), "map[") {
		t.Errorf("load prints its reasons as a Go map: %v", err)
	}
	var sum callclient.LoadSummary
	if jerr := json.Unmarshal(out.Bytes(), &sum); jerr != nil {
		t.Fatalf("summary is not JSON: %v\n%s", jerr, out.String())
	}
	if e := sum.Errors[callclient.FailConnectTimeout]; !strings.Contains(e, where) {
		t.Errorf("summary errors %q, want connect_timeout's first error with %s", sum.Errors, where)
	}
}

func mustAgent(t *testing.T, mode string) http.Handler {
	t.Helper()
	h, err := agent.NewMode(mode, "", slog.New(slog.DiscardHandler), agent.ParrotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/bridge", h)
	return mux
}
