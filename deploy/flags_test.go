package deploy

import (
	"flag"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/config"
)

// flagsOf returns the flags of `switchboard <cmd>` by name, from the flag
// set the binary itself builds (package config).
func flagsOf(t *testing.T, sets map[string]*flag.FlagSet, cmd string) map[string]*flag.Flag {
	t.Helper()
	fs, ok := sets[cmd]
	if !ok {
		t.Fatalf("no server subcommand %q; have %v", cmd, keys(sets))
	}
	out := map[string]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) { out[f.Name] = f })
	return out
}

func TestFlagSets(t *testing.T) {
	sets := config.FlagSets()
	for _, tt := range []struct {
		cmd  string
		want []string
	}{
		{"relay", []string{"public", "internal", "cluster", "members", "membership", "kube-service", "kube-port", "kube-id-offset", "metrics", "token-key", "token-key-id", "token-previous-key", "token-previous-key-id", "log-level", "config"}},
		{"transceiver", []string{"id", "cluster", "listen", "advertise", "backend", "http", "drain-timeout", "token-key", "log-format", "config"}},
		{"agent", []string{"listen", "log-level"}},
	} {
		t.Run(tt.cmd, func(t *testing.T) {
			got := flagsOf(t, sets, tt.cmd)
			for _, f := range tt.want {
				if _, ok := got[f]; !ok {
					t.Errorf("flag -%s not found among %v", f, keys(got))
				}
			}
		})
	}
	if got := flagsOf(t, sets, "relay")["public"].DefValue; got != "0.0.0.0:3478" {
		t.Errorf("relay -public defaults to %s", got)
	}
}
