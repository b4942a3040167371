package httpapi

import "net/http"

// Paths of the signaling API (docs/signaling.md). An offer is POSTed to
// CallsPath, or to RealtimeCallsPath (OpenAI Realtime WebRTC clients); the
// session it makes is <either>/{id} (the answer's Location), for PATCH and
// DELETE. MintPath turns an API key into a client token.
const (
	CallsPath         = "/v1/calls"
	RealtimeCallsPath = "/v1/realtime/calls"
	MintPath          = "/v1/client_tokens"
)

// Signaling is the signaling API of a front that takes offers, the
// transceiver's or the director's: Handler registers its routes, and the
// probes /live and /ready, the same way for both. Every handler but Ready
// must be set.
type Signaling struct {
	// Offer serves POST CallsPath and RealtimeCallsPath.
	Offer http.HandlerFunc
	// Patch and Delete serve PATCH and DELETE <either path>/{id}; the
	// session's id is r.PathValue("id").
	Patch, Delete http.HandlerFunc
	// Mint serves POST MintPath.
	Mint http.Handler
	// Ready serves GET /ready; nil: always ready (204). GET /live is
	// always 204: the process serves HTTP.
	Ready http.HandlerFunc
}

// Handler returns the routes of s behind CORS.
func (s Signaling) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, p := range []string{CallsPath, RealtimeCallsPath} {
		mux.HandleFunc("POST "+p, s.Offer)
		mux.HandleFunc("PATCH "+p+"/{id}", s.Patch)
		mux.HandleFunc("DELETE "+p+"/{id}", s.Delete)
	}
	mux.Handle("POST "+MintPath, s.Mint)
	mux.HandleFunc("GET /live", noContent)
	ready := s.Ready
	if ready == nil {
		ready = noContent
	}
	mux.HandleFunc("GET /ready", ready)
	return CORS(mux)
}

func noContent(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }
