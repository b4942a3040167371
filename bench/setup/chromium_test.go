package setupbench

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"
)

// TestChromiumSmoke runs one call from headless Chromium through the relay
// per DTLS role and version, and one from Chromium with
// WebRTC-IceHandshakeDtls (SPED), with a small RTT, and checks that the
// phases are sane (present, ordered, within physical bounds). It asserts
// no performance.
// Without chromium it is skipped, except in CI (CI set), where it fails.
func TestChromiumSmoke(t *testing.T) {
	if _, err := chromiumPath(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed; CI is set, and in CI a missing tool is an error")
		}
		t.Skip("chromium is not installed (Debian: apt-get install chromium)")
	}
	const rtt = 10 * time.Millisecond
	opts := Options{RTT: rtt, Runs: 1, Paths: []string{PathRelay}, Clients: []string{ClientChromium, ClientChromiumSPED}, DTLSVersions: []string{"1.2", "1.3"}}
	if testing.Verbose() {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 5 {
		t.Fatalf("%d results, want 5 (2 roles × 2 versions, and SPED)", len(res))
	}
	for _, r := range res {
		if !strings.HasPrefix(r.Client, "Chromium") {
			t.Errorf("%s/%s: client %q, want Chromium and its version", r.Path, r.DTLSRole, r.Client)
		}
		if r.Runs != 1 || r.Failures != 0 {
			t.Errorf("%s/%s: %d runs, %d failures: %v", r.Path, r.DTLSRole, r.Runs, r.Failures, r.Errors)
			continue
		}
		checkPhases(t, r, rtt)
	}
	md := Markdown(res, opts)
	for _, want := range []string{"| relay | client, 1.2 |", "| relay | server, 1.3 |", "| relay | SPED (server, 1.3) |", "with WebRTC-IceHandshakeDtls"} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	t.Log("\n" + md)
}

// TestExpectedChromium pins the round-trip model for Chromium.
func TestExpectedChromium(t *testing.T) {
	if got, want := expectedChromium(PathDirect, RoleClient), (Expected{0, 1, 2, 3, 3.5, 4}); got != want {
		t.Errorf("direct, role client: %+v, want %+v", got, want)
	}
	if got, want := expectedChromium(PathDirect, RoleServer), (Expected{0, 1, 2, 4, 4.5, 5}); got != want {
		t.Errorf("direct, role server: %+v, want %+v", got, want)
	}
	if got, want := expectedChromium(PathTURN, RoleServer), (Expected{2, 1, 2, 4, 4.5, 5}); got != want {
		t.Errorf("turn: %+v, want %+v", got, want)
	}
	if got, want := expectedFor(ClientChromium, PathRelay, RoleServer, "1.3", false), (Expected{0, 1, 2, 3, 3.5, 4}); got != want {
		t.Errorf("relay, role server, DTLS 1.3: %+v, want %+v", got, want)
	}
	if got, want := expectedFor(ClientChromiumSPEDNoPQ, PathRelay, RoleServer, "1.3", false), (Expected{0, 1, 2, 2, 2.5, 3}); got != want {
		t.Errorf("relay, SPED: %+v, want %+v", got, want)
	}
	if got, want := expectedFor(ClientChromiumSPED, PathRelay, RoleServer, "1.3", false), (Expected{0, 1, 2, 3, 3.5, 4}); got != want {
		t.Errorf("relay, SPED with a ClientHello of two datagrams: %+v, want %+v", got, want)
	}
	if _, err := (Options{Client: "lynx"}).withDefaults(); !errors.Is(err, ErrOptions) {
		t.Errorf("client lynx: %v, want ErrOptions", err)
	}
}
