package e2e

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// TestSplitDeploymentPage runs the parts apart, as README's "Running the
// parts apart" does (the built binary's agent, transceiver and relay, each
// a process), and calls from the page the transceiver serves at "/": it
// answered 404, so that no browser could be used without hosting the page
// elsewhere. The transceiver does not know its agent (the parrot here):
// the page learns from its first ping, which the parrot answers with an
// error event, that nothing will echo, and says so with Ping disabled.
func TestSplitDeploymentPage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	chromium := chromiumPath(t)
	wav := conversationScript(t)
	bin := filepath.Join(t.TempDir(), "switchboard")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/switchboard-rtc/switchboard/cmd/switchboard").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	freeTCP := func() string {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	freeUDP := func() string {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().String()
	}
	agentHTTP, trxHTTP, hop, public, internal := freeTCP(), freeTCP(), freeUDP(), freeUDP(), freeUDP()
	env := append(os.Environ(), "SWITCHBOARD_TOKEN_KEY=c3BsaXQtZGVwbG95bWVudC10ZXN0LWtleS0zMi1ieXRlcw==", "SWITCHBOARD_LOG_FORMAT=text")
	var logs []*logbuf.Buffer
	start := func(args ...string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out := &logbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		logs = append(logs, out)
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				t.Logf("%s:\n%s", args[0], out.String())
			}
		})
	}
	start("agent", "-listen", agentHTTP)
	start("transceiver", "-id", "1", "-listen", hop, "-advertise", public, "-backend", "ws://"+agentHTTP+"/v1/bridge",
		"-http", trxHTTP, "-drain-timeout", "1s")
	start("relay", "-public", public, "-internal", internal, "-members", "1="+hop, "-metrics", "")
	page := "http://" + trxHTTP + "/"
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(page)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
				t.Fatalf("GET %s: %s %q, want the page", page, resp.Status, resp.Header.Get("Content-Type"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the transceiver never served %s: %v", page, err)
		}
	}

	ctx, console := startBrowserConsole(t, chromium, wav)
	if err := chromedp.Do(ctx, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	if s := readShown(t, ctx); s.Agent != "" || s.Echo != "–" {
		t.Errorf("before the call: agent %q, echo row %q; want an agent the page does not know, nothing said of its echo yet", s.Agent, s.Echo)
	}
	if err := chromedp.Do(ctx, chromedp.Click("#call")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "connected through the separate relay and transceiver", 20*time.Second, func(s pageState) bool { return s.State == "connected" })
	s := waitShown(t, ctx, "that this agent does not echo", func(s shown) bool { return strings.Contains(s.Echo, "does not echo") })
	if !s.PingDisabled || !strings.Contains(s.Echo, "it answered: the parrot agent does not act on client events") {
		t.Errorf("after the parrot refused the ping: Ping disabled %v, echo row %q", s.PingDisabled, s.Echo)
	}
	// And the conversation goes on: the parrot answers a turn.
	waitPage(t, ctx, "the parrot's answer heard", 30*time.Second, func(s pageState) bool {
		return len(s.Talk.Turns) > 0 && s.Talk.Turns[0].ReplyMs != nil
	})
	if path := os.Getenv(screenshotEnv); path != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err == nil {
			err = os.WriteFile(strings.TrimSuffix(path, ".png")+"-split.png", png, 0o644)
		}
		if err != nil {
			t.Errorf("screenshot: %v", err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.hangup()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatal(err)
	}
	for _, m := range console() {
		if strings.Contains(m, "Content Security Policy") {
			t.Errorf("CSP violation: %s", m)
		}
	}
}
