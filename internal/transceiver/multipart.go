package transceiver

import (
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/httpapi"
)

// OpenAI's other call shape.
//
// Besides a raw application/sdp body, OpenAI's POST /v1/realtime/calls
// takes multipart/form-data (RFC 7578) with two parts: "sdp", the offer,
// and "session", a JSON object with the session's settings
// (instructions, voice, turn detection, …). An application's server uses
// it to create a call for its browser with the settings it chose. The
// transceiver answers it exactly like a raw offer (201, Location, the
// application/sdp answer) and passes the session object, untouched, to the
// backend in session.start (docs/bridge.md §4.3). Other parts are
// ignored; a part may be sent as a file or as a plain field.

// maxSessionBytes bounds the session part; a session configuration with
// long instructions and tool definitions is a few KiB.
const maxSessionBytes = 64 << 10

// readMultipartOffer reads a multipart/form-data offer: its sdp part and
// its optional session part. It writes the error response and returns
// false when the request must stop.
func readMultipartOffer(w http.ResponseWriter, r *http.Request, boundary string) (offer string, session json.RawMessage, ok bool) {
	if boundary == "" {
		httpapi.WriteError(w, http.StatusBadRequest, "bad_request", "multipart/form-data needs a boundary parameter")
		return "", nil, false
	}
	mr := multipart.NewReader(http.MaxBytesReader(w, r.Body, maxOfferBytes+maxSessionBytes+8<<10), boundary)
	var haveSDP bool
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			multipartError(w, err)
			return "", nil, false
		}
		var limit int64
		switch p.FormName() {
		case "sdp":
			limit = maxOfferBytes
		case "session":
			limit = maxSessionBytes
		default:
			continue // NextPart discards the rest of an unread part
		}
		b, err := io.ReadAll(io.LimitReader(p, limit+1))
		if err != nil {
			multipartError(w, err)
			return "", nil, false
		}
		if int64(len(b)) > limit {
			httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "offer_too_large",
				"the "+p.FormName()+" part is larger than 64 KiB")
			return "", nil, false
		}
		if p.FormName() == "sdp" {
			offer, haveSDP = string(b), true
			continue
		}
		if !bridge.IsJSONObject(b) {
			httpapi.WriteError(w, http.StatusBadRequest, "bad_session",
				`the session part must be a JSON object, e.g. {"instructions":"…","voice":"…"}`)
			return "", nil, false
		}
		session = json.RawMessage(b)
	}
	if !haveSDP {
		httpapi.WriteError(w, http.StatusBadRequest, "bad_offer", `the multipart/form-data body has no "sdp" part with the SDP offer`)
		return "", nil, false
	}
	return offer, session, true
}

func multipartError(w http.ResponseWriter, err error) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "offer_too_large", "the multipart body is larger than 136 KiB")
		return
	}
	httpapi.WriteError(w, http.StatusBadRequest, "bad_request", "reading the multipart/form-data body: "+err.Error())
}
