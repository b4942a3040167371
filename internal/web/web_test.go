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
// the body's data-agent attribute, which the script reads; Handler leaves
// it empty (an agent the page does not know).
func TestHandlerTellsThePageItsAgent(t *testing.T) {
	if script := string(inlineElement(indexHTML, "script")); !strings.Contains(script, "document.body.dataset.agent") {
		t.Fatal("the script does not read the body's data-agent")
	}
	for _, tt := range []struct {
		name string
		h    http.Handler
		want string
	}{
		{"unknown", Handler(), `<body data-state="idle" data-agent="">`},
		{"parrot", NewHandler(Page{Agent: "parrot"}), `<body data-state="idle" data-agent="parrot">`},
		{"escaped", NewHandler(Page{Agent: `x"><script>`}), `<body data-state="idle" data-agent="x&#34;&gt;&lt;script&gt;">`},
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
