package voicebench

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// The turn-taking modes (issue 25): what the edge's early pause, false
// interruption resume and idle timeout do in a browser's call.
//
// ModeTentative plays the conversation script, a third of whose cycles'
// sentences have a pause of continueMs inside that the user goes on
// after (pausedFirsts): the agent answers
// the early pause (after Options.ReplyDelay, like a pipeline), the edge
// holds that reply until the turn ends, and a pause the user goes on
// after gets no reply heard (the agent cancels, or the edge discards).
//
// ModeResume plays the backchannel script: per cycle a sentence, a
// cough-like burst and a short backchannel over its reply (the reply
// should pause for each and resume, none of it lost), a quiet stretch
// past the idle timeout, a second sentence, a cough over its reply and
// then a real interruption (the reply should resume after the cough and
// be cleared by the interruption). Each pause of a reply is matched to
// the script utterance whose speech started it: the agent's
// input.speech_started positions, less the prefix padding, against the
// script's onsets, on the one offset that matches most of them (the
// microphone's file started before the call's input clock did).

// Defaults of Options.PauseMs and Options.IdleTimeout.
const (
	// DefaultPauseMs is the early pause of ModeTentative: 100 ms, so
	// that with a 500 ms silence window the backend has 400 ms more to
	// prepare its reply: a reply that needs up to 400 ms is ready at the
	// stop (the time saved is the smaller of the backend's latency and
	// the silence window less the pause: at 150 ms, 350; at 200 ms, 300).
	DefaultPauseMs = 100
	// DefaultIdleTimeout is ModeResume's idle_timeout_ms.
	DefaultIdleTimeout = 2 * time.Second
)

// The scripts, by the modes that play them.
const (
	scriptConversation = "conversation"
	scriptBackchannel  = "backchannel"
)

func scriptOf(mode string) string {
	if mode == ModeResume {
		return scriptBackchannel
	}
	return scriptConversation
}

// benchScript is a script the microphone plays, its file, and how long a
// mode listens to it.
type benchScript struct {
	name   string
	sc     *speech.Script
	ends   []int
	wav    string
	listen time.Duration
}

// Roles of the backchannel script's utterances.
const (
	roleTurn         = "turn"         // a sentence the agent answers
	roleBurst        = "burst"        // a cough or a backchannel over a reply: not a turn
	roleInterruption = "interruption" // a real interruption of a reply
)

// The backchannel script's bursts and timing, ms after the sentence's end
// (the reply, 2 s or more, starts 640 ms after it plus the reply delay).
var backchannels = []string{"Yeah.", "Uh huh.", "Right.", "Hmm."}

const (
	burstAfterMs = 1300 // the cough after a sentence's end
	burstGapMs   = 900  // from one burst's end to the next utterance: a stop and the prefix padding fit in it
	quietAfterMs = 8500 // from the first sentence's end to the second: the reply (paused twice) plays out, then the idle timeout
)

// backchannelScript builds ModeResume's file: len(firsts) cycles of
// sentence, cough, backchannel, quiet; sentence, cough, interruption,
// quiet. Utterance texts carry their role (roleOf).
func backchannelScript() (sc *speech.Script, ends []int, err error) {
	sc = &speech.Script{Rate: 48000}
	sc.Pause(leadMs)
	for i := range len(firsts) {
		steps := []func() error{
			func() error { return say(sc, firsts[i]) },
			func() error { sc.Pause(burstAfterMs); return sc.Cough(200) },
			func() error { sc.Pause(burstGapMs); return say(sc, backchannels[i%len(backchannels)]) },
			func() error {
				end := sc.Utterances[len(sc.Utterances)-3].EndMs
				sc.Pause(end + quietAfterMs - len(sc.Samples)*1000/sc.Rate)
				return say(sc, firsts[(i+2)%len(firsts)])
			},
			func() error { sc.Pause(burstAfterMs); return sc.Cough(200) },
			func() error { sc.Pause(burstGapMs); return say(sc, seconds[i%len(seconds)]) },
			func() error { sc.Pause(afterMs); return nil },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return nil, nil, err
			}
		}
		ends = append(ends, len(sc.Samples)*1000/sc.Rate)
	}
	return sc, ends, nil
}

// roleOf is the role of an utterance of either script.
func roleOf(u speech.Utterance) string {
	switch {
	case u.Text == "(cough)" || slices.Contains(backchannels, u.Text):
		return roleBurst
	case slices.Contains(seconds, u.Text):
		return roleInterruption
	}
	return roleTurn
}

// modeTurnDetection is the turn detection the parrot asks for in mode.
func modeTurnDetection(opts Options, mode string) vad.TurnDetection {
	td := vad.DefaultTurnDetection()
	switch mode {
	case ModeTentative:
		td.PauseDurationMs = opts.PauseMs
	case ModeResume:
		td.ResumeFalseInterruption = true
		td.IdleTimeoutMs = int(opts.IdleTimeout.Milliseconds())
	}
	return td
}

// TurnTaking is what a mode's turn-taking measured, pooled over its runs.
type TurnTaking struct {
	// RepliesInTurn counts the replies that started to play (the page's
	// output_audio_buffer.started) while a user turn was open (between
	// its speech_started and speech_stopped): a reply to a pause the user
	// went on after.
	RepliesInTurn int
	// HeldPlayed and HeldDiscarded are the transceiver's
	// held_replies_total; Resumed and Cleared its interruptions_total;
	// Timeouts its idle timeouts, Pauses its early pauses and Withdrawn
	// the speech that resumed after one (turn_events_total: in
	// ModeTentative, the tentative turns and those the user went on
	// after).
	HeldPlayed, HeldDiscarded, Resumed, Cleared, Timeouts, Pauses, Withdrawn float64
	// QuietFalse is (c) for the turns that let the reply resume (a cough,
	// a backchannel): the user's onset → the agent quiet in the page.
	QuietFalse []float64
	// Bursts are the reply pauses the script's coughs and backchannels
	// caused; BurstsResumed of them resumed. Interruptions are the
	// pauses its real interruptions caused, InterruptionsCleared of them
	// cleared.
	Bursts, BurstsResumed, Interruptions, InterruptionsCleared int
	// BurstReplies are the replies with a cough or backchannel over them;
	// ResumedReplies of them resumed after each; LostReplies were cut by
	// one (cleared, or played short of their length with only bursts
	// over them).
	BurstReplies, ResumedReplies, LostReplies int
	// Unmatched counts the reply pauses no script utterance's onset
	// explains (a detection far off, or noise).
	Unmatched int
	// IdleLateMs is, per idle timeout, when it reached the agent less
	// the moment the quiet stretch began (the reply's audio end, its
	// output.stopped less the run's grace, or the user's speech end)
	// less the timeout, ms.
	IdleLateMs []float64
}

func (t *TurnTaking) merge(o *TurnTaking) {
	t.RepliesInTurn += o.RepliesInTurn
	t.HeldPlayed += o.HeldPlayed
	t.HeldDiscarded += o.HeldDiscarded
	t.Resumed += o.Resumed
	t.Cleared += o.Cleared
	t.Timeouts += o.Timeouts
	t.Pauses += o.Pauses
	t.Withdrawn += o.Withdrawn
	t.QuietFalse = append(t.QuietFalse, o.QuietFalse...)
	t.Bursts += o.Bursts
	t.BurstsResumed += o.BurstsResumed
	t.Interruptions += o.Interruptions
	t.InterruptionsCleared += o.InterruptionsCleared
	t.BurstReplies += o.BurstReplies
	t.ResumedReplies += o.ResumedReplies
	t.LostReplies += o.LostReplies
	t.Unmatched += o.Unmatched
	t.IdleLateMs = append(t.IdleLateMs, o.IdleLateMs...)
}

// runGraceMs is the playout run's grace: output.stopped comes that long
// after the reply's audio ended (docs/bridge.md §6.2).
const runGraceMs = 200

// measure fills t from one run of mode: the page's events, the agent's
// trace and the transceiver's counters.
func (t *TurnTaking) measure(mode string, opts Options, sc *speech.Script, tr *tracer, talk *pageTalk, reg *prometheus.Registry) {
	t.RepliesInTurn = repliesInTurn(talk)
	t.HeldPlayed = counter(reg, "switchboard_transceiver_held_replies_total", "played")
	t.HeldDiscarded = counter(reg, "switchboard_transceiver_held_replies_total", "discarded")
	t.Resumed = counter(reg, "switchboard_transceiver_interruptions_total", "resumed")
	t.Cleared = counter(reg, "switchboard_transceiver_interruptions_total", "cleared")
	t.Timeouts = counter(reg, "switchboard_transceiver_turn_events_total", "timeout_triggered")
	t.Pauses = counter(reg, "switchboard_transceiver_turn_events_total", "speech_paused")
	t.Withdrawn = counter(reg, "switchboard_transceiver_turn_events_total", "speech_resumed")
	tr.mu.Lock()
	evs := slices.Clone(tr.events)
	tr.mu.Unlock()
	t.IdleLateMs = idleLate(evs, opts.IdleTimeout, vad.DefaultSilenceDurationMs)
	if mode == ModeResume {
		t.replies(evs, sc)
	}
}

// repliesInTurn counts the page's output_audio_buffer.started events that
// came while a user turn was open.
func repliesInTurn(talk *pageTalk) int {
	n, open := 0, false
	for _, ev := range talk.Events {
		switch ev.Type {
		case "input_audio_buffer.speech_started":
			open = true
		case "input_audio_buffer.speech_stopped":
			open = false
		case "output_audio_buffer.started":
			if open {
				n++
			}
		}
	}
	return n
}

// replyRec is one reply of the agent and what became of it.
type replyRec struct {
	lenMs    int64
	pauses   []string // the role of the utterance behind each pause
	outcomes []bool   // per pause: resumed (true) or cleared
	ended    bool
	cleared  bool
	playedMs int64
}

// replies follows each reply of the trace through its pauses, resumes,
// clear or stop, matching each pause to the script utterance that caused
// it, and counts what ModeResume measures.
func (t *TurnTaking) replies(evs []traceAt, sc *speech.Script) {
	roles := matchStarts(evs, sc)
	var recs []*replyRec
	current := func() *replyRec {
		for i := len(recs) - 1; i >= 0; i-- {
			if !recs[i].ended {
				return recs[i]
			}
		}
		return nil
	}
	role := ""
	starts := 0
	for _, e := range evs {
		switch e.kind {
		case agent.TraceSpeechStarted:
			role = roles[starts]
			starts++
		case agent.TraceReply:
			recs = append(recs, &replyRec{lenMs: e.ms})
		case agent.TraceOutputPaused:
			if r := current(); r != nil {
				r.pauses = append(r.pauses, role)
				r.outcomes = append(r.outcomes, false)
			}
		case agent.TraceOutputResumed:
			if r := current(); r != nil && len(r.outcomes) > 0 {
				r.outcomes[len(r.outcomes)-1] = true
			}
		case agent.TraceOutputCleared, agent.TraceOutputStopped:
			if r := current(); r != nil {
				r.ended, r.playedMs = true, e.ms
				r.cleared = e.kind == agent.TraceOutputCleared
			}
		}
	}
	for _, r := range recs {
		bursts, resumed := 0, 0
		for i, role := range r.pauses {
			switch role {
			case roleBurst:
				t.Bursts++
				bursts++
				if r.outcomes[i] {
					t.BurstsResumed++
					resumed++
				}
			case roleInterruption:
				t.Interruptions++
				if !r.outcomes[i] && r.cleared {
					t.InterruptionsCleared++
				}
			default:
				t.Unmatched++
			}
		}
		if bursts == 0 {
			continue
		}
		t.BurstReplies++
		if resumed == bursts {
			t.ResumedReplies++
		}
		onlyBursts := !slices.Contains(r.pauses, roleInterruption)
		// Played whole: at most a packet short of the reply's audio
		// (the parrot's reply ends in a partial frame, padded).
		if onlyBursts && r.ended && (r.cleared || r.playedMs < r.lenMs-20) {
			t.LostReplies++
		} else if !onlyBursts && resumed < bursts {
			t.LostReplies++ // cut by a burst before the interruption
		}
	}
}

// matchStarts returns the role of the script utterance behind each speech
// start of the trace: its onset (audio_ms plus the prefix padding) on the
// input clock, shifted by the offset that matches the most starts to an
// utterance's onset (within 250 ms, the script looping); "" for a start
// that matches none.
func matchStarts(evs []traceAt, sc *speech.Script) []string {
	var onsets []int64
	for _, e := range evs {
		if e.kind == agent.TraceSpeechStarted {
			onsets = append(onsets, e.ms+vad.DefaultPrefixPaddingMs)
		}
	}
	fileMs := int64(len(sc.Samples) * 1000 / sc.Rate)
	match := func(off int64) ([]string, int) {
		out := make([]string, len(onsets))
		n := 0
		for i, on := range onsets {
			pos := ((on+off)%fileMs + fileMs) % fileMs
			for _, u := range sc.Utterances {
				if d := pos - int64(u.StartMs); d > -250 && d < 250 {
					out[i] = roleOf(u)
					n++
					break
				}
			}
		}
		return out, n
	}
	var best []string
	bestN := -1
	for _, first := range onsets[:min(len(onsets), 3)] {
		for _, u := range sc.Utterances {
			if roles, n := match(int64(u.StartMs) - first); n > bestN {
				best, bestN = roles, n
			}
		}
	}
	return best
}

// idleLate returns, per idle timeout in the trace, how late it came after
// its quiet stretch began plus timeout, ms: the stretch began at the
// later of the last reply's audio end (output.stopped less the run's
// grace) and the last speech end (input.speech_stopped less the silence
// window) before it.
func idleLate(evs []traceAt, timeout time.Duration, silenceMs int) []float64 {
	var out []float64
	var began time.Time
	for _, e := range evs {
		var at time.Time
		switch e.kind {
		case agent.TraceOutputStopped:
			at = e.at.Add(-runGraceMs * time.Millisecond)
		case agent.TraceSpeechStopped:
			at = e.at.Add(-time.Duration(silenceMs) * time.Millisecond)
		case agent.TraceTimeout:
			if !began.IsZero() {
				out = append(out, float64(e.at.Sub(began)-timeout)/float64(time.Millisecond))
			}
			began = time.Time{}
			continue
		default:
			continue
		}
		if at.After(began) {
			began = at
		}
	}
	return out
}

// counter returns the value of counter name{…=label} in reg, 0 if none.
func counter(reg *prometheus.Registry, name, label string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// markdownTurnTaking writes the turn-taking table: a row per mode that
// ran ModeTentative or ModeResume, beside ModeEdge's (b) at the same
// ptime.
func (r *Result) markdownTurnTaking(w io.Writer) {
	var rows []Mode
	for _, m := range r.Modes {
		if m.Name == ModeTentative || m.Name == ModeResume {
			rows = append(rows, m)
		}
	}
	if len(rows) == 0 {
		return
	}
	cell := func(xs []float64) string {
		if len(xs) == 0 {
			return "–"
		}
		m, p := Stats(xs)
		return fmt.Sprintf("%.0f / %.0f (n=%d)", m, p, len(xs))
	}
	ratio := func(a, b int) string {
		if b == 0 {
			return "–"
		}
		return fmt.Sprintf("%d / %d (%.0f %%)", a, b, 100*float64(a)/float64(b))
	}
	fmt.Fprintf(w, "\nTurn-taking at the edge (issue 25); the parrot answers %v after the turn event; early pause %d ms (tentative), idle timeout %v (resume):\n\n",
		r.Opts.ReplyDelay, r.Opts.PauseMs, r.Opts.IdleTimeout)
	fmt.Fprintln(w, "| mode | (b) speech end → reply heard, ms | (b) of edge at the same ptime, ms | early pauses / the user went on | replies started in a user's turn | held replies played / discarded | bursts resumed | replies with bursts over them that resumed | replies lost | (c) real interruptions, ms | (c) bursts, ms | idle timeout late by, ms |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, m := range rows {
		var edge []float64
		for _, e := range r.Modes {
			if e.Name == ModeEdge && e.Ptime == m.Ptime {
				edge = e.Reply
			}
		}
		tt := m.TurnTaking
		fmt.Fprintf(w, "| %s%s | %s | %s | %.0f / %.0f | %d | %.0f / %.0f | %s | %s | %d | %s | %s | %s |\n", m.Name, r.ptimeNote(m), cell(m.Reply), cell(edge),
			tt.Pauses, tt.Withdrawn, tt.RepliesInTurn, tt.HeldPlayed, tt.HeldDiscarded, ratio(tt.BurstsResumed, tt.Bursts), ratio(tt.ResumedReplies, tt.BurstReplies),
			tt.LostReplies, cell(m.Quiet), cell(tt.QuietFalse), cell(tt.IdleLateMs))
	}
	for _, m := range rows {
		if tt := m.TurnTaking; tt.Interruptions > 0 || tt.Unmatched > 0 || tt.Timeouts > 0 {
			fmt.Fprintf(w, "\n%s%s: real interruptions cleared %s; reply pauses matched to no script utterance %d; the edge's counters: interruptions resumed %.0f, cleared %.0f, idle timeouts %.0f.\n",
				m.Name, r.ptimeNote(m), ratio(tt.InterruptionsCleared, tt.Interruptions), tt.Unmatched, tt.Resumed, tt.Cleared, tt.Timeouts)
		}
	}
}
