package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
)

// readmeBuildLine is the first line of README.md's "Running the parts
// apart", which TestReadmePartsApart runs as the build it did itself.
const readmeBuildLine = "go build -o switchboard ./cmd/switchboard"

// TestReadmePartsApart runs README.md's "Running the parts apart" as
// printed: its shell blocks, one after the other in one bash, as a
// newcomer pastes them into one shell (the agent, transceiver and relay
// in the background, a call with an ICE restart, then the transceiver
// restarted with authentication, a client token minted with curl and jq,
// and a call with it). Two things are the test's: the binary it built
// stands in for the block's `go build` line, with testdata/speech.wav
// beside it, and the shell runs in a network namespace of its own, since
// the README's fixed ports (8080, 3478, …) would meet other tests and
// anything else running on this machine.
func TestReadmePartsApart(t *testing.T) {
	bin := testBinary(t)
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root (a network namespace for the README's fixed ports)"
	}
	for _, tool := range []string{"ip", "bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil && why == "" {
			why = "needs " + tool + " (scripts/deps.sh)"
		}
	}
	if why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s, and CI is set", why)
		}
		t.Skip(why)
	}
	script := readmeShell(t, "Running the parts apart")
	first, rest, _ := strings.Cut(script, "\n")
	if first != readmeBuildLine {
		t.Fatalf("README's \"Running the parts apart\" starts with %q; the test runs it with its own build of %q in its place: update readmeBuildLine", first, readmeBuildLine)
	}

	dir := t.TempDir()
	copyFile(t, bin, filepath.Join(dir, "switchboard"), 0o755)
	if err := os.Mkdir(filepath.Join(dir, "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join("..", "..", "testdata", "speech.wav"), filepath.Join(dir, "testdata", "speech.wav"), 0o644)

	ns := "sbreadme" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// The shell's background parts, if it was cut short.
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill()
				}
			}
		}
		_ = exec.Command("ip", "netns", "del", ns).Run()
	})
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// The README's own way to stop the parts it leaves running.
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "bash", "-c", rest+"\nkill $(jobs -p)\nwait\n")
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SWITCHBOARD_") { // a newcomer's shell has none
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("the README's commands did not finish in 2 minutes: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}

	// Each `switchboard call` prints its report on stdout; the parts log
	// on stderr.
	var reports []callclient.Report
	dec := json.NewDecoder(strings.NewReader(stdout.String()))
	for {
		var r callclient.Report
		if err := dec.Decode(&r); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("stdout is not the calls' JSON reports: %v\n%s", err, stdout.String())
		}
		reports = append(reports, r)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nstdout:\n%s\nstderr:\n%s", append(args, stdout.String(), stderr.String())...)
	}
	if len(reports) != 2 {
		fail("%d call reports, want 2 (the call, then the call with a client token)", len(reports))
	}
	for i, r := range reports {
		if !r.AudioEchoed || !r.DataChannelEchoed || r.Error != "" {
			fail("call %d: audio echoed %v, data channel echoed %v, error %q", i+1, r.AudioEchoed, r.DataChannelEchoed, r.Error)
		}
	}
	if r := reports[0].ICERestart; r == nil || r.Error != "" {
		fail("the first call's ice_restart: %+v, want a restart that resumed", r)
	}
	if strings.Contains(stderr.String(), "switchboard call:") {
		fail("a call failed")
	}
}

// readmeShell returns the ```sh blocks of README.md's section titled
// title, joined, as a reader pastes them one after the other.
func readmeShell(t *testing.T, title string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", title)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	for _, part := range strings.Split(section, "```sh\n")[1:] {
		block, _, ok := strings.Cut(part, "```")
		if !ok {
			t.Fatalf("README.md %q: a ```sh block is never closed", title)
		}
		blocks = append(blocks, block)
	}
	if len(blocks) == 0 {
		t.Fatalf("README.md %q has no ```sh block", title)
	}
	return strings.Join(blocks, "")
}

// copyFile copies the file from to a new file to with mode perm.
func copyFile(t *testing.T, from, to string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, perm); err != nil {
		t.Fatal(fmt.Errorf("copy %s: %w", from, err))
	}
}
