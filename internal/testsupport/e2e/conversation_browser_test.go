package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/demo"

	"github.com/chromedp/chromedp"

	speechgen "github.com/switchboard-rtc/switchboard/internal/testsupport/speech"

	"log/slog"
)

// talkState is the page's conversation state (window.switchboard.talk).
type talkState struct {
	YouDb    float64 `json:"youDb"`
	AgentDb  float64 `json:"agentDb"`
	Speaking string  `json:"speaking"`
	Turns    []struct {
		N            int      `json:"n"`
		ReplyMs      *float64 `json:"replyMs"`
		Interrupted  bool     `json:"interrupted"`
		QuietMs      *float64 `json:"quietMs"`
		AudioStartMs int64    `json:"audioStartMs"`
		AudioEndMs   *int64   `json:"audioEndMs"`
	} `json:"turns"`
	Events []struct {
		Type string  `json:"type"`
		At   float64 `json:"at"`
	} `json:"events"`
}

func (t talkState) eventTypes() []string {
	var out []string
	for _, e := range t.Events {
		out = append(out, e.Type)
	}
	return out
}

// conversationScript is the fake microphone of the conversation tests: a
// long first utterance, a pause in which the parrot starts replying, a
// second utterance over the reply, and a pause long enough for the second
// reply to play out (Chromium loops the file).
func conversationScript(t *testing.T) string {
	t.Helper()
	speechgen.Require(t)
	sc, err := speechgen.NewScript(48000, 800, 0,
		"The quick brown fox jumps over the lazy dog, twice.")
	if err != nil {
		t.Fatal(err)
	}
	over, err := speechgen.NewScript(48000, 1500, 4000, "Hold on, stop there.")
	if err != nil {
		t.Fatal(err)
	}
	sc.Samples = append(sc.Samples, over.Samples...)
	wav := filepath.Join(t.TempDir(), "conversation.wav")
	if err := sc.WriteWAV(wav); err != nil {
		t.Fatal(err)
	}
	return wav
}

// TestBrowserConversation: Chromium calls the demo (the parrot agent by
// default) with a fake microphone that speaks, pauses, and speaks over the
// reply. The page gets OpenAI's input_audio_buffer.speech_started and
// .speech_stopped, output_audio_buffer.started with reply audio it can
// hear (its own level meter on the agent's stream), and
// output_audio_buffer.cleared when the second utterance cuts the reply.
func TestBrowserConversation(t *testing.T) {
	chromium := chromiumPath(t)
	wav := conversationScript(t)
	d := startTestDemo(t, demo.Config{HTTPAddr: "127.0.0.1:0", RelayAddr: "127.0.0.1:0"}, slog.LevelInfo, nil)
	ctx := startBrowser(t, chromium, wav)
	if err := chromedp.Do(ctx, chromedp.Navigate(d.URL()+"/")); err != nil {
		t.Fatal(err)
	}
	// The demo tells the page its agent is the parrot, which drops the
	// client's data-channel messages: no Ping, and the echo row says why.
	if s := readShown(t, ctx); s.Agent != "parrot" || !s.PingDisabled || !strings.Contains(s.Echo, "-mode echo") {
		t.Errorf("parrot page: agent %q, Ping disabled %v, data-channel echo row %q; want parrot, true, a note naming -mode echo", s.Agent, s.PingDisabled, s.Echo)
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`void window.switchboard.call()`)); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "peer connection connected", 20*time.Second, func(s pageState) bool { return s.State == "connected" })
	if s := readShown(t, ctx); !s.PingDisabled || !strings.Contains(s.Echo, "-mode echo") {
		t.Errorf("connected parrot page: Ping disabled %v, data-channel echo row %q", s.PingDisabled, s.Echo)
	}
	want := []string{
		"input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "output_audio_buffer.started",
		"input_audio_buffer.speech_started", "output_audio_buffer.cleared",
	}
	s := waitPage(t, ctx, "speech, reply, and the reply cut by the next utterance", 30*time.Second, func(s pageState) bool {
		got := s.Talk.eventTypes()
		return len(got) >= len(want) && slices.Equal(got[:len(want)], want)
	})
	// The reply must have been heard before it was cut.
	s = waitPage(t, ctx, "the interruption settled", 5*time.Second, func(s pageState) bool {
		return len(s.Talk.Turns) >= 2 && s.Talk.Turns[1].QuietMs != nil
	})
	first, second := s.Talk.Turns[0], s.Talk.Turns[1]
	t.Logf("turn 1: audio %d–%v ms, end of speech → agent's first audio %v ms", first.AudioStartMs, deref(first.AudioEndMs), deref(first.ReplyMs))
	t.Logf("turn 2: interrupted %v, onset → agent quiet %v ms; events %q", second.Interrupted, deref(second.QuietMs), s.Talk.eventTypes())
	if first.ReplyMs == nil {
		t.Error("the page never heard the agent's reply (its level stayed under the voice threshold)")
	}
	if !second.Interrupted {
		t.Error("the page did not hear the agent when the second utterance began: nothing was interrupted")
	}
	if s.Stats.TotalAudioEnergy <= 0 {
		t.Errorf("inbound-rtp totalAudioEnergy = %v: no audible reply", s.Stats.TotalAudioEnergy)
	}
	// The conversation view says who spoke when: you, the agent's answer
	// and how long after your speech, and the turn that cut it off.
	view, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#conversation li")].map((li) => li.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("conversation view: %q", view)
	if len(view) < 3 || !strings.HasPrefix(view[0], "You0:") || !strings.Contains(view[0], "spoke: a turn of ") ||
		!strings.HasPrefix(view[1], "Agent0:") || !strings.Contains(view[1], "ms after you stopped (with the half second of silence that ends your turn)") ||
		!strings.Contains(view[2], "over the agent: it went quiet ") {
		t.Errorf("conversation view %q: want your turn, the agent's answer with its delay, and your turn over it", view)
	}
	if path := os.Getenv(screenshotEnv); path != "" {
		// Let the second reply start, so the picture shows a live turn.
		time.Sleep(2 * time.Second)
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err == nil {
			err = os.WriteFile(path, png, 0o644)
		}
		if err != nil {
			t.Errorf("screenshot: %v", err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.switchboard.hangup()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("hangup(): %v", err)
	}
	waitSessions(t, d, 0, "after hangup")
	checkHungUp(t, ctx)
}
