package relaybench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const serveEnv = "SWITCHBOARD_BENCH_SERVE"

// TestMain lets the test binary double as `switchboard-bench serve`: the
// harness re-executes it with serveEnv set to run a system under test.
func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		if err := Serve(context.Background(), os.Args[1:], os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestSmoke runs the whole harness for a couple of seconds with small load
// and checks that it produces a table row for each system. It measures
// nothing: timing assertions have no place in unit tests.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes and runs load for seconds")
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("taskset not installed")
	}
	opt := Defaults(true)
	opt.Systems = []string{"raw", "raw-nolock", "relay", "relay-nobatch", "naive"}
	if _, err := exec.LookPath("turnserver"); err == nil {
		opt.Systems = append(opt.Systems, "coturn")
	}
	opt.Sessions, opt.PPS = 100, 50
	opt.Step, opt.Ramp, opt.MaxRate = 150*time.Millisecond, 100*time.Millisecond, 40_000
	opt.Serve = func(args []string) *exec.Cmd {
		c := exec.Command(os.Args[0], args...)
		c.Env = append(os.Environ(), serveEnv+"=1")
		return c
	}
	var out bytes.Buffer
	if err := Run(context.Background(), opt, &out); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, sys := range opt.Systems {
		name := systemNames[sys]
		var row string
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, "| "+name+" |") {
				row = l
				break
			}
		}
		if row == "" || strings.Contains(row, "not run") {
			t.Errorf("%s: no result row in\n%s", name, out.String())
		}
	}
}
