package voicebench

import (
	"encoding/binary"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

func requireSpeechTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"espeak-ng", "sox"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; in CI it must be", tool)
			}
			t.Skipf("%s not installed", tool)
		}
	}
}

// TestBackchannelScript checks ModeResume's script offline, as the
// transceiver's detector hears it through Opus (20 ms packets, 24 kHz):
// every utterance is one turn of the detector, started within 250 ms of
// its onset (what matchStarts allows), and its voiced speech puts the
// coughs and backchannels under the default min_interruption_ms and the
// sentences and interruptions over it.
func TestBackchannelScript(t *testing.T) {
	requireSpeechTools(t)
	sc, ends, err := backchannelScript()
	if err != nil {
		t.Fatal(err)
	}
	if len(ends) != len(firsts) || len(sc.Utterances) != 6*len(firsts) {
		t.Fatalf("%d cycles, %d utterances", len(ends), len(sc.Utterances))
	}
	enc, err := audio.NewEncoderConfig(audio.EncoderConfig{Rate: 48000, Bitrate: 32000, FrameMs: 20})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := audio.NewDecoder(vad.Rate24k)
	if err != nil {
		t.Fatal(err)
	}
	det, err := vad.NewDetector(vad.DefaultTurnDetection(), vad.Rate24k, vad.Frame20ms)
	if err != nil {
		t.Fatal(err)
	}
	defer det.Close()
	pcm := make([]byte, 2*len(sc.Samples))
	for i, v := range sc.Samples {
		binary.LittleEndian.PutUint16(pcm[2*i:], uint16(v))
	}
	type turn struct{ onset, voiced int64 }
	var turns []turn
	seq, ts := uint16(0), uint32(0)
	for off := 0; off+1920 <= len(pcm); off += 1920 {
		pkts, err := enc.Write(pcm[off : off+1920])
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkts {
			for _, f := range dec.Push(seq, ts, p.Payload) {
				ev, err := det.Process(f.PCM)
				if err != nil {
					t.Fatal(err)
				}
				if ev.Kind == vad.SpeechStarted {
					turns = append(turns, turn{onset: ev.SpeechMs})
				}
				if n := len(turns); n > 0 {
					turns[n-1].voiced = max(turns[n-1].voiced, det.VoicedMs())
				}
			}
			seq++
			ts += 960
		}
	}
	if len(turns) != len(sc.Utterances) {
		t.Fatalf("%d turns for %d utterances: %+v", len(turns), len(sc.Utterances), turns)
	}
	for i, u := range sc.Utterances {
		tu := turns[i]
		burst := roleOf(u) == roleBurst
		t.Logf("%-36q %-12s onset %+4d ms, voiced %4d ms", u.Text, roleOf(u), tu.onset-int64(u.StartMs), tu.voiced)
		if d := tu.onset - int64(u.StartMs); d <= -250 || d >= 250 {
			t.Errorf("%q: detected onset %d ms off", u.Text, d)
		}
		if burst != (tu.voiced < vad.DefaultMinInterruptionMs) {
			t.Errorf("%q (%s): %d ms voiced", u.Text, roleOf(u), tu.voiced)
		}
	}
}

// TestResumeAccounting follows a synthetic trace of ModeResume's first
// cycle, offset on the input clock: each reply pause is matched to the
// script utterance that caused it, the first reply (a cough and a
// backchannel over it, both resumed, played whole) and the second (a
// cough resumed, then the interruption's clear) count as resumed and
// not lost; a third with a burst that cleared it counts as lost.
func TestResumeAccounting(t *testing.T) {
	requireSpeechTools(t)
	sc, _, err := backchannelScript()
	if err != nil {
		t.Fatal(err)
	}
	const offset = 437 // the input clock starts this far into the file
	t0 := time.Now()
	var evs []traceAt
	add := func(kind agent.TraceKind, ms int64) {
		evs = append(evs, traceAt{kind, ms, t0.Add(time.Duration(len(evs)) * time.Millisecond)})
	}
	start := func(i int) { // the i-th utterance's speech start, padded
		add(agent.TraceSpeechStarted, int64(sc.Utterances[i].StartMs)-offset+40-vad.DefaultPrefixPaddingMs)
	}
	start(0)
	add(agent.TraceReply, 2000)
	add(agent.TraceOutputStarted, 0)
	start(1) // cough
	add(agent.TraceOutputPaused, 300)
	add(agent.TraceOutputResumed, 300)
	start(2) // backchannel
	add(agent.TraceOutputPaused, 900)
	add(agent.TraceOutputResumed, 900)
	add(agent.TraceOutputStopped, 2000)
	start(3)
	add(agent.TraceReply, 1800)
	start(4) // cough
	add(agent.TraceOutputPaused, 200)
	add(agent.TraceOutputResumed, 200)
	start(5) // interruption
	add(agent.TraceOutputPaused, 700)
	add(agent.TraceOutputCleared, 700)
	add(agent.TraceReply, 900)
	start(7) // the next cycle's cough, over this reply: cut it
	add(agent.TraceOutputPaused, 100)
	add(agent.TraceOutputCleared, 100)
	var tt TurnTaking
	tt.replies(evs, sc)
	want := TurnTaking{Bursts: 4, BurstsResumed: 3, Interruptions: 1, InterruptionsCleared: 1, BurstReplies: 3, ResumedReplies: 2, LostReplies: 1}
	if tt.Bursts != want.Bursts || tt.BurstsResumed != want.BurstsResumed || tt.Interruptions != want.Interruptions ||
		tt.InterruptionsCleared != want.InterruptionsCleared || tt.BurstReplies != want.BurstReplies ||
		tt.ResumedReplies != want.ResumedReplies || tt.LostReplies != want.LostReplies || tt.Unmatched != 0 {
		t.Fatalf("accounting %+v, want %+v", tt, want)
	}
	// The idle timeout: 2 s after the first reply's audio end (its
	// output.stopped less the grace), 30 ms late.
	stopped := t0.Add(10 * time.Second)
	late := idleLate([]traceAt{{agent.TraceSpeechStopped, 0, stopped.Add(-3 * time.Second)}, {agent.TraceOutputStopped, 2000, stopped},
		{agent.TraceTimeout, 0, stopped.Add(-runGraceMs*time.Millisecond + 2*time.Second + 30*time.Millisecond)}}, 2*time.Second, 500)
	if len(late) != 1 || late[0] < 29.9 || late[0] > 30.1 {
		t.Fatalf("idle late %v ms, want [30]", late)
	}
}
