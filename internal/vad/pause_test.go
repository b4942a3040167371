package vad

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
)

// scriptPCM returns sc's samples as PCM16 little-endian.
func scriptPCM(sc *speech.Script) []byte {
	pcm := make([]byte, 2*len(sc.Samples))
	for i, v := range sc.Samples {
		binary.LittleEndian.PutUint16(pcm[2*i:], uint16(v))
	}
	return pcm
}

// TestPauseAndResume: with pause_duration_ms, an utterance with a pause
// shorter than the silence window (the user goes on) gives SpeechPaused
// then SpeechResumed where the speech goes on; its end gives SpeechPaused
// then SpeechStopped, the pause pause_duration_ms after the speech end
// and the stop the rest of the silence window after it, from the same
// speech end. The starts and stops are exactly those of the same audio
// without the early pause. At both rates and frame lengths.
func TestPauseAndResume(t *testing.T) {
	speech.Require(t)
	for _, rate := range []int{Rate16k, Rate24k} {
		sc := &speech.Script{Rate: rate}
		sc.Pause(600)
		for _, step := range []func() error{
			func() error { return sc.Say("I would like to book a table") },
			func() error { sc.Pause(350); return nil }, // the user goes on: a pause, not a stop
			func() error { return sc.Say("for two at seven tonight.") },
			func() error { sc.Pause(900); return nil },
			func() error { return sc.Say("Thanks.") },
			func() error { sc.Pause(900); return nil },
		} {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
		pcm := scriptPCM(sc)
		for _, fm := range frameLengths {
			t.Run(fmt.Sprintf("%d/%d", rate, fm), func(t *testing.T) {
				td := DefaultTurnDetection()
				td.PauseDurationMs = 195 // rounded up to 200 (20 or 10 ms frames)
				const pause, silence = 200, DefaultSilenceDurationMs
				with := detect(t, td, rate, fm, pcm)
				plain := detect(t, DefaultTurnDetection(), rate, fm, pcm)
				want := []Kind{SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechStopped, SpeechStarted, SpeechPaused, SpeechStopped}
				if len(with) != len(want) {
					t.Fatalf("events %+v, want kinds %v", with, want)
				}
				for i, ev := range with {
					if ev.Kind != want[i] {
						t.Fatalf("event %d is %v, want %v (events %+v)", i, ev.Kind, want[i], with)
					}
				}
				var startsStops []Event
				for _, ev := range with {
					switch ev.Kind {
					case SpeechStarted, SpeechStopped:
						startsStops = append(startsStops, ev)
					case SpeechPaused:
						if ev.AudioMs-ev.SpeechMs != pause {
							t.Errorf("pause at %d ms, %d ms after the speech end %d; want %d", ev.AudioMs, ev.AudioMs-ev.SpeechMs, ev.SpeechMs, pause)
						}
					}
				}
				if fmt.Sprint(startsStops) != fmt.Sprint(plain) {
					t.Errorf("starts and stops %+v with the early pause, %+v without", startsStops, plain)
				}
				// The resume: where the second part of the sentence starts.
				if on := int64(sc.Utterances[1].StartMs); with[2].AudioMs < on-int64(fm) || with[2].AudioMs > on+100 {
					t.Errorf("resumed at %d ms; the speech goes on at %d ms", with[2].AudioMs, on)
				}
				for _, i := range []int{3, 6} {
					p, st := with[i], with[i+1]
					if st.SpeechMs != p.SpeechMs || st.AudioMs-p.AudioMs != silence-pause {
						t.Errorf("pause %+v, stop %+v: want the same speech end and the stop %d ms later", p, st, silence-pause)
					}
				}
			})
		}
	}
}

// detect runs pcm through a detector made with td and returns its events,
// checking Paused and VoicedMs against them as it goes.
func detect(t *testing.T, td TurnDetection, rate, fm int, pcm []byte) []Event {
	t.Helper()
	d, err := NewDetector(td, rate, fm)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var voiced int64
	evs := feed(t, d, pcm, func(ev Event) {
		switch ev.Kind {
		case SpeechStarted:
			if d.VoicedMs() <= 0 || d.Paused() {
				t.Errorf("at the start: VoicedMs %d, Paused %v", d.VoicedMs(), d.Paused())
			}
		case SpeechPaused:
			if !d.Paused() || d.VoicedMs() < voiced {
				t.Errorf("at a pause: Paused %v, VoicedMs %d after %d", d.Paused(), d.VoicedMs(), voiced)
			}
		case SpeechResumed:
			if d.Paused() {
				t.Error("Paused after SpeechResumed")
			}
		case SpeechStopped:
			if d.Paused() || d.VoicedMs() != 0 {
				t.Errorf("after the stop: Paused %v, VoicedMs %d", d.Paused(), d.VoicedMs())
			}
		}
		voiced = d.VoicedMs()
	})
	return evs
}

// TestVoicedSpeech: the voiced speech a detector counts in a cough-like
// burst and in short backchannels stays under DefaultMinInterruptionMs,
// and in the short interruptions of the turn-taking bench (bench/voice)
// it is over it, at both rates and frame lengths: the default tells
// them apart on clean speech. (Speech in noise, and backchannels said
// slowly, "Mm hmm" from espeak-ng at 700 ms, are not.)
func TestVoicedSpeech(t *testing.T) {
	speech.Require(t)
	type burst struct {
		name  string
		short bool
		make  func(rate int) ([]int16, error)
	}
	say := func(text string) func(int) ([]int16, error) {
		return func(rate int) ([]int16, error) { return speech.Say(text, rate) }
	}
	bursts := []burst{
		{"cough 200 ms", true, func(rate int) ([]int16, error) { return speech.Cough(200, rate) }},
		{"Yeah.", true, say("Yeah.")},
		{"Uh huh.", true, say("Uh huh.")},
		{"Right.", true, say("Right.")},
		{"Hmm.", true, say("Hmm.")},
		{"Wait, stop.", false, say("Wait, stop.")},
		{"Hold on a moment.", false, say("Hold on a moment.")},
		{"No, listen.", false, say("No, listen.")},
	}
	for _, rate := range []int{Rate16k, Rate24k} {
		for _, b := range bursts {
			s, err := b.make(rate)
			if err != nil {
				t.Fatal(err)
			}
			sc := &speech.Script{Rate: rate}
			sc.Pause(1000)
			sc.Samples = append(sc.Samples, s...)
			sc.Pause(1000)
			for _, fm := range frameLengths {
				d, err := NewDetector(DefaultTurnDetection(), rate, fm)
				if err != nil {
					t.Fatal(err)
				}
				var most int64
				pcm := scriptPCM(sc)
				for off := 0; off+d.FrameBytes() <= len(pcm); off += d.FrameBytes() {
					if _, err := d.Process(pcm[off : off+d.FrameBytes()]); err != nil {
						t.Fatal(err)
					}
					most = max(most, d.VoicedMs())
				}
				d.Close()
				t.Logf("%d Hz, %d ms frames: %-18s %4d ms long, %4d ms voiced", rate, fm, b.name, len(s)*1000/rate, most)
				if b.short != (most < DefaultMinInterruptionMs) || most == 0 {
					t.Errorf("%d Hz, %d ms frames: %s has %d ms of voiced speech; want it %s %d", rate, fm, b.name, most,
						map[bool]string{true: "under", false: "at least"}[b.short], DefaultMinInterruptionMs)
				}
			}
		}
	}
}
