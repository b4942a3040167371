package transceiver

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/httpapi"
	"github.com/switchboard-rtc/switchboard/internal/sdpfrag"
)

// TestPatchErrors: every way a PATCH can be wrong gets a status and a JSON
// error that says what to fix.
func TestPatchErrors(t *testing.T) {
	_, api, _ := newTestServer(t)
	resp := post(t, api.URL+"/v1/calls", "application/sdp", clientOffer(t, true))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("offer: %d", resp.StatusCode)
	}
	session, tag := api.URL+resp.Header.Get("Location"), resp.Header.Get("ETag")
	if !strings.HasSuffix(tag, `/1"`) {
		t.Fatalf("ETag %s does not name ICE generation 1", tag)
	}
	good := "a=ice-ufrag:abcd\r\na=ice-pwd:" + strings.Repeat("p", 22) + "\r\n"
	for _, c := range []struct {
		name, url, ifMatch, ctype, body string
		want                            int
		code                            string
	}{
		{"no If-Match", session, "", sdpfrag.ContentType, good, http.StatusPreconditionRequired, "if_match_required"},
		{"stale ETag", session, `"x/1"`, sdpfrag.ContentType, good, http.StatusPreconditionFailed, "etag_mismatch"},
		{"weak ETag", session, "W/" + tag, sdpfrag.ContentType, good, http.StatusPreconditionFailed, "etag_mismatch"},
		{"wrong type", session, "*", "application/sdp", good, http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{"unknown session", api.URL + "/v1/calls/nope", "*", sdpfrag.ContentType, good, http.StatusNotFound, "not_found"},
		{"bad fragment", session, "*", sdpfrag.ContentType, "a=ice-ufrag:ab\r\n", http.StatusBadRequest, "bad_fragment"},
		{"too large", session, "*", sdpfrag.ContentType, strings.Repeat("a=x\r\n", sdpfrag.MaxLen), http.StatusRequestEntityTooLarge, "fragment_too_large"},
		{"trickle only", session, tag, sdpfrag.ContentType, "a=mid:0\r\na=candidate:1 1 udp 1 192.0.2.1 9 typ host\r\n", http.StatusNoContent, ""},
		{"tag in a list", api.URL + "/v1/realtime/calls/" + strings.TrimPrefix(resp.Header.Get("Location"), "/v1/calls/"), `"a/1", ` + tag, sdpfrag.ContentType, "a=end-of-candidates\r\n", http.StatusNoContent, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPatch, c.url, strings.NewReader(c.body))
			req.Header.Set("Content-Type", c.ctype)
			if c.ifMatch != "" {
				req.Header.Set("If-Match", c.ifMatch)
			}
			r, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Body.Close()
			body, _ := io.ReadAll(r.Body)
			if r.StatusCode != c.want {
				t.Fatalf("status %d (%s), want %d", r.StatusCode, body, c.want)
			}
			if c.code == "" {
				if got := r.Header.Get("ETag"); got != tag {
					t.Fatalf("ETag %q after a trickle PATCH, want the unchanged %q", got, tag)
				}
				return
			}
			var e httpapi.Error
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != c.code || e.Error.Message == "" {
				t.Fatalf("error body %s, want code %s with a message", body, c.code)
			}
		})
	}
}

// TestRestartIdempotent: a restart sent again (its 200 was lost) gets the
// same answer and the new ETag instead of a 204 or a 412; a different
// restart within MinRestartInterval gets 429.
func TestRestartIdempotent(t *testing.T) {
	_, api, keys := newTestServer(t)
	resp := post(t, api.URL+"/v1/calls", "application/sdp", clientOffer(t, true))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("offer: %d", resp.StatusCode)
	}
	session, tag1 := api.URL+resp.Header.Get("Location"), resp.Header.Get("ETag")
	patch := func(ifMatch, frag string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPatch, session, strings.NewReader(frag))
		req.Header.Set("Content-Type", sdpfrag.ContentType)
		req.Header.Set("If-Match", ifMatch)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r, string(b)
	}
	frag := func(u string) string {
		return "a=mid:0\r\na=ice-ufrag:" + u + "\r\na=ice-pwd:" + strings.Repeat(u, 6) + "\r\n"
	}

	r, answer := patch(tag1, frag("rst1"))
	if r.StatusCode != http.StatusOK {
		t.Fatalf("restart: %d %s", r.StatusCode, answer)
	}
	tag2 := r.Header.Get("ETag")
	f, err := sdpfrag.Parse(answer)
	if err != nil || f.Ufrag == "" || len(f.Candidates) != 1 {
		t.Fatalf("answer fragment %q: %+v, %v", answer, f, err)
	}
	if c, err := keys.Open([]byte(f.Ufrag), time.Now()); err != nil || c.Transceiver != 9 {
		t.Fatalf("new ufrag is not this transceiver's token: %+v, %v", c, err)
	}
	for _, ifMatch := range []string{tag1, tag2, "*"} {
		r, again := patch(ifMatch, frag("rst1"))
		if r.StatusCode != http.StatusOK || again != answer || r.Header.Get("ETag") != tag2 {
			t.Fatalf("repeat with If-Match %s: %d %q ETag %s; want 200, the same answer and %s", ifMatch, r.StatusCode, again, r.Header.Get("ETag"), tag2)
		}
	}
	if r, body := patch(tag2, frag("rst2")); r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
		t.Fatalf("second restart at once: %d %s, want 429 with Retry-After", r.StatusCode, body)
	}
	if r, _ := patch(tag1, frag("rst2")); r.StatusCode != http.StatusPreconditionFailed {
		t.Fatalf("a new restart with the old ETag: %d, want 412", r.StatusCode)
	}
	time.Sleep(MinRestartInterval)
	r, _ = patch(tag2, frag("rst2"))
	if r.StatusCode != http.StatusOK || !strings.HasSuffix(r.Header.Get("ETag"), `/3"`) {
		t.Fatalf("second restart after the interval: %d, ETag %s", r.StatusCode, r.Header.Get("ETag"))
	}
}
