package e2e

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/demo"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/agent"
)

// TestBrowserCallFailed: when the peer connection fails (here: the answer
// names a UDP port that reads everything and answers nothing, and no
// ICE-TCP candidate, so ICE never connects), the page ends the call itself: state "failed" with its error,
// Hang up disabled, and Call starts a new call. It used to stay "failed"
// with its dead peer connection, Call doing nothing and Hang up disabled.
func TestBrowserCallFailed(t *testing.T) {
	chromium := chromiumPath(t)
	wav, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	d := startTestDemo(t, demo.Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", NoTCP: true, Agent: agent.ModeEcho}, slog.LevelDebug, nil)

	// A bound socket nobody reads: checks sent to it get no answer and no
	// ICMP error, as with a relay that vanished.
	silent, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	relayPort := " " + strconv.Itoa(int(d.RelayAddr().Port())) + " typ "
	silentPort := " " + strconv.Itoa(silent.LocalAddr().(*net.UDPAddr).Port) + " typ "

	// The page comes through a proxy that moves the answer's candidate to
	// the silent port; everything else passes unchanged.
	target, err := url.Parse(d.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		ModifyResponse: func(resp *http.Response) error {
			if resp.Request.Method != http.MethodPost || resp.StatusCode != http.StatusCreated {
				return nil
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if !bytes.Contains(body, []byte(relayPort)) {
				return fmt.Errorf("answer has no candidate on%q:\n%s", relayPort, body)
			}
			body = bytes.ReplaceAll(body, []byte(relayPort), []byte(silentPort))
			resp.Body = io.NopCloser(bytes.NewReader(body))
			resp.ContentLength = int64(len(body))
			resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
			return nil
		},
	})
	t.Cleanup(proxy.Close)

	ctx := startBrowser(t, chromium, wav)
	if err := chromedp.Do(ctx, chromedp.Navigate(proxy.URL+"/")); err != nil {
		t.Fatalf("navigate to %s: %v", proxy.URL, err)
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`void window.switchboard.call()`)); err != nil {
		t.Fatalf("call(): %v", err)
	}
	const buttonsJS = `({call: document.getElementById("call").disabled, hangup: document.getElementById("hangup").disabled})`
	type buttons struct{ Call, Hangup bool }

	// Chromium gives up on ICE about 15 s after the checks start.
	deadline := time.Now().Add(45 * time.Second)
	var s pageState
	for {
		if s, err = chromedp.Run(ctx, chromedp.Evaluate[pageState](pageStateJS)); err != nil {
			t.Fatalf("read window.switchboard: %v", err)
		}
		if s.State == "failed" {
			break
		}
		if s.State == "connected" {
			t.Fatal("the call connected through a port that answers nothing")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed call within 45 s; page state %q, error %q", s.State, deref(s.Error))
		}
		time.Sleep(200 * time.Millisecond)
	}
	b, err := chromedp.Run(ctx, chromedp.Evaluate[buttons](buttonsJS))
	if err != nil {
		t.Fatal(err)
	}
	if deref(s.Error) != "peer connection failed" || b.Call || !b.Hangup {
		t.Errorf("failed call: error %q, Call disabled %v, Hang up disabled %v; want \"peer connection failed\", false, true",
			deref(s.Error), b.Call, b.Hangup)
	}
	if sh := readShown(t, ctx); sh.PC != "closed" {
		t.Errorf("peer connection row %q after the failure, want closed", sh.PC)
	}
	// By the Call button: the failure and what usually causes it, with the
	// address the answer advertised.
	eb, err := chromedp.Run(ctx, chromedp.Evaluate[errorBox](errorBoxJS))
	if err != nil {
		t.Fatal(err)
	}
	silentAt := silent.LocalAddr().String() + "/udp"
	if eb.Hidden || eb.Message != "peer connection failed" || !strings.Contains(eb.Hint, "no media path came up to the relay at "+silentAt) ||
		!strings.Contains(eb.Hint, "different -token-key values") {
		t.Errorf("error shown for a failed ICE: %+v; want the hint naming %s", eb, silentAt)
	}

	// Call works again: a new call starts (and fails the same way later).
	if err := chromedp.Do(ctx, chromedp.Click("#call")); err != nil {
		t.Fatalf("click Call: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if s, err = chromedp.Run(ctx, chromedp.Evaluate[pageState](pageStateJS)); err != nil {
			t.Fatal(err)
		}
		if s.State == "calling" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state %q 5 s after Call on a failed call, want calling", s.State)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.hangup()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("hangup(): %v", err)
	}
}
