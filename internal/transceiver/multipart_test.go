package transceiver

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/httpapi"
)

// multipartBody builds a multipart/form-data body with the given fields,
// in order, and returns it with its Content-Type.
func multipartBody(t *testing.T, fields ...[2]string) (io.Reader, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, f := range fields {
		if err := mw.WriteField(f[0], f[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b, mw.FormDataContentType()
}

// TestMultipartOffer: OpenAI's multipart call shape (an sdp part and a
// session JSON part) is answered like a raw offer, and the backend gets
// the session object in session.start.
func TestMultipartOffer(t *testing.T) {
	starts := make(chan bridge.SessionStart, 4)
	url := backendFunc(t, func(sc *bridge.ServerConn) {
		defer sc.Close()
		starts <- sc.Session()
		for {
			if _, err := sc.Recv(t.Context()); err != nil {
				return
			}
		}
	})
	_, api, _ := newTestServer(t, func(c *Config) { c.BackendURL = url })
	const session = `{"type":"realtime","model":"gpt-realtime","instructions":"Speak briefly.","audio":{"output":{"voice":"marin"}}}`
	for _, path := range []string{"/v1/realtime/calls", "/v1/calls"} {
		t.Run(path, func(t *testing.T) {
			body, ctype := multipartBody(t, [2]string{"sdp", clientOffer(t, true)}, [2]string{"session", session})
			resp := post(t, api.URL+path, ctype, readAll(t, body))
			answer, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusCreated || resp.Header.Get("Content-Type") != "application/sdp" ||
				!strings.HasPrefix(resp.Header.Get("Location"), "/v1/calls/") || !strings.Contains(string(answer), "a=ice-lite") {
				t.Fatalf("status %d, headers %v, body %s", resp.StatusCode, resp.Header, answer)
			}
			select {
			case st := <-starts:
				if string(st.Session) != session {
					t.Fatalf("backend's session.start session %s, want %s", st.Session, session)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the backend got no session.start")
			}
		})
	}
	t.Run("no session part", func(t *testing.T) {
		body, ctype := multipartBody(t, [2]string{"sdp", clientOffer(t, true)})
		if resp := post(t, api.URL+"/v1/calls", ctype, readAll(t, body)); resp.StatusCode != http.StatusCreated {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if st := <-starts; st.Session != nil {
			t.Fatalf("session %s sent for a call that had none", st.Session)
		}
	})
}

// TestMultipartOfferErrors: a multipart call without an sdp part, or with
// a session part that is not a JSON object, gets a 400 saying so.
func TestMultipartOfferErrors(t *testing.T) {
	s, api, _ := newTestServer(t)
	offer := clientOffer(t, true)
	tests := []struct {
		name   string
		fields [][2]string
		code   string
	}{
		{"no sdp part", [][2]string{{"session", `{"voice":"marin"}`}}, "bad_offer"},
		{"session not JSON", [][2]string{{"sdp", offer}, {"session", `voice=marin`}}, "bad_session"},
		{"session an array", [][2]string{{"sdp", offer}, {"session", `[{"voice":"marin"}]`}}, "bad_session"},
		{"sdp part not an offer", [][2]string{{"sdp", "hello"}}, "bad_offer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, ctype := multipartBody(t, tt.fields...)
			resp := post(t, api.URL+"/v1/realtime/calls", ctype, readAll(t, body))
			var e httpapi.Error
			_ = json.NewDecoder(resp.Body).Decode(&e)
			if resp.StatusCode != http.StatusBadRequest || e.Error.Code != tt.code || e.Error.Message == "" {
				t.Fatalf("status %d, error %+v; want 400 %s", resp.StatusCode, e.Error, tt.code)
			}
		})
	}
	if n := s.Sessions(); n != 0 {
		t.Fatalf("%d sessions after refused offers", n)
	}
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
