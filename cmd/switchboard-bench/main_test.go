package main

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestHelpAndUsage: asking for help prints the usage on stdout and exits 0;
// no benchmark or an unknown one prints it on stderr and exits 2; a
// benchmark's -h prints its own usage on stderr and exits 0.
func TestHelpAndUsage(t *testing.T) {
	for _, tt := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"-h"}, 0, "Usage: switchboard-bench", ""},
		{[]string{"--help"}, 0, "Usage: switchboard-bench", ""},
		{[]string{"help"}, 0, "Usage: switchboard-bench", ""},
		{nil, 2, "", "Usage: switchboard-bench"},
		{[]string{"nosuch"}, 2, "", `unknown benchmark "nosuch"`},
		{[]string{"relay", "-h"}, 0, "", "Usage: switchboard-bench relay [flags]\n\nMeasures the relay against"},
		{[]string{"setup", "-h"}, 0, "", "Usage: switchboard-bench setup [flags]"},
		{[]string{"transceiver", "-h"}, 0, "", "Usage: switchboard-bench transceiver [flags]"},
		{[]string{"voice", "-h"}, 0, "", "Usage: switchboard-bench voice [flags]"},
	} {
		var stdout, stderr strings.Builder
		code := run(context.Background(), tt.args, &stdout, &stderr)
		if code != tt.code {
			t.Errorf("%q: exit %d, want %d", tt.args, code, tt.code)
		}
		if tt.stdout != "" && !strings.Contains(stdout.String(), tt.stdout) || tt.stdout == "" && stdout.Len() > 0 {
			t.Errorf("%q: stdout %q, want %q", tt.args, stdout.String(), tt.stdout)
		}
		if tt.stderr != "" && !strings.Contains(stderr.String(), tt.stderr) || tt.stderr == "" && stderr.Len() > 0 {
			t.Errorf("%q: stderr %q, want %q", tt.args, stderr.String(), tt.stderr)
		}
	}
}
