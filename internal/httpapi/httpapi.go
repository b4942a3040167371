// Package httpapi holds what Switchboard's HTTP servers share: the bounds
// every server applies to its connections (Server: timeouts, the header
// cap, connection caps; docs/security.md, "HTTP servers"), and for the
// signaling endpoints CORS and the JSON error body.
package httpapi

import (
	"encoding/json"
	"net/http"
)

// CORS lets a page on any origin call next: it answers preflights and
// exposes the Location and ETag headers a WHIP client (RFC 9725 §4.2) or a
// Realtime client needs.
func CORS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Expose-Headers", "Location, ETag, Link")
		if r.Method == http.MethodOptions {
			h.Set("Access-Control-Allow-Methods", "POST, PATCH, DELETE, OPTIONS")
			h.Set("Access-Control-Allow-Headers", "Content-Type, Authorization, If-Match")
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Error is the JSON error body: {"error":{"code":"...","message":"..."}}.
// Code is a stable snake_case identifier; Message says what to fix.
type Error struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// WriteError writes status with an Error body.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	var e Error
	e.Error.Code, e.Error.Message = code, msg
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // messages such as "Bearer <token>" read as written
	_ = enc.Encode(e)
}
