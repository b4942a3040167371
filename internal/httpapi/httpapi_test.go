package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCORS(t *testing.T) {
	h := CORS(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	tests := []struct {
		name   string
		method string
		status int
	}{
		{"preflight answered, not passed on", http.MethodOptions, http.StatusNoContent},
		{"request passed on with CORS headers", http.MethodPost, http.StatusTeapot},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tt.method, "/v1/calls", nil))
			if rec.Code != tt.status || rec.Header().Get("Access-Control-Allow-Origin") != "*" ||
				rec.Header().Get("Access-Control-Expose-Headers") == "" {
				t.Fatalf("status %d, headers %v", rec.Code, rec.Header())
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusBadRequest, "bad_offer", `the "offer" is bad`)
	var e Error
	if err := json.NewDecoder(rec.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	if rec.Code != 400 || rec.Header().Get("Content-Type") != "application/json" ||
		e.Error.Code != "bad_offer" || e.Error.Message != `the "offer" is bad` {
		t.Fatalf("%d %v %+v", rec.Code, rec.Header(), e)
	}
}

// TestSignalingRoutes: both paths of the signaling API reach the front's
// handlers with the session's id, the probes answer, and the rest is not
// found.
func TestSignalingRoutes(t *testing.T) {
	var got []string
	note := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			got = append(got, name+" "+r.PathValue("id"))
			w.WriteHeader(http.StatusTeapot)
		}
	}
	s := Signaling{Offer: note("offer"), Patch: note("patch"), Delete: note("delete"), Mint: note("mint")}
	h := s.Handler()
	for _, tt := range []struct {
		method, path string
		status       int
		handler      string
	}{
		{"POST", "/v1/calls", http.StatusTeapot, "offer "},
		{"POST", "/v1/realtime/calls", http.StatusTeapot, "offer "},
		{"PATCH", "/v1/calls/abc", http.StatusTeapot, "patch abc"},
		{"PATCH", "/v1/realtime/calls/abc", http.StatusTeapot, "patch abc"},
		{"DELETE", "/v1/calls/abc", http.StatusTeapot, "delete abc"},
		{"DELETE", "/v1/realtime/calls/abc", http.StatusTeapot, "delete abc"},
		{"POST", "/v1/client_tokens", http.StatusTeapot, "mint "},
		{"GET", "/live", http.StatusNoContent, ""},
		{"GET", "/ready", http.StatusNoContent, ""},
		{"GET", "/v1/calls", http.StatusMethodNotAllowed, ""},
		{"POST", "/v1/other", http.StatusNotFound, ""},
	} {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			got = nil
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(tt.method, tt.path, nil))
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d", w.Code, tt.status)
			}
			if want := tt.handler; (want == "" && got != nil) || (want != "" && (len(got) != 1 || got[0] != want)) {
				t.Fatalf("handled by %q, want %q", got, want)
			}
		})
	}
	s.Ready = func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }
	ready := s.Handler()
	w := httptest.NewRecorder()
	ready.ServeHTTP(w, httptest.NewRequest("GET", "/ready", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("/ready with a Ready handler: %d, want 503", w.Code)
	}
}
