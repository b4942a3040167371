package vad

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
)

// TestSpeechEndGrid runs the default detector in 20 ms and in 10 ms
// frames over the same audio: a conversation script like bench/voice's
// (a sentence, 1.1 s of silence, a short interruption, 3.2 s of
// silence, four times), through Opus in the 10 ms packets a client
// sends at the transceiver's -ptime 10. Both find every utterance once;
// in 10 ms frames each speech end (SpeechStopped's SpeechMs) is at most
// a frame after the true end (plus opusEndSlackMs, as in
// TestAccuracyThroughOpus; 29 ms at most here), some fall between the
// 20 ms grid's points, the median is no later than in 20 ms frames, and
// none is more than one 10 ms frame later (a 10 ms frame's own power
// can clear the bar on a codec's ringing tail that the mean of a 20 ms
// frame keeps under it: at 16 kHz one utterance of the eight ends 10 ms
// later). It logs the differences (what docs/vad.md reports).
func TestSpeechEndGrid(t *testing.T) {
	speech.Require(t)
	if testing.Short() {
		t.Skip("generates audio")
	}
	texts := []string{
		"The quick brown fox jumps over the lazy dog.", "Wait, stop.",
		"Please book a table for two at seven tonight.", "Hold on a moment.",
		"What is the weather going to be like tomorrow?", "No, listen.",
		"I would like to change my delivery address.", "Sorry, one thing.",
	}
	for _, rate := range []int{Rate24k, Rate16k} {
		sc := &speech.Script{Rate: rate, Samples: make([]int16, rate*600/1000)}
		for i, text := range texts {
			s, err := speech.Say(text, rate)
			if err != nil {
				t.Fatal(err)
			}
			start := len(sc.Samples) * 1000 / rate
			sc.Samples = append(sc.Samples, s...)
			sc.Utterances = append(sc.Utterances, speech.Utterance{StartMs: start, EndMs: len(sc.Samples) * 1000 / rate, Text: text})
			sc.Samples = append(sc.Samples, make([]int16, []int{1100, 3200}[i%2]*rate/1000)...)
		}
		pcm := make([]byte, 0, 2*len(sc.Samples))
		for _, v := range sc.Samples {
			pcm = binary.LittleEndian.AppendUint16(pcm, uint16(v))
		}
		pcm = throughOpus(t, rate, 32000, 10, pcm)
		ends := map[int][]int64{}
		for _, fm := range frameLengths {
			evs, _ := run(t, rate, fm, pcm)
			for _, ev := range evs {
				if ev.Kind == SpeechStopped {
					ends[fm] = append(ends[fm], ev.SpeechMs)
				}
			}
			if len(ends[fm]) != len(sc.Utterances) {
				t.Fatalf("%d Hz, %d ms frames: %d stops for %d utterances: %v", rate, fm, len(ends[fm]), len(sc.Utterances), evs)
			}
		}
		var diffs []int64
		between, later := 0, 0
		for i, e10 := range ends[Frame10ms] {
			e20 := ends[Frame20ms][i]
			diffs = append(diffs, e20-e10)
			// Like TestAccuracyThroughOpus: never past the frame in which
			// the speech ended, plus the codec's slack.
			if late := e10 - int64(sc.Utterances[i].EndMs); late > Frame10ms+opusEndSlackMs {
				t.Errorf("%d Hz: utterance %d (%q): speech end %d ms in 10 ms frames, %d ms after the true end %d ms: more than a frame (+%d ms for the codec)",
					rate, i, sc.Utterances[i].Text, e10, late, sc.Utterances[i].EndMs, opusEndSlackMs)
			}
			if e10%Frame20ms != 0 {
				between++
			}
			if e10 > e20 {
				later++
				t.Logf("%d Hz: utterance %d (%q): speech end %d ms in 10 ms frames, later than %d ms in 20 ms frames (true end %d ms)", rate, i, sc.Utterances[i].Text, e10, e20, sc.Utterances[i].EndMs)
			}
			if e10 > e20+Frame10ms {
				t.Errorf("%d Hz: utterance %d (%q): speech end %d ms in 10 ms frames, more than a frame later than %d ms in 20 ms frames", rate, i, sc.Utterances[i].Text, e10, e20)
			}
		}
		if between == 0 {
			t.Errorf("%d Hz: no speech end between the 20 ms grid's points: %v", rate, ends[Frame10ms])
		}
		s := slices.Clone(diffs)
		slices.Sort(s)
		median := float64(s[(len(s)-1)/2]+s[len(s)/2]) / 2
		if median < 0 {
			t.Errorf("%d Hz: speech ends in 10 ms frames are later than in 20 ms frames, median %v ms", rate, -median)
		}
		t.Logf("%d Hz: speech end in 20 ms frames minus in 10 ms frames, per utterance: %v ms; median %v ms; %d later (true ends %v)",
			rate, diffs, median, later, func() (e []int) {
				for _, u := range sc.Utterances {
					e = append(e, u.EndMs)
				}
				return e
			}())
	}
}
