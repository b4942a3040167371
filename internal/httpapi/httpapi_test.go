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
