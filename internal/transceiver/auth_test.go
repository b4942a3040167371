package transceiver

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/sdpfrag"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// TestSignalingAuth: with Config.Auth an offer needs a client token minted
// with an API key; the session's PATCH and DELETE need that token or an
// API key, never another client's token.
func TestSignalingAuth(t *testing.T) {
	const apiKey = "sk-0123456789abcdef0123456789abcdef"
	_, api, _ := newTestServer(t, func(c *Config) {
		c.Auth = auth.Config{APIKeys: []string{apiKey}, SigningKey: base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))}
	})
	do := func(method, path, bearer, ctype, body string, hdr ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, api.URL+path, strings.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	mint := func() string {
		t.Helper()
		resp := do(http.MethodPost, auth.MintPath, apiKey, "", "")
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("mint: %d", resp.StatusCode)
		}
		var tok auth.Token
		if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil {
			t.Fatal(err)
		}
		return tok.Value
	}
	want := func(resp *http.Response, status int, what string) {
		t.Helper()
		if resp.StatusCode != status {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %d %s, want %d", what, resp.StatusCode, b, status)
		}
		if (status == http.StatusUnauthorized || status == http.StatusForbidden) && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("%s: %d without WWW-Authenticate: Bearer", what, status)
		}
		if status == http.StatusForbidden && !strings.Contains(resp.Header.Get("WWW-Authenticate"), `error="insufficient_scope"`) {
			t.Fatalf("%s: 403 without error=\"insufficient_scope\"", what)
		}
	}

	offer := clientOffer(t, true)
	want(do(http.MethodPost, "/v1/calls", "", "application/sdp", offer), http.StatusUnauthorized, "offer without a token")
	want(do(http.MethodPost, "/v1/calls", "garbage", "application/sdp", offer), http.StatusUnauthorized, "offer with a bad token")
	want(do(http.MethodPost, auth.MintPath, "", "", ""), http.StatusUnauthorized, "mint without an API key")
	want(do(http.MethodPost, auth.MintPath, mint(), "", ""), http.StatusUnauthorized, "mint with a client token")

	mine, theirs := mint(), mint()
	resp := do(http.MethodPost, "/v1/calls", mine, "application/sdp", offer)
	want(resp, http.StatusCreated, "offer with a client token")
	loc, tag := resp.Header.Get("Location"), resp.Header.Get("ETag")

	trickle := "a=end-of-candidates\r\n"
	want(do(http.MethodPatch, loc, "", sdpfrag.ContentType, trickle, "If-Match", tag), http.StatusUnauthorized, "PATCH without a token")
	want(do(http.MethodPatch, loc, theirs, sdpfrag.ContentType, trickle, "If-Match", tag), http.StatusForbidden, "PATCH with another client's token")
	want(do(http.MethodPatch, loc, mine, sdpfrag.ContentType, trickle, "If-Match", tag), http.StatusNoContent, "PATCH with the session's token")
	want(do(http.MethodDelete, loc, theirs, "", ""), http.StatusForbidden, "DELETE with another client's token")
	want(do(http.MethodDelete, "/v1/calls/nope", theirs, "", ""), http.StatusNotFound, "DELETE of an unknown session with a valid token")
	want(do(http.MethodDelete, "/v1/calls/nope", "garbage", "", ""), http.StatusUnauthorized, "DELETE of an unknown session with a bad token")
	want(do(http.MethodDelete, loc, mine, "", ""), http.StatusNoContent, "DELETE with the session's token")

	// A server-side caller's API key creates and ends sessions; a client
	// token cannot touch them.
	resp = do(http.MethodPost, "/v1/calls", apiKey, "application/sdp", clientOffer(t, true))
	want(resp, http.StatusCreated, "offer with an API key")
	loc = resp.Header.Get("Location")
	want(do(http.MethodDelete, loc, mine, "", ""), http.StatusForbidden, "DELETE of an API key's session with a client token")
	want(do(http.MethodDelete, loc, apiKey, "", ""), http.StatusNoContent, "DELETE with an API key")
}

// TestAuthConfigErrors: a half-configured Auth is refused with what to fix.
func TestAuthConfigErrors(t *testing.T) {
	cfg := Config{ID: 1, Advertise: "127.0.0.1:3478", BackendURL: "ws://127.0.0.1:1/v1/bridge",
		Auth: auth.Config{APIKeys: []string{"short"}}}
	_, err := New(cfg, nil, nil, nil)
	if err == nil {
		t.Fatal("New accepted a nil keyring; the check below would prove nothing")
	}
	s, err := New(cfg, testKeyring(t), nil, nil)
	if err == nil {
		_ = s.Close()
		t.Fatal("New accepted auth without a signing key and with a short API key")
	}
	for _, want := range []string{"signing_key (-auth-signing-key) is empty", "api_keys[0]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func testKeyring(t *testing.T) *token.Keyring {
	t.Helper()
	keys, err := token.NewKeyring(token.Key{ID: 1, Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}
