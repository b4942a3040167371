package auth

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/httpapi"
)

// MintPath is where MintHandler is served (httpapi.MintPath).
const MintPath = httpapi.MintPath

// MintHandler serves POST MintPath for the application's server:
//
//	POST /v1/client_tokens
//	Authorization: Bearer <API key>
//
//	201 Created
//	Content-Type: application/json
//	Cache-Control: no-store
//	{"value":"<client token>","expires_at":1700000060}
//
// A missing or wrong API key gets 401 with WWW-Authenticate; authentication
// off gets 404 (there is nothing to mint).
func (a *Authority) MintHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a == nil {
			httpapi.WriteError(w, http.StatusNotFound, "auth_off", "authentication is off: offers need no token")
			return
		}
		if tok := Bearer(r); !a.IsAPIKey(tok) {
			if tok == "" {
				Challenge(w, ErrMissing)
				httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized", "minting a client token needs an API key: Authorization: Bearer <api key>")
			} else {
				Challenge(w, ErrInvalid)
				httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized",
					"the bearer token is not an API key of this server: send one of the keys it was started with (-auth-api-keys, SWITCHBOARD_AUTH_API_KEYS)")
			}
			return
		}
		tok, err := a.Mint(time.Now())
		if err != nil {
			httpapi.WriteError(w, http.StatusInternalServerError, "internal", "minting failed")
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(tok)
	})
}

// Unauthorized writes the response for err from Verify or VerifySession:
// 403 for a valid token that did not create the session, 401 otherwise.
func Unauthorized(w http.ResponseWriter, err error) {
	Challenge(w, err)
	switch {
	case errors.Is(err, ErrNotForSession):
		httpapi.WriteError(w, http.StatusForbidden, "forbidden", "this token did not create the session; use the client token of its POST, or an API key")
	case errors.Is(err, ErrMissing):
		httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized", "send a client token: Authorization: Bearer <token from POST "+MintPath+">")
	default:
		httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized", "the bearer token is invalid or expired ("+err.Error()+"); mint a new one with POST "+MintPath)
	}
}
