package deploy

import (
	"flag"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

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
	"echo-dump-dir":    "dumps hold users' voices and are for a diagnosis on one pod: extraEnv SWITCHBOARD_ECHO_DUMP_DIR with a volume mounted there",
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

// agentFlagsNotInChart are the `switchboard agent` flags the chart does
// not set, each with why (TestAgentFlagsInChart).
var agentFlagsNotInChart = map[string]string{
	"config":     "the chart gives the agent its settings as variables and arguments, not a file",
	"format":     "-mode echo's default, opus/48000/2, is what the transceiver sends, returned unchanged",
	"log-format": "the binary's default for servers is JSON, what a cluster's log pipeline reads",
	"pprof":      "profiles stay off in a fleet; extraEnv SWITCHBOARD_PPROF=true on one pod to profile it",
	// The parrot's: the chart runs -mode echo, which takes no turns.
	"turn-detection": "the parrot's; the chart runs -mode echo, which takes no turns",
	"reply-delay":    "the parrot's; the chart runs -mode echo, which takes no turns",
}

// directorFlagsNotInChart are the `switchboard director` flags the chart
// does not set, each with why (TestDirectorFlagsInChart).
var directorFlagsNotInChart = map[string]string{
	"region-header": "only behind a CDN that sets a client-region header, which director.config's region_header then names",
	"log-format":    "the binary's default for servers is JSON, what a cluster's log pipeline reads",
	"pprof":         "profiles stay off in a fleet; extraEnv SWITCHBOARD_PPROF=true on one pod to profile it",
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

// TestAgentFlagsInChart is TestTransceiverFlagsInChart for the agent, whose
// -mode is an argument: each of its flags reaches the agent's pod or is
// listed in agentFlagsNotInChart with why.
func TestAgentFlagsInChart(t *testing.T) {
	checkFlagsInChart(t, "agent", agentFlagsNotInChart)
}

// TestDirectorFlagsInChart is TestTransceiverFlagsInChart for the
// director, which also reads the YAML file of its ConfigMap (-config):
// each of its flags reaches the director's pod, as a variable, an
// argument or a key of that file (default_region), or is listed in
// directorFlagsNotInChart with why.
func TestDirectorFlagsInChart(t *testing.T) {
	checkFlagsInChart(t, "director", directorFlagsNotInChart)
}

// checkFlagsInChart checks that every flag of `switchboard <cmd>` reaches
// the pod of component cmd in the default or the custom render (one of
// them must run it), as chartFlags finds, or is in notInChart with a
// reason, and that every name there is a flag of cmd that the chart does
// not set.
func checkFlagsInChart(t *testing.T, cmd string, notInChart map[string]string) {
	set := map[string]string{} // flag → how the chart sets it
	runs := false
	for _, vals := range []map[string]any{withPublicIP(nil), customValues()} {
		r, err := render(t, vals)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range r.workloads() {
			if w.tmpl.Labels["app.kubernetes.io/component"] == cmd {
				runs = true
				for name, how := range chartFlags(t, r, w, cmd) {
					set[name] = how
				}
			}
		}
	}
	if !runs {
		t.Fatalf("neither the default nor the custom render runs the %s", cmd)
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
		switch how, inChart := set[name]; {
		case !inChart && !listed:
			t.Errorf("-%s: the chart does not set %s; set it from the %s values, or list it as not in the chart with why", name, env, cmd)
		case inChart && listed:
			t.Errorf("-%s is set by the chart (%s) but listed as not in it", name, how)
		}
	}
}

// chartFlags returns the flags of `switchboard <cmd>` that the container
// of workload w sets, each with how: as its environment variable
// (config.CommandEnvName), as an argument, or as a key of the YAML file
// that -config names, read from the ConfigMap mounted there and decoded
// by config.Parse into cmd's own config, as the binary does.
func chartFlags(t *testing.T, r *rendered, w workload, cmd string) map[string]string {
	t.Helper()
	c := w.tmpl.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != cmd {
		t.Fatalf("%s: container %s runs %q, not switchboard %s", w.name, c.Name, c.Args, cmd)
	}
	set := map[string]string{}
	env := envMap(c)
	for name := range flagsOf(t, config.FlagSets(), cmd) {
		if e := config.CommandEnvName(cmd, name); env[e].Name != "" {
			set[name] = e
		}
	}
	fs := config.FlagSets()[cmd]
	if err := fs.Parse(c.Args[1:]); err != nil || fs.NArg() > 0 {
		t.Fatalf("%s: args %q: %v", w.name, c.Args, err)
	}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = "argument -" + f.Name })
	file := fs.Lookup("config").Value.String()
	if file == "" {
		return set
	}
	dst, fileFlags := commandConfigs[cmd]()
	copied := filepath.Join(t.TempDir(), path.Base(file))
	if err := os.WriteFile(copied, []byte(mountedFile(t, r, w, c, file)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := config.Parse(fileFlags, []string{"-config", copied}, dst); err != nil {
		t.Fatalf("%s: the chart's %s: %v", w.name, file, err)
	}
	fileFlags.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" && f.Value.String() != f.DefValue {
			set[f.Name] = "in " + file
		}
	})
	return set
}

// mountedFile returns the content of file in container c of workload w:
// a key of the ConfigMap whose volume is mounted at file's directory.
func mountedFile(t *testing.T, r *rendered, w workload, c corev1.Container, file string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path.Dir(file) {
			continue
		}
		for _, v := range w.tmpl.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && len(v.ConfigMap.Items) == 0 {
				data, ok := get[*corev1.ConfigMap](t, r, "ConfigMap", v.ConfigMap.Name).Data[path.Base(file)]
				if !ok {
					t.Fatalf("%s: ConfigMap %s has no key %s", w.name, v.ConfigMap.Name, path.Base(file))
				}
				return data
			}
		}
	}
	t.Fatalf("%s: no ConfigMap is mounted at %s for %s", w.name, path.Dir(file), file)
	return ""
}

// commandConfigs returns each server subcommand's config and its flag set
// bound to it, as cmd/switchboard builds them.
var commandConfigs = map[string]func() (any, *flag.FlagSet){
	"demo":        func() (any, *flag.FlagSet) { c := new(config.Demo); return c, c.Flags() },
	"relay":       func() (any, *flag.FlagSet) { c := new(config.Relay); return c, c.Flags() },
	"transceiver": func() (any, *flag.FlagSet) { c := new(config.Transceiver); return c, c.Flags() },
	"agent":       func() (any, *flag.FlagSet) { c := new(config.Agent); return c, c.Flags() },
	"director":    func() (any, *flag.FlagSet) { c := new(config.Director); return c, c.Flags() },
}
