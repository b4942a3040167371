package apm

import (
	"encoding/binary"
	"fmt"
	"gopkg.in/hraban/opus.v2"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	speechgen "github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"github.com/switchboard-rtc/switchboard/internal/vad"
)

// echoPath is a speakerphone's echo as a test sees it: the far end
// delayed by a delay that moves linearly from fromMs to toMs over the
// signal (read with linear interpolation, so a moving delay bends the
// pitch a little, as a jitter buffer's time stretching does), scaled by
// gain, with a short room tail (two reflections).
func echoPath(far []float64, rate int, fromMs, toMs, gain float64) []float64 {
	out := make([]float64, len(far))
	taps := []struct {
		ms, g float64
	}{{0, 1}, {7, 0.35}, {23, 0.15}}
	for i := range out {
		d := (fromMs + (toMs-fromMs)*float64(i)/float64(len(out))) * float64(rate) / 1000
		for _, tp := range taps {
			x := float64(i) - d - tp.ms*float64(rate)/1000
			j := int(math.Floor(x))
			if j < 0 || j+1 >= len(far) {
				continue
			}
			fr := x - float64(j)
			out[i] += gain * tp.g * (far[j]*(1-fr) + far[j+1]*fr)
		}
	}
	return out
}

func toFloat(s []int16) []float64 {
	x := make([]float64, len(s))
	for i, v := range s {
		x[i] = float64(v)
	}
	return x
}

func pcmBytes(x []float64) []byte {
	b := make([]byte, 2*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(int16(max(-32768, min(32767, math.Round(v))))))
	}
	return b
}

func samples(b []byte) []float64 {
	x := make([]float64, len(b)/2)
	for i := range x {
		x[i] = float64(int16(binary.LittleEndian.Uint16(b[2*i:])))
	}
	return x
}

// runEcho plays far through a Cleaner as a session would: 20 ms packets
// sent on a 20 ms clock, the input coming back in 20 ms frames whose
// arrival jitters by up to jitterMs. It returns the cleaned input.
func runEcho(t testing.TB, cfg Config, far, near []float64, jitterMs int) ([]float64, *Cleaner) {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	rate := cfg.Rate
	fl := rate / 50
	t0 := time.Unix(1000, 0)
	fb, nb := pcmBytes(far), pcmBytes(near)
	out := make([]byte, len(nb))
	rng := rand.New(rand.NewPCG(1, 2))
	for k := 0; (k+1)*fl <= len(near); k++ {
		at := t0.Add(time.Duration(k) * 20 * time.Millisecond)
		if (k+1)*fl <= len(far) {
			if err := c.Played(at, fb[2*k*fl:2*(k+1)*fl]); err != nil {
				t.Fatal(err)
			}
		}
		f := out[2*k*fl : 2*(k+1)*fl]
		copy(f, nb[2*k*fl:])
		arr := at.Add(20*time.Millisecond + time.Duration(rng.IntN(jitterMs*1000+1))*time.Microsecond)
		if err := c.Process(f, int64(k*fl), arr); err != nil {
			t.Fatal(err)
		}
	}
	return samples(out), c
}

// power of x over [from, to) samples.
func power(x []float64, from, to int) float64 {
	var s float64
	for _, v := range x[from:to] {
		s += v * v
	}
	return s / float64(to-from)
}

// TestEchoCancellation: an agent's replies come back as a speakerphone's
// echo (delay drifting from 150 to 300 ms, -6 dB, a short room tail), with
// the user talking over two replies and between them. Cleaned, the echo
// alone starts no turn, where uncleaned it starts one per reply, and the
// user's utterances are reported no more than 40 ms later than the same
// detector reports them with no echo at all.
func TestEchoCancellation(t *testing.T) {
	speechgen.Require(t)
	for _, rate := range []int{16000, 24000} {
		for _, codec := range []bool{false, true} {
			name := fmt.Sprint(rate)
			if codec {
				name += "/opus"
			}
			t.Run(name, func(t *testing.T) { echoCase(t, rate, codec) })
		}
	}
}

// opusTrip codes x with libopus (VoIP, 20 ms, 32 kbit/s, as a browser
// sends) and decodes it, at rate Hz.
func opusTrip(t testing.TB, x []float64, rate int) []float64 {
	t.Helper()
	enc, err := opus.NewEncoder(rate, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	_ = enc.SetBitrate(32000)
	dec, err := opus.NewDecoder(rate, 1)
	if err != nil {
		t.Fatal(err)
	}
	fl := rate / 50
	out := make([]float64, 0, len(x))
	in := make([]int16, fl)
	pcm := make([]int16, fl)
	buf := make([]byte, 1275)
	for k := 0; (k+1)*fl <= len(x); k++ {
		for i := range in {
			in[i] = int16(max(-32768, min(32767, math.Round(x[k*fl+i]))))
		}
		n, err := enc.Encode(in, buf)
		if err != nil {
			t.Fatal(err)
		}
		m, err := dec.Decode(buf[:n], pcm)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, toFloat(pcm[:m])...)
	}
	return append(out, make([]float64, len(x)-len(out))...)
}

// userTurns are the user's utterances over the replies, and where they
// start, ms.
var userTurns = []struct {
	text string
	atMs int
}{
	{"Wait, stop please.", 2500},
	{"No, the other one.", 9150},
	{"Hold on a second.", 12000},
}

func echoCase(t *testing.T, rate int, codec bool) {
	sc, err := speechgen.NewScript(rate, 500, 600,
		"Sure, I can help with that. Your table for two is booked for eight tonight.",
		"Is there anything else you would like me to do for you today?",
		"The weather tomorrow looks sunny with a light breeze from the west.",
		"I have sent the confirmation to your email address.")
	if err != nil {
		t.Fatal(err)
	}
	far := toFloat(sc.Samples)
	played := far
	if codec {
		// What the client plays is the transceiver's Opus, decoded; the
		// reference is what the transceiver sent, decoded the same way.
		played = opusTrip(t, far, rate)
		far = played
	}
	echo := echoPath(played, rate, 150, 300, 0.5)
	user := make([]float64, len(far))
	var onsets []int
	for _, u := range userTurns {
		s, err := speechgen.Say(u.text, rate)
		if err != nil {
			t.Fatal(err)
		}
		at := u.atMs * rate / 1000
		for i, v := range s {
			if at+i < len(user) {
				user[at+i] += float64(v)
			}
		}
		onsets = append(onsets, u.atMs)
	}
	near := make([]float64, len(far))
	for i := range near {
		near[i] = echo[i] + user[i]
	}
	if codec {
		// The client's microphone, coded by its own encoder.
		echo, near, user = opusTrip(t, echo, rate), opusTrip(t, near, rate), opusTrip(t, user, rate)
	}
	cfg := Config{Rate: rate, EchoCancellation: true, GuardFirstReply: true}
	cleanEcho, c := runEcho(t, cfg, far, echo, 15)
	st := c.Stats()
	cleanNear, _ := runEcho(t, cfg, far, near, 15)
	// Without the first reply's guard, only the first reply's echo
	// starts turns: before the delay is measured, and while the gate
	// learns the coupling.
	unguarded, _ := runEcho(t, Config{Rate: rate, EchoCancellation: true}, far, echo, 15)
	u := reports(t, rate, unguarded)
	t.Logf("without GuardFirstReply, starts on the echo alone at %v ms (the first reply ends at %d ms)", u, sc.Utterances[0].EndMs)
	for _, at := range u {
		if at > int64(sc.Utterances[0].EndMs)+300 {
			t.Errorf("without GuardFirstReply, a start on the echo alone at %d ms, after the first reply", at)
		}
	}
	from := 2 * rate
	erle := 10 * math.Log10(power(echo, from, len(echo))/power(cleanEcho, from, len(cleanEcho)))
	t.Logf("%d Hz: echo alone: ERLE %.1f dB after the first 2 s (the module's own: %d dB, ERL %d dB); delay %d ms (measured %v, module's correction %d ms); %d of %d frames gated",
		rate, erle, st.Echo.ERLE, st.Echo.ERL, st.DelayMs, st.Measured, st.Echo.DelayMedianMs, st.Gated, st.Frames)
	raw, cleaned := reports(t, rate, echo), reports(t, rate, cleanEcho)
	t.Logf("speech starts on the echo alone: uncleaned %d %v, cleaned %d %v", len(raw), raw, len(cleaned), cleaned)
	if len(raw) < len(sc.Utterances) {
		t.Errorf("uncleaned echo started %d turns over %d replies: the test's echo is too weak to show anything", len(raw), len(sc.Utterances))
	}
	if len(cleaned) != 0 {
		t.Errorf("cleaned echo started %d turns, want 0", len(cleaned))
	}
	base, got := reports(t, rate, user), reports(t, rate, cleanNear)
	t.Logf("user over the echo: starts reported at %v ms with no echo, %v ms cleaned", base, got)
	if len(base) != len(onsets) {
		t.Fatalf("the user alone gave %d starts for %d utterances", len(base), len(onsets))
	}
	if len(got) != len(onsets) {
		t.Fatalf("cleaned, the user over the echo gave %d starts for %d utterances: %v", len(got), len(onsets), got)
	}
	// The canceller's suppressor holds a soft onset ("Hold", its /h/
	// under the echo's loudest syllable) for a few frames of double
	// talk: the median must be within 40 ms, none more than 100 ms.
	var late []int64
	for i := range onsets {
		d := got[i] - base[i]
		late = append(late, d)
		if d > 100 {
			t.Errorf("utterance %d: start reported %d ms later than with no echo (limit 100)", i+1, d)
		}
	}
	slices.Sort(late)
	if m := late[len(late)/2]; m > 40 {
		t.Errorf("starts reported %v ms later than with no echo: median %d ms, limit 40", late, m)
	}
}

// reports runs the default turn detector over x and returns when each
// speech start was reported: the end of the frame it came with, ms.
func reports(t testing.TB, rate int, x []float64) []int64 {
	t.Helper()
	det, err := vad.NewDetector(vad.DefaultTurnDetection(), rate, vad.Frame20ms)
	if err != nil {
		t.Fatal(err)
	}
	defer det.Close()
	b := pcmBytes(x)
	fl := 2 * rate / 50
	var at []int64
	for off := 0; off+fl <= len(b); off += fl {
		ev, err := det.Process(b[off : off+fl])
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind == vad.SpeechStarted {
			at = append(at, int64((off+fl)/2*1000/rate))
		}
	}
	return at
}

// TestNoEchoClient: a client that cancels its own echo (a headset, a
// browser's canceller) sends only the user. With echo cancellation on
// (the transceiver's default) the replies play and nothing of them comes
// back: the echo is never found, so the input leaves the Cleaner as it
// came (the module and the gate wait for an echo) and the user is heard
// exactly when without cleaning; with GuardFirstReply, in the far end's
// first GuardMs the gate acts on a coupling learnt from the quiet input,
// and the user is heard at most one frame (20 ms) later.
func TestNoEchoClient(t *testing.T) {
	speechgen.Require(t)
	const rate = 24000
	sc, err := speechgen.NewScript(rate, 500, 600,
		"Sure, I can help with that. Your table for two is booked for eight tonight.",
		"Is there anything else you would like me to do for you today?",
		"The weather tomorrow looks sunny with a light breeze from the west.",
		"I have sent the confirmation to your email address.")
	if err != nil {
		t.Fatal(err)
	}
	far := toFloat(sc.Samples)
	user := make([]float64, len(far))
	for _, u := range userTurns {
		s, err := speechgen.Say(u.text, rate)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range s {
			if at := u.atMs*rate/1000 + i; at < len(user) {
				user[at] += float64(v)
			}
		}
	}
	base := reports(t, rate, user)
	for _, guard := range []bool{false, true} {
		got, c := runEcho(t, Config{Rate: rate, EchoCancellation: true, GuardFirstReply: guard}, far, user, 15)
		cleaned := reports(t, rate, got)
		st := c.Stats()
		t.Logf("no echo, GuardFirstReply %v: starts reported at %v ms uncleaned, %v ms cleaned; echo measured %v, %d frames gated", guard, base, cleaned, st.Measured, st.Gated)
		if st.Measured {
			t.Errorf("an echo delay of %d ms was measured where there is no echo", st.DelayMs)
		}
		if !guard && st.Gated != 0 {
			t.Errorf("%d frames gated with no echo and no guard", st.Gated)
		}
		if len(cleaned) != len(base) {
			t.Fatalf("cleaned %d starts, uncleaned %d", len(cleaned), len(base))
		}
		if !guard && !slices.Equal(got, user) {
			t.Errorf("with no echo found and no guard, the Cleaner changed the input")
		}
		for i := range base {
			d := cleaned[i] - base[i]
			limit := int64(0)
			if guard && userTurns[i].atMs < 500+GuardMs {
				limit = 20
			}
			if d > limit {
				t.Errorf("guard %v, utterance %d (at %d ms): heard %d ms later cleaned, limit %d", guard, i+1, userTurns[i].atMs, d, limit)
			}
		}
	}
}

// TestSilenceStaysSilent: a client that sends digital silence while the
// agent talks (a muted microphone, a test client, a headset with its own
// canceller in a quiet room) gets that silence back from the canceller (Opus decodes it to ±1), at
// every rate and with noise suppression too: nothing the module adds
// (AEC2's comfort noise) may reach the detector as a sound that starts a
// turn. A CI run's turn test heard a speech start 220 ms into the first
// reply of a client that sent only zeros.
func TestSilenceStaysSilent(t *testing.T) {
	for _, rate := range []int{16000, 24000, 48000} {
		for _, ns := range []string{"", NearField} {
			far := make([]float64, 3*rate)
			for i := range far {
				far[i] = 8000 * math.Sin(2*math.Pi*440*float64(i)/float64(rate)) // a loud reply
			}
			// What Opus decodes a client's digital silence to: ±1.
			near := make([]float64, len(far))
			rng := rand.New(rand.NewPCG(3, 4))
			for i := range near {
				near[i] = float64(rng.IntN(3) - 1)
			}
			out, c := runEcho(t, Config{Rate: rate, EchoCancellation: true, NoiseReduction: ns}, far, near, 5)
			// No 10 ms frame leaves louder than it came in (0.5 dB for
			// the rounding of a few quiet samples).
			fl := rate / 100
			worst := -200.0
			for k := 0; (k+1)*fl <= len(out); k++ {
				worst = max(worst, dB(power(out, k*fl, (k+1)*fl))-dB(power(near, k*fl, (k+1)*fl)))
			}
			if worst > 0.5 {
				t.Errorf("%d Hz, noise_reduction %q: silence in, a frame %.1f dB louder out; processed %d of %d frames",
					rate, ns, worst, c.Stats().Processed, c.Stats().Frames)
			}
		}
	}
}
