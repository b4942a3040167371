package e2e

import (
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/demo"
	speechgen "github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// TestBrowserTurnTaking: Chromium calls the demo with a parrot that asks
// for the edge's turn-taking (an early pause, false interruptions that
// resume, an idle timeout) and answers like a pipeline, 300 ms after the
// turn event. Its fake microphone says a sentence, coughs over the reply,
// then stays quiet. The page gets the reply (prepared at the early pause,
// played at the stop), Switchboard's output_audio_buffer.paused and
// .resumed for the cough, the reply's stop with nothing cleared, and
// OpenAI's input_audio_buffer.timeout_triggered; its conversation view
// says the agent went on and that nobody spoke.
func TestBrowserTurnTaking(t *testing.T) {
	chromium := chromiumPath(t)
	speechgen.Require(t)
	sc := &speechgen.Script{Rate: 48000}
	sc.Pause(800)
	if err := sc.Say("The quick brown fox jumps over the lazy dog, twice."); err != nil {
		t.Fatal(err)
	}
	sc.Pause(1500) // the reply starts about 800 ms into this
	if err := sc.Cough(200); err != nil {
		t.Fatal(err)
	}
	sc.Pause(9000) // the reply plays out; then 3 s of quiet is an idle timeout
	wav := filepath.Join(t.TempDir(), "turntaking.wav")
	if err := sc.WriteWAV(wav); err != nil {
		t.Fatal(err)
	}
	td := vad.DefaultTurnDetection()
	td.PauseDurationMs, td.ResumeFalseInterruption, td.IdleTimeoutMs = 200, true, 3000
	d := startTestDemo(t, demo.Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0",
		Parrot: agent.ParrotOptions{TurnDetection: &td, ReplyDelay: 300 * time.Millisecond}}, slog.LevelInfo, nil)
	ctx := startBrowser(t, chromium, wav)
	if err := chromedp.Do(ctx, chromedp.Navigate(d.URL()+"/")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`void window.switchboard.call()`)); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "peer connection connected", 20*time.Second, func(s pageState) bool { return s.State == "connected" })
	want := []string{
		"input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "output_audio_buffer.started",
		"input_audio_buffer.speech_started", "switchboard.output_audio_buffer.paused", "switchboard.output_audio_buffer.resumed",
		"input_audio_buffer.speech_stopped", "output_audio_buffer.stopped", "input_audio_buffer.timeout_triggered",
	}
	s := waitPage(t, ctx, "the reply, the cough over it, and the idle timeout", 30*time.Second, func(s pageState) bool {
		return len(s.Talk.eventTypes()) >= len(want)
	})
	if got := s.Talk.eventTypes()[:len(want)]; !slices.Equal(got, want) {
		t.Fatalf("page events %q, want %q", got, want)
	}
	if s.Talk.Turns[0].ReplyMs == nil {
		t.Error("the page never heard the reply")
	}
	view, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#conversation li")].map((li) => li.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("conversation view: %q", view)
	text := strings.Join(view, "\n")
	for _, frag := range []string{"it paused, and went on", "nobody spoke for 3.0 s: the agent was told (idle timeout)", "Agent"} {
		if !strings.Contains(text, frag) {
			t.Errorf("conversation view %q: no %q", view, frag)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.hangup()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("hangup(): %v", err)
	}
	waitSessions(t, d, 0, "after hangup")
}
