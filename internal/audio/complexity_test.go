package audio

import (
	"math"
	"testing"

	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/audio/audiotest"
)

// complexities are the encoder complexities docs/benchmarks.md compares
// ("Opus encoder complexity").
var complexities = []int{10, 8, 6, 5, 3}

// backendSpeech is testdata/speech.wav as a PCM backend sends it: 24 kHz
// mono PCM16, in 20 ms frames.
func backendSpeech(t testing.TB) (pcm []int16, frames [][]byte) {
	t.Helper()
	for _, v := range audiotest.Decimate(speech(t), 2) {
		pcm = append(pcm, int16(math.Round(v)))
	}
	f := FrameSamples(24000)
	for i := 0; i+f <= len(pcm); i += f {
		b := make([]byte, 2*f)
		for j, s := range pcm[i : i+f] {
			b[2*j], b[2*j+1] = byte(s), byte(uint16(s)>>8)
		}
		frames = append(frames, b)
	}
	return pcm, frames
}

// encodeDecode encodes 24 kHz frames at complexity c (and DefaultBitrate)
// and decodes them at 24 kHz, as a client's decoder would at that rate.
func encodeDecode(t testing.TB, frames [][]byte, c int) (out []int16, bytes int) {
	t.Helper()
	e, err := NewEncoderConfig(EncoderConfig{Rate: 24000, Complexity: c})
	if err != nil {
		t.Fatal(err)
	}
	d, err := opus.NewDecoder(24000, 1)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]int16, 5760)
	for _, f := range frames {
		ps, err := e.Write(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			bytes += len(p.Payload)
			n, err := d.Decode(p.Payload, buf)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, buf[:n]...)
		}
	}
	return out, bytes
}

// snr is the signal-to-noise ratio in dB of got against want, got aligned
// lag samples behind.
func snr(want []float64, got []int16, lag int) float64 {
	var sig, noise float64
	for i := 0; i < len(want) && i+lag < len(got); i++ {
		d := want[i] - float64(got[i+lag])
		sig += want[i] * want[i]
		noise += d * d
	}
	return 10 * math.Log10(sig/noise)
}

// TestEncoderComplexity encodes the speech a PCM backend sends at each
// complexity, decodes it, and compares it with the original: waveform and
// envelope correlation (audiotest.Similarity) and SNR. The table is
// docs/benchmarks.md's; the test holds DefaultComplexity to within a
// small margin of libopus's default (10), on every measure.
func TestEncoderComplexity(t *testing.T) {
	pcm, frames := backendSpeech(t)
	want := make([]float64, len(pcm))
	for i, s := range pcm {
		want[i] = float64(s)
	}
	type score struct{ wave, env, snr, kbps float64 }
	scores := map[int]score{}
	for _, c := range append(complexities, DefaultComplexity) {
		got, n := encodeDecode(t, frames, c)
		g := make([]float64, len(got))
		for i, s := range got {
			g[i] = float64(s)
		}
		w, env, lag := audiotest.Similarity(want, g, 24000, 24000/20)
		sc := score{w, env, snr(want, got, lag), float64(n*8) / (float64(len(frames)) * 0.020) / 1000}
		scores[c] = sc
		t.Logf("complexity %2d: waveform %.3f, envelope %.3f, SNR %.1f dB, %.1f kbit/s (lag %d)", c, sc.wave, sc.env, sc.snr, sc.kbps, lag)
	}
	ref, def := scores[10], scores[DefaultComplexity]
	if def.env < ref.env-0.01 || def.wave < ref.wave-0.03 || def.snr < ref.snr-1.5 {
		t.Errorf("complexity %d: waveform %.3f, envelope %.3f, SNR %.1f dB; more than the margin below complexity 10's %.3f, %.3f, %.1f dB",
			DefaultComplexity, def.wave, def.env, def.snr, ref.wave, ref.env, ref.snr)
	}
	if def.env < 0.95 || def.wave < 0.85 {
		t.Errorf("complexity %d does not keep the speech: waveform %.3f, envelope %.3f", DefaultComplexity, def.wave, def.env)
	}
}

func TestEncoderConfigErrors(t *testing.T) {
	for _, c := range []EncoderConfig{
		{Rate: 24000, Complexity: -1},
		{Rate: 24000, Complexity: 11},
		{Rate: 22050},
		{Rate: 24000, Bitrate: 100},
	} {
		if _, err := NewEncoderConfig(c); err == nil {
			t.Errorf("NewEncoderConfig(%+v) succeeded", c)
		}
	}
}
