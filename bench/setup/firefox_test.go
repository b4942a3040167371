package setupbench

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/transceiver"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/firefox"
)

// TestFirefoxSmoke runs one call from headless Firefox ESR on direct and
// relay with the default DTLS role and a small RTT, and checks that the
// phases are sane (present, ordered, within physical bounds). It asserts
// no performance. Without Firefox, or without root for its network
// namespace, it is skipped, except in CI (CI set), where it fails.
func TestFirefoxSmoke(t *testing.T) {
	if _, err := firefox.Path(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("Firefox is not installed; CI is set, and in CI a missing tool is an error")
		}
		t.Skip(err)
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("Firefox needs a network namespace: run as root; CI is set")
		}
		t.Skip("Firefox needs a network namespace, which needs root")
	}
	const rtt = 10 * time.Millisecond
	opts := Options{RTT: rtt, Runs: 1, Paths: []string{PathDirect, PathRelay}, DTLSRoles: []string{RoleClient}, Client: ClientFirefox}
	if testing.Verbose() {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("%d results, want 2 (2 paths × 1 role)", len(res))
	}
	for _, r := range res {
		if !strings.HasPrefix(r.Client, "Firefox") {
			t.Errorf("%s/%s: client %q, want Firefox and its version", r.Path, r.DTLSRole, r.Client)
		}
		if r.Runs != 1 || r.Failures != 0 {
			t.Errorf("%s/%s: %d runs, %d failures: %v", r.Path, r.DTLSRole, r.Runs, r.Failures, r.Errors)
			continue
		}
		checkPhases(t, r, rtt)
	}
	md := Markdown(res, opts)
	v := transceiver.DefaultDTLSVersion
	for _, want := range []string{"| direct | client, " + v + " |", "| relay | client, " + v + " |", "Firefox", "From the answer"} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	t.Log("\n" + md)
}

// TestExpectedFirefox pins the round-trip model for Firefox.
func TestExpectedFirefox(t *testing.T) {
	if got, want := expectedFirefox(PathRelay, RoleClient), (Expected{0, 1, 2, 3, 3.5, 4}); got != want {
		t.Errorf("relay, role client: %+v, want %+v", got, want)
	}
	if _, err := (Options{Client: ClientFirefox, Loss: 1}).withDefaults(); !errors.Is(err, ErrOptions) {
		t.Errorf("loss 1: %v, want ErrOptions", err)
	}
}
