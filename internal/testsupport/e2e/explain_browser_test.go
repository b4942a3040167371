package e2e

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/demo"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
	"github.com/switchboard-rtc/switchboard/internal/web"
)

// errorBoxJS reads the error the page shows by its Call button.
const errorBoxJS = `(() => ({hidden: document.getElementById("error").hidden,
	message: document.getElementById("error-message").textContent,
	hint: document.getElementById("error-hint").textContent,
	state: window.switchboard.state, error: window.switchboard.error, sbHint: window.switchboard.hint,
	callDisabled: document.getElementById("call").disabled}))()`

// brokenFlagsJS returns every command-line flag ("-backend") in the
// page's hints, error and data-channel echo that the browser breaks across
// two lines, at any width of the page from a phone's to a desktop's: a
// line broke after the hyphen of "-backend" at the test's own width.
const brokenFlagsJS = `(() => {
	const main = document.querySelector("main"), saved = main.style.width, bad = [];
	for (let w = 260; w <= 760; w += 4) {
		main.style.width = w + "px";
		for (const id of ["error-message", "error-hint", "hint", "echo"]) {
			const walk = document.createTreeWalker(document.getElementById(id), NodeFilter.SHOW_TEXT);
			for (let n = walk.nextNode(); n; n = walk.nextNode()) {
				for (const m of n.data.matchAll(/(^|[\s(])(-[a-z][a-z-]*)/g)) {
					const r = document.createRange(), at = m.index + m[1].length;
					r.setStart(n, at);
					r.setEnd(n, at + m[2].length);
					if (r.getClientRects().length > 1) bad.push(w + " px: " + m[2]);
				}
			}
		}
	}
	main.style.width = saved;
	return bad;
})()`

type errorBox struct {
	Hidden       bool
	Message      string
	Hint         string
	State        string
	Error        *string
	SbHint       *string
	CallDisabled bool
}

// TestPageExplainsItself: the page says what to do (a hint for the agent
// behind it), shows a failed call's error by the Call button with what
// usually causes it (not only in its log), and loads without a Content
// Security Policy violation (it logged one on every load: an inline style
// attribute).
func TestPageExplainsItself(t *testing.T) {
	chromium := chromiumPath(t)
	wav, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	readError := func(t *testing.T, ctx context.Context, what string) errorBox {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			b, err := chromedp.Run(ctx, chromedp.Evaluate[errorBox](errorBoxJS))
			if err != nil {
				t.Fatal(err)
			}
			if !b.Hidden {
				return b
			}
			if time.Now().After(deadline) {
				t.Fatalf("no error shown for %s in 15 s: %+v", what, b)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	hintText := func(t *testing.T, ctx context.Context) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("hint").textContent + " | " + document.getElementById("token-label").textContent`))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("backend down", func(t *testing.T) {
		down := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", http.StatusServiceUnavailable) })
		d := startTestDemo(t, demo.Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0", Backend: down}, slog.LevelInfo, nil)
		ctx, console := startBrowserConsole(t, chromium, wav)
		if err := chromedp.Do(ctx, chromedp.Navigate(d.URL()+"/")); err != nil {
			t.Fatal(err)
		}
		if h := hintText(t, ctx); !strings.Contains(h, "Click Call and allow the microphone.") || !strings.Contains(h, "Speak, then pause") {
			t.Errorf("hint %q", h)
		}
		if err := chromedp.Do(ctx, chromedp.Click("#call")); err != nil {
			t.Fatal(err)
		}
		b := readError(t, ctx, "the backend down")
		if !strings.HasPrefix(b.Message, "POST 502: the agent behind this server is unavailable") ||
			!strings.Contains(b.Hint, "The agent behind the server is down: is the backend running at the transceiver's -backend URL") ||
			b.State != "failed" || b.CallDisabled || deref(b.SbHint) != b.Hint {
			t.Errorf("backend down: %+v", b)
		}
		broken, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](brokenFlagsJS))
		if err != nil {
			t.Fatal(err)
		}
		if len(broken) > 0 {
			t.Errorf("flags broken across lines (page width: flag): %q", broken)
		}
		for _, m := range console() {
			if strings.Contains(m, "Content Security Policy") || strings.Contains(m, "Refused to") {
				t.Errorf("the page's load logged a CSP violation: %s", m)
			}
		}
	})

	t.Run("auth on, no token", func(t *testing.T) {
		keys, err := token.NewKeyring(token.Key{ID: 0, Secret: bytes.Repeat([]byte{3}, 32)})
		if err != nil {
			t.Fatal(err)
		}
		backend := httptest.NewServer(agentMux(t))
		defer backend.Close()
		trx, err := transceiver.New(transceiver.Config{ID: 1, Cluster: 1, ListenAddr: "127.0.0.1:0", Advertise: "127.0.0.1:3478",
			BackendURL: "ws" + strings.TrimPrefix(backend.URL, "http") + "/v1/bridge",
			Auth:       auth.Config{SigningKey: "c2lnbmluZy1rZXktb2YtMzItYnl0ZXMtZm9yLXRlc3Rz", APIKeys: []string{strings.Repeat("k", 32)}},
		}, keys, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer trx.Close()
		mux := http.NewServeMux()
		mux.Handle("/v1/", trx.Handler())
		mux.Handle("/", web.NewHandler(web.Page{Auth: true}))
		srv := httptest.NewServer(mux)
		defer srv.Close()
		ctx := startBrowser(t, chromium, wav)
		if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
			t.Fatal(err)
		}
		if h := hintText(t, ctx); !strings.Contains(h, "This server has authentication on") || !strings.Contains(h, "Bearer token (required") {
			t.Errorf("auth hint %q", h)
		}
		if err := chromedp.Do(ctx, chromedp.Click("#call")); err != nil {
			t.Fatal(err)
		}
		b := readError(t, ctx, "a call without a token")
		if !strings.HasPrefix(b.Message, "POST 401: send a client token") || !strings.Contains(b.Hint, "paste a client token in the Bearer token field") {
			t.Errorf("401: %+v", b)
		}
	})
}

func agentMux(t *testing.T) http.Handler {
	t.Helper()
	h, err := agent.NewMode(agent.ModeEcho, "", slog.New(slog.DiscardHandler), agent.ParrotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/bridge", h)
	return mux
}
