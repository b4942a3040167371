// Package auth is signaling authentication (docs/design.md §6): server-side API
// keys mint short-lived client tokens, and clients present a client token
// as a Bearer token (RFC 6750) when they POST an offer.
//
// The flow is the one OpenAI's Realtime API uses with ephemeral keys: the
// application's server holds an API key and asks for a client token per
// call; the browser or app gets only the client token, which expires in
// Config.TokenTTL (default 60 s) and authorizes one thing: creating
// sessions. The session's later PATCH and DELETE take the token that
// created it, even once expired, or an API key. A server-side caller may
// also POST offers with an API key directly.
//
// A client token is a JWT (RFC 7519) signed with HMAC-SHA256 (HS256, RFC
// 7518 §3.2) under Config.SigningKey, which every transceiver and director
// of a deployment shares. Its header names the key ("kid": the first 8
// bytes of the key's SHA-256, hex), so that Config.PreviousSigningKey can
// still verify tokens during a rotation:
//
//	{"alg":"HS256","kid":"<16 hex>","typ":"JWT"}
//	{"aud":"switchboard","iat":1700000000,"exp":1700000060,"jti":"<22 chars>"}
//
// Verification pins the algorithm to HS256, requires exp and the audience,
// and allows no clock skew beyond Leeway.
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Audience is the aud claim of every client token.
const Audience = "switchboard"

// Bounds of Config.
const (
	// DefaultTokenTTL is the lifetime of a client token: long enough to
	// reach the client and POST, short enough to be worthless when leaked.
	DefaultTokenTTL = 60 * time.Second
	// MaxTokenTTL bounds Config.TokenTTL.
	MaxTokenTTL = time.Hour
	// MinKeyLen is the shortest API key and signing key, in bytes (256 bits).
	MinKeyLen = 32
	// Leeway is the clock skew tolerated between the minting and the
	// verifying process.
	Leeway = 5 * time.Second
)

// Errors of Verify and VerifySession; each says what to fix in its message
// when wrapped.
var (
	// ErrMissing: no "Authorization: Bearer ..." header.
	ErrMissing = errors.New("auth: no bearer token")
	// ErrInvalid: the token does not verify, is expired, or is not a client token.
	ErrInvalid = errors.New("auth: invalid token")
	// ErrNotForSession: a valid credential that does not own this session.
	ErrNotForSession = errors.New("auth: the token did not create this session")
)

// Config configures signaling authentication. The zero Config turns it
// off (every request is allowed), which is the demo's default.
type Config struct {
	// APIKeys are the server-side secrets that may mint client tokens
	// (POST /v1/client_tokens) and operate on any session. Each at least
	// MinKeyLen bytes.
	APIKeys []string `yaml:"api_keys"`
	// SigningKey is the HS256 key of client tokens, standard base64 of at
	// least MinKeyLen bytes (e.g. `openssl rand -base64 32`). Shared by
	// every transceiver and director of a deployment. Required when
	// APIKeys is set.
	SigningKey string `yaml:"signing_key"`
	// PreviousSigningKey, when set, also verifies tokens (never signs):
	// the old key after a rotation, so that live sessions' tokens keep
	// working for PATCH and DELETE, or the new key before one, so that a
	// mixed rollout accepts both. Same format as SigningKey.
	PreviousSigningKey string `yaml:"previous_signing_key"`
	// TokenTTL is a client token's lifetime; 0 means DefaultTokenTTL, at
	// most MaxTokenTTL.
	TokenTTL time.Duration `yaml:"token_ttl"`
}

// Enabled reports whether c turns authentication on.
func (c Config) Enabled() bool { return len(c.APIKeys) > 0 || c.SigningKey != "" }

// Authority mints and verifies tokens. A nil *Authority allows everything:
// its methods succeed and Mint fails.
type Authority struct {
	apiKeys [][sha256.Size]byte // digests: comparing them leaks no key length
	keys    []signingKey        // keys[0] signs; all verify
	ttl     time.Duration
}

// signingKey is an HS256 key and its kid.
type signingKey struct {
	kid string
	key []byte
}

func newSigningKey(b []byte) signingKey {
	sum := sha256.Sum256(b)
	return signingKey{kid: hex.EncodeToString(sum[:8]), key: b}
}

// New checks cfg and returns its Authority, or nil (no authentication)
// for a Config that is not Enabled.
func New(cfg Config) (*Authority, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	var errs []error
	a := &Authority{ttl: cfg.TokenTTL}
	key, err := base64.StdEncoding.DecodeString(cfg.SigningKey)
	switch {
	case cfg.SigningKey == "":
		errs = append(errs, errors.New("auth: signing_key (-auth-signing-key) is empty; set the base64 of 32 random bytes (openssl rand -base64 32), the same on every transceiver and director"))
	case err != nil:
		errs = append(errs, fmt.Errorf("auth: signing_key (-auth-signing-key) is not standard base64: %v", err))
	case len(key) < MinKeyLen:
		errs = append(errs, fmt.Errorf("auth: signing_key (-auth-signing-key) decodes to %d bytes; use at least %d random bytes", len(key), MinKeyLen))
	default:
		a.keys = append(a.keys, newSigningKey(key))
	}
	if cfg.PreviousSigningKey != "" {
		prev, err := base64.StdEncoding.DecodeString(cfg.PreviousSigningKey)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("auth: previous_signing_key (-auth-previous-signing-key) is not standard base64: %v", err))
		case len(prev) < MinKeyLen:
			errs = append(errs, fmt.Errorf("auth: previous_signing_key (-auth-previous-signing-key) decodes to %d bytes; use at least %d random bytes", len(prev), MinKeyLen))
		case hmac.Equal(prev, key):
			errs = append(errs, errors.New("auth: previous_signing_key equals signing_key; set it to the key being rotated out (or in)"))
		default:
			a.keys = append(a.keys, newSigningKey(prev))
		}
	}
	if len(cfg.APIKeys) == 0 {
		errs = append(errs, errors.New("auth: api_keys (-auth-api-keys) is empty; with a signing_key, list the server-side API keys that may mint client tokens"))
	}
	for i, k := range cfg.APIKeys {
		if len(k) < MinKeyLen {
			errs = append(errs, fmt.Errorf("auth: api_keys[%d] (-auth-api-keys) is %d bytes; use at least %d random bytes", i, len(k), MinKeyLen))
		}
		a.apiKeys = append(a.apiKeys, sha256.Sum256([]byte(k)))
	}
	switch {
	case a.ttl < 0 || a.ttl > MaxTokenTTL:
		errs = append(errs, fmt.Errorf("auth: token_ttl (-auth-token-ttl) is %v; use 0 for the default %v, or up to %v", a.ttl, DefaultTokenTTL, MaxTokenTTL))
	case a.ttl == 0:
		a.ttl = DefaultTokenTTL
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return a, nil
}

// Token is a minted client token.
type Token struct {
	// Value is the JWT to send as "Authorization: Bearer <Value>".
	Value string `json:"value"`
	// ExpiresAt is its expiry, Unix seconds.
	ExpiresAt int64 `json:"expires_at"`
}

// Mint returns a new client token valid from now for the configured TTL.
func (a *Authority) Mint(now time.Time) (Token, error) {
	if a == nil {
		return Token{}, errors.New("auth: authentication is off; configure auth to mint client tokens")
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return Token{}, err
	}
	exp := now.Add(a.ttl)
	claims := jwt.RegisteredClaims{
		Audience:  jwt.ClaimStrings{Audience},
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(exp),
		ID:        base64.RawURLEncoding.EncodeToString(id[:]),
	}
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	t.Header["kid"] = a.keys[0].kid
	v, err := t.SignedString(a.keys[0].key)
	if err != nil {
		return Token{}, err
	}
	return Token{Value: v, ExpiresAt: exp.Unix()}, nil
}

// Bearer returns the token of an "Authorization: Bearer <token>" header
// (RFC 6750 §2.1; the scheme is case-insensitive), or "".
func Bearer(r *http.Request) string {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// IsAPIKey reports whether tok is one of the API keys. It compares SHA-256
// digests in constant time, so timing reveals neither a key nor its length.
func (a *Authority) IsAPIKey(tok string) bool {
	if a == nil || tok == "" {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	ok := 0
	for i := range a.apiKeys {
		ok |= subtle.ConstantTimeCompare(a.apiKeys[i][:], sum[:])
	}
	return ok == 1
}

// Verify checks the bearer token of a request that creates a session: a
// valid, unexpired client token, or an API key (a server-side caller). It
// returns the client token's id, which the session keeps for
// VerifySession ("" for an API key, whose sessions only API keys operate
// on, and when authentication is off). Errors wrap ErrMissing or
// ErrInvalid.
func (a *Authority) Verify(r *http.Request, now time.Time) (string, error) {
	if a == nil {
		return "", nil
	}
	tok := Bearer(r)
	switch {
	case tok == "":
		return "", ErrMissing
	case a.IsAPIKey(tok):
		return "", nil
	}
	return a.verify(tok, now, true)
}

// VerifySession checks the bearer token of a request on an existing
// session whose client token id is owner: an API key, or the client token
// that created the session (expired or not: the session outlives it).
// Errors wrap ErrMissing, ErrInvalid or ErrNotForSession.
func (a *Authority) VerifySession(r *http.Request, owner string, now time.Time) error {
	if a == nil {
		return nil
	}
	tok := Bearer(r)
	switch {
	case tok == "":
		return ErrMissing
	case a.IsAPIKey(tok):
		return nil
	}
	id, err := a.verify(tok, now, false)
	if err != nil {
		return err
	}
	if owner == "" || !hmac.Equal([]byte(id), []byte(owner)) {
		return ErrNotForSession
	}
	return nil
}

// verify parses and checks a client token; with fresh false an expired
// token whose signature verifies is accepted.
func (a *Authority) verify(tok string, now time.Time, fresh bool) (string, error) {
	var claims jwt.RegisteredClaims
	opts := []jwt.ParserOption{jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()})}
	if fresh {
		opts = append(opts, jwt.WithAudience(Audience), jwt.WithExpirationRequired(), jwt.WithIssuedAt(),
			jwt.WithLeeway(Leeway), jwt.WithTimeFunc(func() time.Time { return now }))
	} else {
		opts = append(opts, jwt.WithoutClaimsValidation())
	}
	_, err := jwt.NewParser(opts...).ParseWithClaims(tok, &claims, a.keyFor)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if claims.ID == "" {
		return "", fmt.Errorf("%w: no jti", ErrInvalid)
	}
	if !fresh && !audienceOK(claims.Audience) {
		return "", fmt.Errorf("%w: audience", ErrInvalid)
	}
	return claims.ID, nil
}

// keyFor picks the verification key a token's kid names; a token without
// a kid is tried with the current key.
func (a *Authority) keyFor(t *jwt.Token) (any, error) {
	kid, _ := t.Header["kid"].(string)
	if kid == "" {
		return a.keys[0].key, nil
	}
	for _, k := range a.keys {
		if k.kid == kid {
			return k.key, nil
		}
	}
	return nil, fmt.Errorf("unknown kid %q (signed with a key that is neither signing_key nor previous_signing_key)", kid)
}

// audienceOK checks aud when claims validation is off.
func audienceOK(aud jwt.ClaimStrings) bool {
	for _, a := range aud {
		if a == Audience {
			return true
		}
	}
	return false
}

// Challenge writes the WWW-Authenticate header of a 401 or 403 (RFC 6750
// §3): no error code when no credentials came, insufficient_scope for a
// valid token without the right, invalid_token otherwise.
func Challenge(w http.ResponseWriter, err error) {
	v := `Bearer realm="switchboard"`
	switch {
	case errors.Is(err, ErrMissing):
	case errors.Is(err, ErrNotForSession):
		v += `, error="insufficient_scope"`
	default:
		v += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", v)
}
