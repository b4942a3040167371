package chromium

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOptionsGrantTheFakeMicrophone: with these options Debian's Chromium
// starts headless, and a page on http://127.0.0.1 gets an audio track from
// getUserMedia without a prompt (the fake device, fed from the WAV file).
func TestOptionsGrantTheFakeMicrophone(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed; in CI it must be (scripts/deps.sh)")
		}
		t.Skip("chromium not installed")
	}
	wav, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "<!doctype html><title>mic</title>")
	}))
	defer page.Close()
	var out bytes.Buffer
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), Options(bin, wav, &out)...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 30*time.Second)
	defer cancelTimeout()
	if err := chromedp.Do(ctx, chromedp.Navigate(page.URL)); err != nil {
		t.Fatalf("chromium: %v\n%s", err, out.String())
	}
	tracks, err := chromedp.Run(ctx, chromedp.Evaluate[int](
		`navigator.mediaDevices.getUserMedia({audio: true}).then((s) => s.getAudioTracks().length)`,
		chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("getUserMedia: %v\n%s", err, out.String())
	}
	if tracks != 1 {
		t.Fatalf("%d audio tracks, want 1", tracks)
	}
}
