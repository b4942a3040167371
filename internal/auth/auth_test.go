package auth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	testSigningKey = base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	apiKey         = "sk-test-0123456789abcdef0123456789abcdef"
)

func newAuthority(t *testing.T) *Authority {
	t.Helper()
	a, err := New(Config{APIKeys: []string{apiKey}, SigningKey: testSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func request(token string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/calls", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

func TestNewConfig(t *testing.T) {
	if a, err := New(Config{}); a != nil || err != nil {
		t.Fatalf("zero Config: %v, %v; want no authority and no error (auth off)", a, err)
	}
	short := base64.StdEncoding.EncodeToString([]byte("short"))
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"no signing key":   {Config{APIKeys: []string{apiKey}}, "signing_key (-auth-signing-key) is empty"},
		"not base64":       {Config{APIKeys: []string{apiKey}, SigningKey: "%%%"}, "not standard base64"},
		"short signing":    {Config{APIKeys: []string{apiKey}, SigningKey: short}, "decodes to 5 bytes"},
		"no api keys":      {Config{SigningKey: testSigningKey}, "api_keys (-auth-api-keys) is empty"},
		"short api key":    {Config{APIKeys: []string{"x"}, SigningKey: testSigningKey}, "api_keys[0] (-auth-api-keys) is 1 bytes"},
		"negative ttl":     {Config{APIKeys: []string{apiKey}, SigningKey: testSigningKey, TokenTTL: -time.Second}, "token_ttl"},
		"ttl over the max": {Config{APIKeys: []string{apiKey}, SigningKey: testSigningKey, TokenTTL: 2 * time.Hour}, "token_ttl"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to say %q", name, err, c.want)
		}
	}
}

func TestMintVerify(t *testing.T) {
	a := newAuthority(t)
	now := time.Now()
	tok, err := a.Mint(now)
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Unix(tok.ExpiresAt, 0); got.Sub(now) > DefaultTokenTTL || now.Add(DefaultTokenTTL).Sub(got) > time.Second {
		t.Fatalf("expires_at %v, want now + %v", got, DefaultTokenTTL)
	}
	id, err := a.Verify(request(tok.Value), now)
	if err != nil || id == "" {
		t.Fatalf("Verify fresh token: %q, %v", id, err)
	}
	// Expired (beyond the leeway): no new session with it...
	late := now.Add(DefaultTokenTTL + Leeway + time.Second)
	if _, err := a.Verify(request(tok.Value), late); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Verify expired token: %v, want ErrInvalid", err)
	}
	// ...but its own session still takes it.
	if err := a.VerifySession(request(tok.Value), id, late); err != nil {
		t.Fatalf("VerifySession own expired token: %v", err)
	}
	other, _ := a.Mint(now)
	if err := a.VerifySession(request(other.Value), id, now); !errors.Is(err, ErrNotForSession) {
		t.Fatalf("VerifySession another client's token: %v, want ErrNotForSession", err)
	}
	if err := a.VerifySession(request(apiKey), id, late); err != nil {
		t.Fatalf("VerifySession API key: %v", err)
	}
	// An API key may create sessions; they belong to API keys only.
	if owner, err := a.Verify(request(apiKey), now); err != nil || owner != "" {
		t.Fatalf("Verify API key: %q, %v", owner, err)
	}
	if err := a.VerifySession(request(tok.Value), "", now); !errors.Is(err, ErrNotForSession) {
		t.Fatalf("a client token on an API key's session: %v, want ErrNotForSession", err)
	}
	for _, r := range []*http.Request{request("")} {
		if _, err := a.Verify(r, now); !errors.Is(err, ErrMissing) {
			t.Fatalf("Verify without a token: %v", err)
		}
		if err := a.VerifySession(r, id, now); !errors.Is(err, ErrMissing) {
			t.Fatalf("VerifySession without a token: %v", err)
		}
	}
}

// TestVerifyRejects: forged, tampered, foreign and malformed tokens never
// verify, for a new session or an existing one.
func TestVerifyRejects(t *testing.T) {
	a := newAuthority(t)
	now := time.Now()
	key, _ := base64.StdEncoding.DecodeString(testSigningKey)
	sign := func(m jwt.SigningMethod, k any, c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(m, c).SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := jwt.MapClaims{"aud": Audience, "iat": now.Unix(), "exp": now.Add(time.Minute).Unix(), "jti": "abc"}
	valid := sign(jwt.SigningMethodHS256, key, good)
	if id, err := a.Verify(request(valid), now); err != nil || id != "abc" {
		t.Fatalf("a well-formed token did not verify (the cases below would prove nothing): %v", err)
	}
	without := func(k string) jwt.MapClaims {
		c := jwt.MapClaims{}
		for kk, v := range good {
			if kk != k {
				c[kk] = v
			}
		}
		return c
	}
	tampered := []byte(valid)
	tampered[len(tampered)-3] ^= 1
	none := sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, good)
	for name, tok := range map[string]string{
		"tampered signature": string(tampered),
		"alg none":           none,
		"other key":          sign(jwt.SigningMethodHS256, []byte("another key another key another!"), good),
		"HS384":              sign(jwt.SigningMethodHS384, key, good),
		"no aud":             sign(jwt.SigningMethodHS256, key, without("aud")),
		"other aud":          sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"aud": "x", "exp": good["exp"], "jti": "abc"}),
		"no jti":             sign(jwt.SigningMethodHS256, key, without("jti")),
		"not a jwt":          "hello",
		"api key lookalike":  apiKey + "x",
	} {
		if _, err := a.Verify(request(tok), now); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Verify = %v, want ErrInvalid", name, err)
		}
		if err := a.VerifySession(request(tok), "abc", now); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: VerifySession = %v, want ErrInvalid", name, err)
		}
	}
	// exp is required for a new session.
	if _, err := a.Verify(request(sign(jwt.SigningMethodHS256, key, without("exp"))), now); !errors.Is(err, ErrInvalid) {
		t.Errorf("no exp: Verify = %v, want ErrInvalid", err)
	}
	// A token from the future (beyond the leeway) is not valid yet.
	future := jwt.MapClaims{"aud": Audience, "iat": now.Add(time.Minute).Unix(), "exp": now.Add(2 * time.Minute).Unix(), "jti": "f"}
	if _, err := a.Verify(request(sign(jwt.SigningMethodHS256, key, future)), now); !errors.Is(err, ErrInvalid) {
		t.Errorf("iat in the future: Verify = %v, want ErrInvalid", err)
	}
}

func TestBearer(t *testing.T) {
	for h, want := range map[string]string{
		"Bearer abc":  "abc",
		"bearer abc":  "abc",
		"BEARER  abc": "abc",
		"Basic abc":   "",
		"Bearer":      "",
		"":            "",
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if h != "" {
			r.Header.Set("Authorization", h)
		}
		if got := Bearer(r); got != want {
			t.Errorf("Bearer(%q) = %q, want %q", h, got, want)
		}
	}
}

func TestNilAuthority(t *testing.T) {
	var a *Authority
	if id, err := a.Verify(request(""), time.Now()); id != "" || err != nil {
		t.Fatalf("nil Verify: %q, %v", id, err)
	}
	if err := a.VerifySession(request(""), "x", time.Now()); err != nil {
		t.Fatalf("nil VerifySession: %v", err)
	}
	if _, err := a.Mint(time.Now()); err == nil {
		t.Fatal("nil Mint succeeded")
	}
	w := httptest.NewRecorder()
	a.MintHandler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, MintPath, nil))
	if w.Code != http.StatusNotFound {
		t.Fatalf("nil MintHandler: %d, want 404", w.Code)
	}
}

func TestMintHandler(t *testing.T) {
	a := newAuthority(t)
	for _, c := range []struct {
		bearer string
		want   int
		says   string // in the 401's message: a missing key and a wrong one are told apart
	}{
		{"", http.StatusUnauthorized, "needs an API key: Authorization: Bearer <api key>"},
		{"wrong", http.StatusUnauthorized, "is not an API key of this server"},
		{apiKey, http.StatusCreated, ""},
	} {
		r := httptest.NewRequest(http.MethodPost, MintPath, nil)
		if c.bearer != "" {
			r.Header.Set("Authorization", "Bearer "+c.bearer)
		}
		w := httptest.NewRecorder()
		a.MintHandler().ServeHTTP(w, r)
		if w.Code != c.want {
			t.Fatalf("bearer %q: %d %s, want %d", c.bearer, w.Code, w.Body, c.want)
		}
		if c.want == http.StatusUnauthorized {
			if !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer ") {
				t.Fatalf("401 without a Bearer challenge: %q", w.Header().Get("WWW-Authenticate"))
			}
			if !strings.Contains(w.Body.String(), c.says) {
				t.Errorf("bearer %q: 401 body %s, want it to say %q", c.bearer, w.Body, c.says)
			}
			continue
		}
		if w.Header().Get("Cache-Control") != "no-store" {
			t.Fatal("a minted token must not be cached")
		}
		var tok Token
		if err := json.Unmarshal(w.Body.Bytes(), &tok); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Verify(request(tok.Value), time.Now()); err != nil {
			t.Fatalf("minted token does not verify: %v", err)
		}
	}
}

// TestKeyRotation: during a rotation the previous key still verifies (its
// tokens carry its kid); a token from neither key does not.
func TestKeyRotation(t *testing.T) {
	oldKey := testSigningKey
	newKey := base64.StdEncoding.EncodeToString([]byte("fedcba9876543210fedcba9876543210"))
	before := newAuthority(t)
	tok, err := before.Mint(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	id, err := before.Verify(request(tok.Value), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	after, err := New(Config{APIKeys: []string{apiKey}, SigningKey: newKey, PreviousSigningKey: oldKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := after.Verify(request(tok.Value), time.Now()); err != nil {
		t.Fatalf("a token of the previous key: %v", err)
	}
	if err := after.VerifySession(request(tok.Value), id, time.Now()); err != nil {
		t.Fatalf("a live session's token after the rotation: %v", err)
	}
	fresh, _ := after.Mint(time.Now())
	if _, err := before.Verify(request(fresh.Value), time.Now()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a token of the new key at a node without it: %v, want ErrInvalid", err)
	}
	done, err := New(Config{APIKeys: []string{apiKey}, SigningKey: newKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := done.Verify(request(tok.Value), time.Now()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a token of a retired key: %v, want ErrInvalid", err)
	}
	if _, err := New(Config{APIKeys: []string{apiKey}, SigningKey: newKey, PreviousSigningKey: newKey}); err == nil {
		t.Fatal("previous_signing_key equal to signing_key accepted")
	}
}

// TestChallenge: RFC 6750 §3 error codes.
func TestChallenge(t *testing.T) {
	for err, want := range map[error]string{
		ErrMissing:       `Bearer realm="switchboard"`,
		ErrInvalid:       `Bearer realm="switchboard", error="invalid_token"`,
		ErrNotForSession: `Bearer realm="switchboard", error="insufficient_scope"`,
	} {
		w := httptest.NewRecorder()
		Unauthorized(w, err)
		if got := w.Header().Get("WWW-Authenticate"); got != want {
			t.Errorf("%v: WWW-Authenticate %q, want %q", err, got, want)
		}
		if wantCode := map[bool]int{true: 403, false: 401}[err == ErrNotForSession]; w.Code != wantCode {
			t.Errorf("%v: status %d, want %d", err, w.Code, wantCode)
		}
	}
}
