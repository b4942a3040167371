package main

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// yamlOnly is a setting that only the YAML file sets (no flag): its key
// and what it does, for -h.
type yamlOnly struct{ key, help string }

// parseConfig fills a subcommand's config from, in rising precedence:
// flag defaults, the YAML file named by -config, SWITCHBOARD_<FLAG>
// environment variables (dashes become underscores), and flags given on
// the command line. The file itself is named like any flag: -config or
// SWITCHBOARD_CONFIG. dst is the struct the flags are bound to; fileOnly lists
// the settings only the file sets (fileOnly), which -h shows after the flags.
func parseConfig(fs *flag.FlagSet, args []string, dst any, fileOnly ...yamlOnly) error {
	configPath := fs.String("config", "", "YAML config file; environment variables and flags override it")
	if len(fileOnly) > 0 {
		usage := fs.Usage
		fs.Usage = func() {
			if usage != nil {
				usage()
			} else {
				fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
				fs.PrintDefaults()
			}
			fmt.Fprintln(fs.Output(), "\nSettings only in the YAML file (-config):")
			for _, y := range fileOnly {
				fmt.Fprintf(fs.Output(), "  %s\n    \t%s\n", y.key, y.help)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; run with -h for usage", fs.Arg(0))
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if !explicit["config"] {
		if v, ok := os.LookupEnv(envName("config")); ok {
			*configPath = v
		}
	}
	if *configPath != "" {
		b, err := os.ReadFile(*configPath)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		dec.KnownFields(true)
		if err := dec.Decode(dst); err != nil {
			return fmt.Errorf("config %s: %w", *configPath, err)
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if explicit[f.Name] || err != nil || f.Name == "config" {
			return
		}
		env := envName(f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, serr)
			}
		}
	})
	if err != nil {
		return err
	}
	// Parse again so that flags given on the command line win over the
	// file and the environment.
	if err := fs.Parse(args); err != nil {
		return err
	}
	return nil
}

// envName is the environment variable that sets flag name.
func envName(name string) string {
	return "SWITCHBOARD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// KeyConfig names the fleet token keys. Secrets are base64 (standard or
// URL alphabet) or hex, at least 16 bytes.
type KeyConfig struct {
	Key           string `yaml:"token_key"`
	KeyID         uint   `yaml:"token_key_id"`
	PreviousKey   string `yaml:"token_previous_key"`
	PreviousKeyID uint   `yaml:"token_previous_key_id"`
	MaxAge        string `yaml:"token_max_age"`
}

func (k *KeyConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&k.Key, "token-key", "", "current fleet token secret (base64 or hex, >= 16 bytes); required")
	fs.UintVar(&k.KeyID, "token-key-id", 0, "id of the current token key (0-63)")
	fs.StringVar(&k.PreviousKey, "token-previous-key", "", "previous fleet token secret, still accepted during a rotation")
	fs.UintVar(&k.PreviousKeyID, "token-previous-key-id", 0, "id of the previous token key (0-63)")
	fs.StringVar(&k.MaxAge, "token-max-age", "", "relays drop tokens older than this (token_expired), e.g. 24h; keep it above the longest session; empty or 0: no bound")
}

func decodeSecret(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, dec := range []func(string) ([]byte, error){
		hex.DecodeString,
		base64.StdEncoding.DecodeString,
		base64.RawStdEncoding.DecodeString,
		base64.URLEncoding.DecodeString,
		base64.RawURLEncoding.DecodeString,
	} {
		if b, err := dec(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not hex or base64")
}

// keyring builds the token keyring, saying what to fix on bad input.
func (k *KeyConfig) keyring() (*token.Keyring, error) {
	if k.Key == "" {
		return nil, errors.New("a fleet token key is required: set -token-key or SWITCHBOARD_TOKEN_KEY to 32 random bytes in base64 (e.g. `openssl rand -base64 32`), the same on every relay and transceiver")
	}
	if k.KeyID > token.MaxKeyID || k.PreviousKeyID > token.MaxKeyID {
		return nil, fmt.Errorf("token key ids must be 0-%d", token.MaxKeyID)
	}
	cur, err := decodeSecret(k.Key)
	if err != nil {
		return nil, fmt.Errorf("-token-key: %w", err)
	}
	var prev []token.Key
	if k.PreviousKey != "" {
		b, err := decodeSecret(k.PreviousKey)
		if err != nil {
			return nil, fmt.Errorf("-token-previous-key: %w", err)
		}
		prev = append(prev, token.Key{ID: uint8(k.PreviousKeyID), Secret: b})
	}
	kr, err := token.NewKeyring(token.Key{ID: uint8(k.KeyID), Secret: cur}, prev...)
	if err != nil || k.MaxAge == "" {
		return kr, err
	}
	if kr.MaxAge, err = time.ParseDuration(k.MaxAge); err != nil || kr.MaxAge < 0 {
		return nil, fmt.Errorf("-token-max-age %q: want a duration such as 24h, or 0 for no bound", k.MaxAge)
	}
	return kr, nil
}

// registerAuth adds the signaling authentication flags (internal/auth) to
// fs, writing into a. Secrets are better set through the environment
// (SWITCHBOARD_AUTH_SIGNING_KEY, SWITCHBOARD_AUTH_API_KEYS) or the YAML
// file's auth section than on a command line.
func registerAuth(fs *flag.FlagSet, a *auth.Config) {
	fs.StringVar(&a.SigningKey, "auth-signing-key", "", "base64 HS256 key (>= 32 bytes) of client tokens, shared by every transceiver and director; empty with no -auth-api-keys: signaling is open")
	fs.StringVar(&a.PreviousSigningKey, "auth-previous-signing-key", "", "a second HS256 key that verifies (never signs) client tokens during a signing-key rotation")
	fs.Func("auth-api-keys", "comma-separated server-side API keys (>= 32 bytes each) that mint client tokens at POST /v1/client_tokens", func(v string) error {
		a.APIKeys = nil
		for k := range strings.SplitSeq(v, ",") {
			if k = strings.TrimSpace(k); k != "" {
				a.APIKeys = append(a.APIKeys, k)
			}
		}
		return nil
	})
	fs.DurationVar(&a.TokenTTL, "auth-token-ttl", auth.DefaultTokenTTL, "lifetime of a client token")
}
