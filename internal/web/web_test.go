package web

import (
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestHandlerServesPage(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	page := string(body)
	script := string(inlineElement(body, "script"))
	for _, want := range []string{`"/v1/calls"`, `createDataChannel("oai-events")`, "window.switchboard", "dataset.state",
		"iceGatheringState", `method: "POST"`, `method: "DELETE"`, "currentRoundTripTime", "totalAudioEnergy", "jitter"} {
		if !strings.Contains(script, want) {
			t.Errorf("script lacks %s", want)
		}
	}
	for _, want := range []string{"<audio", "autoplay", ">Call<", ">Ping<", ">Hang up<"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	for _, banned := range []string{"http://", "https://", "<script src", "<link"} {
		if strings.Contains(page, banned) {
			t.Errorf("page references an external asset (%q)", banned)
		}
	}

	// The CSP must carry the hash of the exact inline script and style,
	// or the browser refuses to run them.
	csp := resp.Header.Get("Content-Security-Policy")
	for _, tag := range []string{"script", "style"} {
		sum := sha256.Sum256(inlineElement(body, tag))
		if h := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, tag+"-src "+h) {
			t.Errorf("CSP %q lacks %s-src %s", csp, tag, h)
		}
	}
}

func TestHandlerRoutes(t *testing.T) {
	tests := []struct {
		name, method, path string
		want               int
	}{
		{name: "root", method: "GET", path: "/", want: 200},
		{name: "index", method: "GET", path: "/index.html", want: 200},
		{name: "head", method: "HEAD", path: "/", want: 200},
		{name: "other path", method: "GET", path: "/app.js", want: 404},
		{name: "post", method: "POST", path: "/", want: 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			Handler().ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.want {
				t.Errorf("%s %s = %d, want %d", tt.method, tt.path, rec.Code, tt.want)
			}
		})
	}
}

// TestHandlerTellsThePageItsAgent: NewHandler puts Page.Agent, escaped, in
// the body's data-agent attribute, and Page.Auth in data-auth, which the
// script reads; Handler leaves them empty (an agent the page does not
// know, no auth).
func TestHandlerTellsThePageItsAgent(t *testing.T) {
	if script := string(inlineElement(indexHTML, "script")); !strings.Contains(script, "document.body.dataset.agent") || !strings.Contains(script, "document.body.dataset.auth") {
		t.Fatal("the script does not read the body's data-agent and data-auth")
	}
	for _, tt := range []struct {
		name string
		h    http.Handler
		want string
	}{
		{"unknown", Handler(), `<body data-state="idle" data-agent="" data-auth="">`},
		{"parrot", NewHandler(Page{Agent: "parrot"}), `<body data-state="idle" data-agent="parrot" data-auth="">`},
		{"escaped", NewHandler(Page{Agent: `x"><script>`}), `<body data-state="idle" data-agent="x&#34;&gt;&lt;script&gt;" data-auth="">`},
		{"auth on", NewHandler(Page{Auth: true}), `<body data-state="idle" data-agent="" data-auth="on">`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tt.h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if page := rec.Body.String(); !strings.Contains(page, tt.want) {
				t.Errorf("page lacks %s", tt.want)
			}
		})
	}
}

// TestPageHasNoInlineStyleAttributes: the CSP allows the page's one
// <style> element by hash, so a style="" attribute (or an inline event
// handler) is refused, and Chromium logs a violation on every load; the
// page had one on its "Speaking now" line.
func TestPageHasNoInlineStyleAttributes(t *testing.T) {
	page := string(indexHTML)
	for _, bad := range []string{" style=", " onclick=", " onload=", " onsubmit=", "javascript:"} {
		if strings.Contains(page, bad) {
			t.Errorf("index.html has %q, which the CSP refuses", strings.TrimSpace(bad))
		}
	}
}
