package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("a: from-file\nb: from-file\nc: from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		A string `yaml:"a"`
		B string `yaml:"b"`
		C string `yaml:"c"`
		D string `yaml:"d"`
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.StringVar(&cfg.A, "a", "default", "")
	fs.StringVar(&cfg.B, "b", "default", "")
	fs.StringVar(&cfg.C, "c", "default", "")
	fs.StringVar(&cfg.D, "d", "default", "")
	t.Setenv("SWITCHBOARD_A", "from-env")
	t.Setenv("SWITCHBOARD_B", "from-env")
	if err := Parse(fs, []string{"-config", file, "-a", "from-flag"}, &cfg); err != nil {
		t.Fatal(err)
	}
	want := [4]string{"from-flag", "from-env", "from-file", "default"}
	if got := [4]string{cfg.A, cfg.B, cfg.C, cfg.D}; got != want {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestConfigFromEnvironment: SWITCHBOARD_CONFIG names the file as -config
// does, and -config on the command line wins over it.
func TestConfigFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	envFile, flagFile := filepath.Join(dir, "env.yaml"), filepath.Join(dir, "flag.yaml")
	if err := os.WriteFile(envFile, []byte("a: from-env-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flagFile, []byte("a: from-flag-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SWITCHBOARD_CONFIG", envFile)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"environment", nil, "from-env-file"},
		{"flag wins", []string{"-config", flagFile}, "from-flag-file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var cfg struct {
				A string `yaml:"a"`
			}
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.StringVar(&cfg.A, "a", "default", "")
			if err := Parse(fs, tt.args, &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.A != tt.want {
				t.Fatalf("a = %q, want %q", cfg.A, tt.want)
			}
		})
	}
}

// TestUsageListsFileOnlySettings: -h shows the settings only the YAML file
// sets, after the flags.
func TestUsageListsFileOnlySettings(t *testing.T) {
	var out strings.Builder
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.String("a", "", "flag a")
	AddFileFlag(fs, FileOnly{"regions", "region name → cluster"})
	err := Parse(fs, []string{"-h"}, &struct{}{})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if u := out.String(); !strings.Contains(u, "-a") || !strings.Contains(u, "only in the YAML file") || !strings.Contains(u, "regions") || strings.Index(u, "regions") < strings.Index(u, "-a") {
		t.Fatalf("usage:\n%s", u)
	}
}

func TestParseConfigErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("nosuchkey: 1\n"), 0o600)
	tests := []struct {
		name    string
		args    []string
		mention string
	}{
		{"unknown yaml key", []string{"-config", bad}, "nosuchkey"},
		{"missing file", []string{"-config", filepath.Join(dir, "none.yaml")}, "none.yaml"},
		{"stray argument", []string{"extra"}, "extra"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg struct {
				A string `yaml:"a"`
			}
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.StringVar(&cfg.A, "a", "", "")
			err := Parse(fs, tt.args, &cfg)
			if err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %v does not mention %q", err, tt.mention)
			}
		})
	}
}

func TestKeysErrors(t *testing.T) {
	tests := []struct {
		name    string
		k       Keys
		mention string
	}{
		{"missing", Keys{}, "SWITCHBOARD_TOKEN_KEY"},
		{"not base64", Keys{Key: "!!!"}, "hex or base64"},
		{"short", Keys{Key: "AAAA"}, "-token-key: secret is 2 bytes, need at least 16"},
		{"previous short", Keys{Key: strings.Repeat("ab", 32), KeyID: 1, PreviousKey: "AAAA"}, "-token-previous-key: secret is 2 bytes"},
		{"id too large", Keys{Key: strings.Repeat("ab", 32), KeyID: 99}, "0-63"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.k.Keyring()
			if err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %v does not mention %q", err, tt.mention)
			}
		})
	}
}

// TestFlagSetsNameTheirEnvironment: every server subcommand has -config,
// and each flag's help names the variable that sets it, as Parse reads it.
func TestFlagSetsNameTheirEnvironment(t *testing.T) {
	for name, fs := range FlagSets() {
		if fs.Name() != name {
			t.Errorf("flag set %q is named %q", name, fs.Name())
		}
		if fs.Lookup("config") == nil {
			t.Errorf("%s: no -config", name)
		}
		fs.VisitAll(func(f *flag.Flag) {
			if want := "[$" + CommandEnvName(name, f.Name) + "]"; !strings.HasSuffix(f.Usage, want) {
				t.Errorf("%s -%s: help %q does not end in %s", name, f.Name, f.Usage, want)
			}
		})
	}
}

// TestEveryCommandDescribesItself: `switchboard <command> -h` opens with
// the command's synopsis and a paragraph on what it does, then its flags,
// for every server subcommand alike.
func TestEveryCommandDescribesItself(t *testing.T) {
	for name, fs := range FlagSets() {
		var out strings.Builder
		fs.SetOutput(&out)
		if err := fs.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s -h: %v", name, err)
		}
		u := out.String()
		head, _, ok := strings.Cut(u, "\nFlags:\n")
		synopsis, about, _ := strings.Cut(head, "\n\n")
		if !ok || !strings.HasPrefix(synopsis, "Usage: switchboard "+name+" ") || len(strings.TrimSpace(about)) < 40 {
			t.Errorf("%s -h does not open with its synopsis, a paragraph and its flags:\n%s", name, u)
		}
		if !strings.Contains(u, "-config") {
			t.Errorf("%s -h lists no flags:\n%s", name, u)
		}
	}
}

// TestModeEnvironmentPerCommand: -mode means parrot or echo to the agent
// and the demo, proxy or redirect to the director, so each reads its own
// variable, and a shell exporting one for one command leaves the others
// alone; the old shared SWITCHBOARD_MODE is an error naming the new one.
func TestModeEnvironmentPerCommand(t *testing.T) {
	t.Setenv("SWITCHBOARD_AGENT_MODE", "echo")
	t.Setenv("SWITCHBOARD_DIRECTOR_MODE", "redirect")
	var a Agent
	if err := Parse(a.Flags(), nil, &a); err != nil {
		t.Fatal(err)
	}
	var d Director
	if err := Parse(d.Flags(), nil, &d); err != nil {
		t.Fatal(err)
	}
	var demo Demo
	if err := Parse(demo.Flags(), nil, &demo); err != nil {
		t.Fatal(err)
	}
	if a.Mode != "echo" || d.Director.Mode != "redirect" || demo.Mode != agent.ModeParrot {
		t.Fatalf("agent mode %q, director mode %q, demo mode %q; want echo, redirect and the demo's default", a.Mode, d.Director.Mode, demo.Mode)
	}

	t.Setenv("SWITCHBOARD_MODE", "echo")
	checkSharedNameRefused(t, "mode", "agent", "director", "demo")
}

// TestListenEnvironmentPerCommand: -listen is the transceiver's
// internal-hop UDP socket but the agent's and the director's HTTP
// address, so each reads its own variable, and an env file or ConfigMap
// shared by all three moves each alone; the old shared SWITCHBOARD_LISTEN
// is an error naming the command's own variable.
func TestListenEnvironmentPerCommand(t *testing.T) {
	t.Setenv("SWITCHBOARD_TRANSCEIVER_LISTEN", "127.0.0.1:14000")
	t.Setenv("SWITCHBOARD_AGENT_LISTEN", "127.0.0.1:18081")
	t.Setenv("SWITCHBOARD_DIRECTOR_LISTEN", "127.0.0.1:18443")
	var trx Transceiver
	if err := Parse(trx.Flags(), nil, &trx); err != nil {
		t.Fatal(err)
	}
	var a Agent
	if err := Parse(a.Flags(), nil, &a); err != nil {
		t.Fatal(err)
	}
	var d Director
	if err := Parse(d.Flags(), nil, &d); err != nil {
		t.Fatal(err)
	}
	if trx.Trx.ListenAddr != "127.0.0.1:14000" || a.Listen != "127.0.0.1:18081" || d.Listen != "127.0.0.1:18443" {
		t.Fatalf("transceiver -listen %q, agent -listen %q, director -listen %q; want each its own variable's", trx.Trx.ListenAddr, a.Listen, d.Listen)
	}

	t.Setenv("SWITCHBOARD_LISTEN", "0.0.0.0:4000")
	checkSharedNameRefused(t, "listen", "transceiver", "agent", "director")
	// The whole message, as `switchboard transceiver` prints it.
	err := Parse(new(Transceiver).Flags(), nil, &struct{}{})
	want := "SWITCHBOARD_LISTEN is no longer read (-listen means something else in each command; " +
		"`switchboard transceiver -listen`: UDP address of the internal-hop socket relays send to): set SWITCHBOARD_TRANSCEIVER_LISTEN instead"
	if err == nil || err.Error() != want {
		t.Errorf("transceiver with SWITCHBOARD_LISTEN set: %v\nwant: %s", err, want)
	}
	// The relay and the demo have no -listen: the variable is another
	// command's to them, like any flag they lack.
	for _, name := range []string{"relay", "demo"} {
		if err := Parse(FlagSets()[name], nil, &struct{}{}); err != nil {
			t.Errorf("%s with SWITCHBOARD_LISTEN set: %v", name, err)
		}
	}
}

// checkSharedNameRefused checks, with the old shared variable of flag set
// (EnvName), that exactly the subcommands in want have the flag, that
// each fails to parse with an error naming the old variable and its own
// (CommandEnvName), and that each parses with the flag on the command
// line, which does not read the environment.
func checkSharedNameRefused(t *testing.T, flagName string, want ...string) {
	t.Helper()
	old := EnvName(flagName)
	var have []string
	for name, fs := range FlagSets() {
		if fs.Lookup(flagName) == nil {
			continue
		}
		have = append(have, name)
		err := Parse(fs, nil, &struct{}{})
		own := CommandEnvName(name, flagName)
		if own == old {
			t.Errorf("%s -%s is read from the shared %s", name, flagName, old)
		}
		if err == nil || !strings.Contains(err.Error(), old+" is no longer read") || !strings.Contains(err.Error(), "set "+own+" instead") {
			t.Errorf("%s with %s set: %v; want an error naming %s", name, old, err, own)
		}
		if err := Parse(FlagSets()[name], []string{"-" + flagName, fs.Lookup(flagName).DefValue}, &struct{}{}); err != nil {
			t.Errorf("%s -%s with %s set: %v", name, flagName, old, err)
		}
	}
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(have, want) {
		t.Errorf("subcommands with -%s: %v, want %v", flagName, have, want)
	}
}

// TestRelayDefaults: a relay given nothing runs on the relay package's
// defaults, and SWITCHBOARD_PUBLIC moves its public socket.
func TestRelayDefaults(t *testing.T) {
	var cfg Relay
	if err := Parse(cfg.Flags(), nil, &cfg); err != nil {
		t.Fatal(err)
	}
	r := cfg.Relay
	if r.PublicAddr != relay.DefaultPublicAddr || r.InternalAddr != relay.DefaultInternalAddr || cfg.Metrics != relay.DefaultMetricsAddr ||
		r.PendingTimeout != relay.DefaultPendingTimeout || r.Cluster != 1 || !r.Relearn || cfg.Source.Source != MembershipStatic {
		t.Errorf("defaults: %+v", cfg)
	}
	t.Setenv("SWITCHBOARD_PUBLIC", "127.0.0.1:3480")
	cfg = Relay{}
	if err := Parse(cfg.Flags(), nil, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Relay.PublicAddr != "127.0.0.1:3480" {
		t.Errorf("SWITCHBOARD_PUBLIC: public %q", cfg.Relay.PublicAddr)
	}
}

// TestUnknownKeyNamesIt: a key the file should not have is named as a key
// (not as a Go struct field), with the key it most likely meant.
func TestUnknownKeyNamesIt(t *testing.T) {
	file := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(file, []byte("members: 1=127.0.0.1:4000\npublic: 127.0.0.1:3478\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg Relay
	err := Parse(cfg.Flags(), []string{"-config", file}, &cfg)
	if err == nil || !strings.Contains(err.Error(), `line 2: unknown key "public" (did you mean public_addr?)`) || strings.Contains(err.Error(), "struct") {
		t.Fatalf("error %v", err)
	}
}

// TestListSettingsTakeCommaStrings: a list setting in the file is a YAML
// list or, as its flag takes it, one comma-separated string; both give
// the same list, through anchors and aliases too, and a mapping or an
// empty item is refused with the key and its line.
func TestListSettingsTakeCommaStrings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	want := []string{"10.0.0.0/8", "192.168.0.0/16"}
	keys := []string{strings.Repeat("a", 32), strings.Repeat("b", 32)}
	for name, body := range map[string]string{
		"comma strings": "allow_relays: 10.0.0.0/8, 192.168.0.0/16\ntrusted_proxies: \"10.0.0.0/8,192.168.0.0/16\"\nauth:\n  api_keys: " + keys[0] + "," + keys[1] + "\n",
		"yaml lists":    "allow_relays: [10.0.0.0/8, 192.168.0.0/16]\ntrusted_proxies:\n  - 10.0.0.0/8\n  - 192.168.0.0/16\nauth:\n  api_keys: [" + keys[0] + ", " + keys[1] + "]\n",
		"anchor, alias": "allow_relays: &nets 10.0.0.0/8, 192.168.0.0/16\ntrusted_proxies: *nets\nauth:\n  api_keys: &keys\n    - " + keys[0] + "\n    - " + keys[1] + "\n",
		"folded string": "allow_relays: >\n  10.0.0.0/8,\n  192.168.0.0/16\ntrusted_proxies: '10.0.0.0/8 , 192.168.0.0/16'\nauth: {api_keys: \"" + keys[0] + ", " + keys[1] + "\"}\n",
	} {
		t.Run("transceiver "+name, func(t *testing.T) {
			var cfg Transceiver
			if err := Parse(cfg.Flags(), []string{"-config", write("trx.yaml", body)}, &cfg); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Trx.AllowRelays, want) || !slices.Equal(cfg.Trx.TrustedProxies, want) || !slices.Equal(cfg.Trx.Auth.APIKeys, keys) {
				t.Errorf("allow_relays %q, trusted_proxies %q, api_keys %q", cfg.Trx.AllowRelays, cfg.Trx.TrustedProxies, cfg.Trx.Auth.APIKeys)
			}
			// The rest of the config keeps its flag defaults.
			if cfg.Trx.ListenAddr != transceiver.DefaultListenAddr || cfg.Trx.MaxSessions != transceiver.DefaultMaxSessions {
				t.Errorf("listen %q, max_sessions %d: the file changed settings it does not name", cfg.Trx.ListenAddr, cfg.Trx.MaxSessions)
			}
		})
	}
	t.Run("relay trusted_ingress", func(t *testing.T) {
		var cfg Relay
		if err := Parse(cfg.Flags(), []string{"-config", write("relay.yaml", "trusted_ingress: 10.0.0.0/8,192.168.0.0/16\n")}, &cfg); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Relay.TrustedIngress, want) {
			t.Errorf("trusted_ingress %q", cfg.Relay.TrustedIngress)
		}
	})
	t.Run("director trusted_proxies, clusters, prefixes", func(t *testing.T) {
		var cfg Director
		body := "trusted_proxies: 10.0.0.0/8, 192.168.0.0/16\nclusters:\n  eu: http://a/v1/calls,http://b/v1/calls\n  us: [http://c/v1/calls]\nregions:\n  eu: {cluster: eu, prefixes: \"10.0.0.0/8, 192.168.0.0/16\"}\n"
		if err := Parse(cfg.Flags(), []string{"-config", write("director.yaml", body)}, &cfg); err != nil {
			t.Fatal(err)
		}
		d := cfg.Director
		if !slices.Equal(d.TrustedProxies, want) || !slices.Equal(d.Clusters["eu"], []string{"http://a/v1/calls", "http://b/v1/calls"}) ||
			!slices.Equal(d.Clusters["us"], []string{"http://c/v1/calls"}) || d.Regions["eu"].Cluster != "eu" || !slices.Equal(d.Regions["eu"].Prefixes, want) {
			t.Errorf("trusted_proxies %q, clusters %q, regions %+v", d.TrustedProxies, d.Clusters, d.Regions)
		}
	})
	for _, tt := range []struct{ name, body, want string }{
		{"mapping", "id: 1\nallow_relays:\n  a: 10.0.0.0/8\n", "line 3: allow_relays: got a mapping; want a YAML list, or one comma-separated string, of values"},
		{"nested mapping", "auth:\n  signing_key: x\n  api_keys: {a: b}\n", "line 3: auth.api_keys: got a mapping;"},
		{"aliased mapping", "ingress_by_region: &m {eu: 10.0.0.1:3478}\ntrusted_proxies: *m\n", "line 1: ingress_by_region: got a mapping;"},
		{"empty item", "allow_relays: 10.0.0.0/8,,192.168.0.0/16\n", `line 1: allow_relays: an empty item in "10.0.0.0/8,,192.168.0.0/16"`},
		{"trailing comma", "\ntrusted_proxies: '10.0.0.0/8,'\n", `line 2: trusted_proxies: an empty item in "10.0.0.0/8,"`},
		{"empty string", "allow_relays: ''\n", "line 1: allow_relays: an empty string (write [] for no values)"},
	} {
		t.Run("refused "+tt.name, func(t *testing.T) {
			var cfg Transceiver
			err := Parse(cfg.Flags(), []string{"-config", write("bad.yaml", tt.body)}, &cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
	t.Run("line numbers kept", func(t *testing.T) {
		var cfg Transceiver
		body := "allow_relays: 10.0.0.0/8,192.168.0.0/16 # pods\n\n# proxies\ntrusted_proxies: '10.0.0.0/8, 192.168.0.0/16'\n\nnosuchkey: 1\n"
		err := Parse(cfg.Flags(), []string{"-config", write("lines.yaml", body)}, &cfg)
		if err == nil || !strings.Contains(err.Error(), `line 6: unknown key "nosuchkey"`) || strings.Contains(err.Error(), "struct") {
			t.Fatalf("error %v", err)
		}
		cfg = Transceiver{}
		if err := Parse(cfg.Flags(), []string{"-config", write("lines.yaml", strings.TrimSuffix(body, "nosuchkey: 1\n"))}, &cfg); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Trx.AllowRelays, want) || !slices.Equal(cfg.Trx.TrustedProxies, want) {
			t.Errorf("allow_relays %q, trusted_proxies %q", cfg.Trx.AllowRelays, cfg.Trx.TrustedProxies)
		}
	})
}

// TestListFlags: every list flag, and its environment variable, goes
// through the parser of the file's comma strings: items trimmed, an empty
// item refused with the flag named; the file's members takes a YAML list.
func TestListFlags(t *testing.T) {
	want := []string{"10.0.0.0/8", "192.168.0.0/16"}
	key := strings.Repeat("k", 32)
	t.Run("transceiver", func(t *testing.T) {
		var cfg Transceiver
		args := []string{"-allow-relays", " 10.0.0.0/8, 192.168.0.0/16 ", "-trusted-proxies", "10.0.0.0/8 ,192.168.0.0/16", "-auth-api-keys", key + " , " + key}
		if err := Parse(cfg.Flags(), args, &cfg); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Trx.AllowRelays, want) || !slices.Equal(cfg.Trx.TrustedProxies, want) || !slices.Equal(cfg.Trx.Auth.APIKeys, []string{key, key}) {
			t.Errorf("allow_relays %q, trusted_proxies %q, api_keys %q", cfg.Trx.AllowRelays, cfg.Trx.TrustedProxies, cfg.Trx.Auth.APIKeys)
		}
	})
	t.Run("relay", func(t *testing.T) {
		var cfg Relay
		t.Setenv("SWITCHBOARD_TRUSTED_INGRESS", "10.0.0.0/8, 192.168.0.0/16")
		if err := Parse(cfg.Flags(), []string{"-members", "1=127.0.0.1:4000, 2=127.0.0.1:4001"}, &cfg); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Relay.TrustedIngress, want) || !slices.Equal(cfg.Members, []string{"1=127.0.0.1:4000", "2=127.0.0.1:4001"}) {
			t.Errorf("trusted_ingress %q, members %q", cfg.Relay.TrustedIngress, cfg.Members)
		}
	})
	t.Run("members as a YAML list", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "relay.yaml")
		if err := os.WriteFile(file, []byte("members:\n  - 1=127.0.0.1:4000\n  - 2=127.0.0.1:4001\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var cfg Relay
		if err := Parse(cfg.Flags(), []string{"-config", file}, &cfg); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Members, []string{"1=127.0.0.1:4000", "2=127.0.0.1:4001"}) {
			t.Errorf("members %q", cfg.Members)
		}
	})
	t.Run("empty YAML list item", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "relay.yaml")
		if err := os.WriteFile(file, []byte("members:\n  - 1=127.0.0.1:4000\n  - ''\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var cfg Relay
		err := Parse(cfg.Flags(), []string{"-config", file}, &cfg)
		if err == nil || !strings.Contains(err.Error(), "line 3: members[1]: an empty item;") {
			t.Fatalf("error %v", err)
		}
	})
	for _, tt := range []struct {
		name string
		cfg  interface{ Flags() *flag.FlagSet }
		args []string
	}{
		{"allow-relays", &Transceiver{}, []string{"-allow-relays", "10.0.0.0/8,,192.168.0.0/16"}},
		{"trusted-proxies", &Transceiver{}, []string{"-trusted-proxies", "10.0.0.0/8,"}},
		{"auth-api-keys", &Transceiver{}, []string{"-auth-api-keys", key + ",," + key}},
		{"trusted-ingress", &Relay{}, []string{"-trusted-ingress", ",10.0.0.0/8"}},
		{"members", &Relay{}, []string{"-members", "1=127.0.0.1:4000,,2=127.0.0.1:4001"}},
	} {
		t.Run("refused "+tt.name, func(t *testing.T) {
			err := Parse(tt.cfg.Flags(), tt.args, tt.cfg)
			if err == nil || !strings.Contains(err.Error(), "-"+tt.name) || !strings.Contains(err.Error(), "an empty item in") {
				t.Fatalf("error %v, want one naming -%s and the empty item", err, tt.name)
			}
		})
	}
}

// TestEmptyFile: a file with only comments sets nothing and is no error.
func TestEmptyFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(p, []byte("# nothing set yet\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg Transceiver
	if err := Parse(cfg.Flags(), []string{"-config", p}, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Trx.ListenAddr != transceiver.DefaultListenAddr {
		t.Errorf("listen %q", cfg.Trx.ListenAddr)
	}
}

// TestFileErrorsSayWhatToFix: a newcomer's YAML mistakes are named by the
// line to fix and, where there is one, by the fix: the nearest key of the
// same mapping (nested ones too), a duration's unit, the key of a value
// of the wrong type. yaml.v3 used to name line 1 for a list opened on
// line 2, the line before a tab, and the end of the file for a quote
// never closed.
func TestFileErrorsSayWhatToFix(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ name, body, want string }{
		{"misspelt key", "id: 1\nadvertise: 127.0.0.1:3478\nsetup_timout: 30s\n", `line 3: unknown key "setup_timout" (did you mean setup_timeout?)`},
		{"misspelt nested key", "id: 1\nauth:\n  signing_key: x\n  api_key: [a]\n", `line 4: unknown key "api_key" (did you mean api_keys?)`},
		{"part of a key", "backend: ws://127.0.0.1:8081/v1/bridge\n", `line 1: unknown key "backend" (did you mean backend_url?)`},
		{"no near key", "id: 1\nzzzzzzzz: 1\n", `line 2: unknown key "zzzzzzzz"`},
		{"bare seconds", "id: 1\nsetup_timeout: 30\n", `line 2: setup_timeout: "30" is not a duration: write a number with a unit, such as 30s`},
		{"bad unit", "drain_timeout: 5x\n", `line 1: drain_timeout: "5x" is not a duration: write a number with a unit, such as 60s`},
		{"not a number", "id: 1\nmax_sessions: many\n", `line 2: max_sessions: "many" is not a whole number`},
		{"list for a string", "id: 1\nadvertise:\n  - 127.0.0.1:3478\n", "line 3: advertise: got a list, want a string"},
		{"list for a section", "id: 1\nauth: [a]\n", "line 2: auth: got a list, want a mapping"},
		{"tab indent", "id: 1\nauth:\n\tsigning_key: x\n", "line 3: a tab in the indentation: YAML indents with spaces only"},
		{"unclosed list", "id: 1\nallow_relays: [10.0.0.0/8\nadvertise: 127.0.0.1:3478\n", "line 2: did not find expected ',' or ']'"},
		{"unclosed quote", "id: 1\nadvertise: \"127.0.0.1:3478\nhttp: 127.0.0.1:8080\n", `line 2: the " that opens a value is never closed`},
		{"mapping in a value", "id: 1\nadvertise: 127.0.0.1:3478\n  http: 127.0.0.1:8080\n", "line 3: mapping values are not allowed in this context"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "trx.yaml")
			if err := os.WriteFile(p, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			var cfg Transceiver
			err := Parse(cfg.Flags(), []string{"-config", p}, &cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
			if tt.name == "no near key" && strings.Contains(err.Error(), "did you mean") {
				t.Errorf("error %v suggests a key far from the one given", err)
			}
		})
	}
}

// TestDirectorFileErrors: the director's YAML mistakes are worded as the
// transceiver's are; a list where its regions mapping goes named the Go
// type of a region ("cannot unmarshal !!seq into map[string]struct {
// Cluster string …"), since that type has spaces in its name.
func TestDirectorFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ name, body, want string }{
		{"list for regions", "regions: []\n", "line 1: regions: got a list, want a mapping"},
		{"list for a region", "regions:\n  eu: [a]\n", "line 2: regions.eu: got a list, want a mapping"},
		{"misspelt key", "default_region: eu\nclustres: {}\n", `line 2: unknown key "clustres" (did you mean clusters?)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "director.yaml")
			if err := os.WriteFile(p, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			var cfg Director
			err := Parse(cfg.Flags(), []string{"-config", p}, &cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "struct") {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

// TestFlagErrorsAreOneLine: a bad flag or value is one line that says what
// to fix and where the flags are listed, with nothing printed (the flag
// package printed the error and then the whole usage, 80 lines); -h still
// prints the usage.
func TestFlagErrorsAreOneLine(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  [2]string
		want string
	}{
		{[]string{"-idle-timeout", "60"}, [2]string{}, `-idle-timeout "60": not a duration: write a number with a unit, such as 60s (units: ms, s, m, h); run 'switchboard relay -h' for the flags`},
		{[]string{"-membrs", "1=127.0.0.1:4000"}, [2]string{}, "no flag -membrs (did you mean -members?); run 'switchboard relay -h' for the flags"},
		{[]string{"-workers", "two"}, [2]string{}, `-workers "two": want a whole number, such as 0;`},
		{[]string{"-relearn=maybe"}, [2]string{}, `-relearn "maybe": want true or false;`},
		{nil, [2]string{"SWITCHBOARD_PENDING_TIMEOUT", "10"}, `SWITCHBOARD_PENDING_TIMEOUT="10": not a duration: write a number with a unit, such as 10s`},
		{[]string{"stray"}, [2]string{}, `unexpected argument "stray"; run 'switchboard relay -h' for the flags`},
	} {
		if tt.env[0] != "" {
			t.Setenv(tt.env[0], tt.env[1])
		}
		var cfg Relay
		fs := cfg.Flags()
		var out strings.Builder
		fs.SetOutput(&out)
		err := Parse(fs, tt.args, &cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q %v: error %v, want one line with %q", tt.args, tt.env, err, tt.want)
		}
		if out.Len() > 0 {
			t.Errorf("%q: printed %d bytes besides the error:\n%s", tt.args, out.Len(), out.String())
		}
		if tt.env[0] != "" {
			os.Unsetenv(tt.env[0])
		}
	}
	var cfg Relay
	fs := cfg.Flags()
	var out strings.Builder
	fs.SetOutput(&out)
	if err := Parse(fs, []string{"-h"}, &cfg); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "-members") {
		t.Errorf("-h: %v, usage %q", err, out.String())
	}
}

// TestParrotOptions: -turn-detection takes OpenAI's turn_detection JSON
// with Switchboard's members, filling defaults; a bad one or a negative
// -reply-delay is refused saying what to fix; the echo refuses either.
func TestParrotOptions(t *testing.T) {
	var c Agent
	if err := Parse(c.Flags(), []string{"-turn-detection", `{"pause_duration_ms":200,"resume_false_interruption":true}`, "-reply-delay", "400ms"}, &c); err != nil {
		t.Fatal(err)
	}
	o, err := c.ParrotOptions()
	if err != nil {
		t.Fatal(err)
	}
	if o.ReplyDelay.Milliseconds() != 400 || o.TurnDetection == nil || o.TurnDetection.PauseDurationMs != 200 ||
		!o.TurnDetection.ResumeFalseInterruption || o.TurnDetection.SilenceDurationMs != 500 {
		t.Fatalf("options %+v (turn detection %+v)", o, o.TurnDetection)
	}
	if _, err := agent.NewMode(agent.ModeEcho, "", nil, o); err == nil || !strings.Contains(err.Error(), "takes no turns") {
		t.Errorf("echo with parrot options: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-turn-detection", `{"pause_duration_ms":600}`}, "-turn-detection: vad: invalid turn_detection: pause_duration_ms 600 is out of range"},
		{[]string{"-turn-detection", `server_vad`}, "-turn-detection: not a turn_detection JSON object"},
		{[]string{"-reply-delay", "-1s"}, "-reply-delay -1s: must not be negative"},
	} {
		var c Demo
		if err := Parse(c.Flags(), tc.args, &c); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ParrotOptions(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}
