package deploy

import (
	"flag"
	"strings"
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

// transceiverFlagsNotInChart are the `switchboard transceiver` flags the
// chart does not set, each with why; every other flag must reach the
// transceiver's pod as its environment variable in the default or the
// custom render (TestTransceiverFlagsInChart), so that a new flag is
// either given a value or listed here.
var transceiverFlagsNotInChart = map[string]string{
	"config":           "the chart passes every setting as an environment variable, not a file",
	"direct":           "no relay: a single-host setup, not a fleet; the chart always runs relays",
	"dtls-role":        "the default (client) suits every browser tried (docs/interop.md); extraEnv SWITCHBOARD_DTLS_ROLE if a client needs another",
	"output-queue-max": "the default (60 s of audio) bounds memory per session; extraEnv SWITCHBOARD_OUTPUT_QUEUE_MAX to change it",
	"log-format":       "the binary's default for servers is JSON, what a cluster's log pipeline reads",
	"pprof":            "profiles stay off in a fleet; extraEnv SWITCHBOARD_PPROF=true on one pod to profile it",
	"hop-advertise":    "relays find transceivers through EndpointSlices, by pod IP and the hop port",
	"redis":            "the chart's relays read membership from EndpointSlices (-membership kubernetes), not from a Redis registry; its Redis is the relays' flow cache",
	"token-max-age":    "only relays open tokens and check their age; a transceiver mints them",
}

// relayFlagsNotInChart are the `switchboard relay` flags the chart does
// not set, each with why (TestRelayFlagsInChart), as
// transceiverFlagsNotInChart is for the transceiver.
var relayFlagsNotInChart = map[string]string{
	"config":                "the chart passes every setting as an environment variable, not a file",
	"pprof":                 "profiles stay off in a fleet; extraEnv SWITCHBOARD_PPROF=true on one pod to profile it",
	"members":               "static membership; the chart's relays watch the transceivers' EndpointSlices (-membership kubernetes)",
	"redis":                 "a Redis membership registry; the chart's relays watch EndpointSlices instead",
	"kubeconfig":            "relays in the cluster use their service account",
	"kube-namespace":        "the transceivers run in the relays' own namespace, the default",
	"ingress":               "the chart deploys one cluster's relays; a Global Relay tier in front of clusters is deployed apart (docs/design.md §2.3)",
	"trusted-ingress":       "only with Global Relays in front, which the chart does not deploy; extraEnv SWITCHBOARD_TRUSTED_INGRESS when they exist",
	"relearn":               "on by default, which rebuilds flows after a relay restart from the transceivers' traffic (docs/relay.md \"Relearning flows\")",
	"max-pending-per-ip":    "per-client limits whose defaults suit clients behind NATs; extraEnv SWITCHBOARD_MAX_PENDING_PER_IP to change it",
	"new-flows-per-ip":      "as max-pending-per-ip; extraEnv SWITCHBOARD_NEW_FLOWS_PER_IP",
	"new-flow-burst-per-ip": "as max-pending-per-ip; extraEnv SWITCHBOARD_NEW_FLOW_BURST_PER_IP",
	"new-flows-per-second":  "a per-relay flood bound sized to one relay's capacity, not to the release; extraEnv SWITCHBOARD_NEW_FLOWS_PER_SECOND",
}

// TestTransceiverFlagsInChart: every flag of the transceiver's real flag
// set (config.FlagSets) reaches its pod as its environment variable in the
// default or the custom render, whether from a value (transceiverSettings)
// or mapped by the templates themselves (id, listen, backend, token keys,
// …), or is listed, with a reason, in transceiverFlagsNotInChart; and every
// listed name is a flag.
func TestTransceiverFlagsInChart(t *testing.T) {
	checkFlagsInChart(t, "transceiver", transceiverFlagsNotInChart)
}

// TestRelayFlagsInChart is TestTransceiverFlagsInChart for the relay:
// each of its flags reaches the relay pod (relay.tokenMaxAge as
// -token-max-age, say) or is listed in relayFlagsNotInChart with why.
func TestRelayFlagsInChart(t *testing.T) {
	checkFlagsInChart(t, "relay", relayFlagsNotInChart)
}

// checkFlagsInChart checks that every flag of `switchboard <cmd>` reaches
// the pod of component cmd as its environment variable in the default or
// the custom render, or is in notInChart with a reason, and that every
// name there is a flag of cmd that the chart does not set.
func checkFlagsInChart(t *testing.T, cmd string, notInChart map[string]string) {
	set := map[string]bool{}
	for _, vals := range []map[string]any{withPublicIP(nil), customValues()} {
		r, err := render(t, vals)
		if err != nil {
			t.Fatal(err)
		}
		for name := range envMap(r.component(t, cmd).tmpl.Spec.Containers[0]) {
			set[name] = true
		}
	}
	flags := flagsOf(t, config.FlagSets(), cmd)
	for name, why := range notInChart {
		if _, ok := flags[name]; !ok {
			t.Errorf("-%s is listed as not in the chart, but `switchboard %s` does not have it; remove it", name, cmd)
		}
		if strings.TrimSpace(why) == "" {
			t.Errorf("-%s is listed as not in the chart without a reason", name)
		}
	}
	for name := range flags {
		_, listed := notInChart[name]
		env := config.CommandEnvName(cmd, name)
		switch inChart := set[env]; {
		case !inChart && !listed:
			t.Errorf("-%s: the chart does not set %s; add a %s value for it, or list it as not in the chart with why", name, env, cmd)
		case inChart && listed:
			t.Errorf("-%s is set by the chart (%s) but listed as not in it", name, env)
		}
	}
}
