package transceiver

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/httpapi"
	"github.com/switchboard-rtc/switchboard/internal/sdpfrag"
	"github.com/switchboard-rtc/switchboard/internal/trusted"
)

// RegionHeader names the client's region on an offer request. The
// director (or a CDN's geo steering) sets it; the transceiver answers with
// that region's ingress (Config.IngressByRegion).
const RegionHeader = "X-Switchboard-Region"

// maxOfferBytes bounds an offer body; real offers are a few KiB.
const maxOfferBytes = 64 << 10

// Handler returns the signaling API (docs/design.md §6):
//
//	POST   /v1/calls            application/sdp offer → 201, Location, answer
//	POST   /v1/realtime/calls   the same, for OpenAI Realtime WebRTC clients;
//	                            both also take multipart/form-data with an
//	                            sdp part and a session JSON part (multipart.go)
//	PATCH  /v1/calls/{id}       application/trickle-ice-sdpfrag, If-Match →
//	                            200 + answer fragment and new ETag (ICE restart),
//	                            204 (trickle only); 412 stale ETag, 428 no If-Match
//	DELETE /v1/calls/{id}       end the session → 204 (404 if unknown)
//	POST   /v1/client_tokens    API key → short-lived client token (Config.Auth)
//	GET    /live, /ready        probes
//
// With Config.Auth, an offer needs "Authorization: Bearer <client token>"
// and PATCH and DELETE the same token or an API key; otherwise 401.
//
// Errors are JSON: {"error":{"code":"...","message":"..."}}. CORS allows
// any origin, so a page served elsewhere can call it.
func (s *Server) Handler() http.Handler {
	return httpapi.Signaling{Offer: s.handleOffer, Patch: s.handlePatch, Delete: s.handleDelete,
		Mint: s.auth.MintHandler(), Ready: s.handleReady}.Handler()
}

func (s *Server) handleOffer(w http.ResponseWriter, r *http.Request) {
	owner, err := s.auth.Verify(r, time.Now())
	if err != nil {
		auth.Unauthorized(w, err)
		return
	}
	var offer string
	var session json.RawMessage
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case err == nil && mt == "application/sdp":
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxOfferBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "offer_too_large", "the offer is larger than 64 KiB")
				return
			}
			httpapi.WriteError(w, http.StatusBadRequest, "bad_request", "reading the offer: "+err.Error())
			return
		}
		offer = string(body)
	case err == nil && mt == "multipart/form-data":
		var ok bool
		if offer, session, ok = readMultipartOffer(w, r, params["boundary"]); !ok {
			return
		}
	default:
		httpapi.WriteError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
			"the offer must be sent with Content-Type: application/sdp, or as the sdp part of multipart/form-data")
		return
	}
	meta := map[string]string{"client_addr": r.RemoteAddr, "user_agent": r.UserAgent()}
	region := r.Header.Get(RegionHeader)
	if region == "" {
		region = r.URL.Query().Get("region") // set by a director's 307 redirect
	}
	if region != "" {
		meta[MetaRegion] = region
	}
	id, answer, err := s.offer(r.Context(), offerRequest{
		sdp: offer, session: session, meta: meta, owner: owner, client: trusted.ClientAddr(r, s.cfg.trusted),
	})
	switch {
	case errors.Is(err, ErrBadOffer):
		msg := err.Error()
		if offer != "" && !strings.Contains(offer, "\n") {
			// curl -d (and a form post) strips the line breaks SDP needs.
			msg += "; the offer has no line breaks: send the SDP as it is, one line per attribute " +
				"(curl --data-binary @offer.sdp, not -d, which drops them)"
		}
		httpapi.WriteError(w, http.StatusBadRequest, "bad_offer", msg)
		return
	case errors.Is(err, ErrClientPending):
		w.Header().Set("Retry-After", "1")
		httpapi.WriteError(w, http.StatusTooManyRequests, "too_many_pending", err.Error()+"; connect the calls already answered, or retry after a second")
		return
	case errors.Is(err, ErrFull), errors.Is(err, ErrClosed), errors.Is(err, ErrDraining), errors.Is(err, ErrPending):
		w.Header().Set("Retry-After", "1")
		httpapi.WriteError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	case errors.Is(err, ErrBackend):
		// The cause names the internal backend URL: the log has it, the
		// public client does not.
		s.log.Warn("offer refused: the backend bridge did not open", "err", err, "client", r.RemoteAddr)
		httpapi.WriteError(w, http.StatusBadGateway, "backend_unavailable",
			"the agent behind this server is unavailable; try again later (the server's log has the cause)")
		return
	case err != nil:
		s.log.Error("offer failed", "err", err)
		httpapi.WriteError(w, http.StatusInternalServerError, "internal", "the session could not be created")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/sdp")
	h.Set("Location", httpapi.CallsPath+"/"+id)
	h.Set("ETag", etag(id, 1))
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, answer)
}

// handlePatch is ICE restart and trickle (RFC 9725 §4.3; restart.go).
func (s *Server) handlePatch(w http.ResponseWriter, r *http.Request) {
	if !s.authorizeSession(w, r) {
		return
	}
	ifMatch := r.Header.Get("If-Match")
	if ifMatch == "" {
		httpapi.WriteError(w, http.StatusPreconditionRequired, "if_match_required",
			`send If-Match with the session's ETag, or "*"`)
		return
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != sdpfrag.ContentType {
		httpapi.WriteError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
			"the body must be an SDP fragment with Content-Type: "+sdpfrag.ContentType)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, sdpfrag.MaxLen))
	if err != nil {
		httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "fragment_too_large", "the SDP fragment is larger than 16 KiB")
		return
	}
	answer, tag, restarted, err := s.Restart(r.Context(), r.PathValue("id"), ifMatch, string(body))
	switch {
	case errors.Is(err, ErrNoSession):
		httpapi.WriteError(w, http.StatusNotFound, "not_found", "no session "+strings.TrimSpace(r.PathValue("id")))
		return
	case errors.Is(err, ErrETagMismatch):
		httpapi.WriteError(w, http.StatusPreconditionFailed, "etag_mismatch",
			"If-Match does not name the session's current ICE session; use the ETag of the last POST or PATCH response")
		return
	case errors.Is(err, ErrRestartTooSoon):
		w.Header().Set("Retry-After", "1")
		httpapi.WriteError(w, http.StatusTooManyRequests, "restart_too_soon", "this session restarted ICE less than a second ago; retry after a second")
		return
	case errors.Is(err, ErrBadFragment):
		httpapi.WriteError(w, http.StatusBadRequest, "bad_fragment", err.Error())
		return
	case err != nil:
		httpapi.WriteError(w, http.StatusInternalServerError, "ice_restart_failed", "the ICE restart failed: "+err.Error())
		return
	}
	w.Header().Set("ETag", tag)
	if !restarted {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", sdpfrag.ContentType)
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, answer)
}

// authorizeSession checks the credentials of a request on session
// {id}: with authentication on, its client token or an API key. It
// writes the 401 (or, for a session that does not exist, the 404 a valid
// credential would get) and returns false when the request must stop.
func (s *Server) authorizeSession(w http.ResponseWriter, r *http.Request) bool {
	if s.auth == nil {
		return true
	}
	id := r.PathValue("id")
	owner, ok := s.owner(id)
	if !ok {
		// Any valid credential learns that the session is gone.
		if err := s.auth.VerifySession(r, "", time.Now()); err != nil && !errors.Is(err, auth.ErrNotForSession) {
			auth.Unauthorized(w, err)
			return false
		}
		httpapi.WriteError(w, http.StatusNotFound, "not_found", "no session "+strings.TrimSpace(id))
		return false
	}
	if err := s.auth.VerifySession(r, owner, time.Now()); err != nil {
		auth.Unauthorized(w, err)
		return false
	}
	return true
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	if !s.authorizeSession(w, r) {
		return
	}
	if !s.End(r.PathValue("id"), bridge.ReasonClientHangup) {
		httpapi.WriteError(w, http.StatusNotFound, "not_found", "no session "+strings.TrimSpace(r.PathValue("id")))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	if !s.Ready() {
		httpapi.WriteError(w, http.StatusServiceUnavailable, "draining", "the transceiver is draining or shutting down")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
