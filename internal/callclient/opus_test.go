package callclient

import (
	"fmt"
	"math"
	"testing"

	"gopkg.in/hraban/opus.v2"
)

func TestEncodeOpusFixture(t *testing.T) {
	w, err := LoadWAV(fixturePath)
	if err != nil {
		t.Fatal(err)
	}
	frames, err := encodeOpus(w, 0)
	if err != nil {
		t.Fatal(err)
	}
	const perFrame = 960 // 20 ms at 48 kHz
	if want := (len(w.Samples) + perFrame - 1) / perFrame; len(frames) != want {
		t.Fatalf("%d frames, want %d", len(frames), want)
	}
	dec, err := opus.NewDecoder(48000, 1)
	if err != nil {
		t.Fatal(err)
	}
	pcm := make([]int16, 48000/10)
	for i, f := range frames {
		if len(f) == 0 || len(f) > maxOpusPacket {
			t.Fatalf("frame %d: %d bytes", i, len(f))
		}
		n, err := dec.Decode(f, pcm)
		if err != nil {
			t.Fatalf("frame %d: decode: %v", i, err)
		}
		if n != perFrame {
			t.Fatalf("frame %d decodes to %d samples, want %d (20 ms)", i, n, perFrame)
		}
	}
}

func TestEncodeOpusRatesAndLooping(t *testing.T) {
	tests := []struct {
		name      string
		rate, ch  int
		samples   int // per channel
		maxFrames int
		want      int
	}{
		{name: "8k mono", rate: 8000, ch: 1, samples: 8000, want: 50},
		{name: "12k stereo", rate: 12000, ch: 2, samples: 1200, want: 5},
		{name: "16k partial last frame", rate: 16000, ch: 1, samples: 330, want: 2},
		{name: "24k stereo looped", rate: 24000, ch: 2, samples: 480, maxFrames: 7, want: 7},
		{name: "48k truncated", rate: 48000, ch: 1, samples: 48000, maxFrames: 3, want: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &WAV{SampleRate: tt.rate, Channels: tt.ch, Samples: make([]int16, tt.samples*tt.ch)}
			for i := range w.Samples {
				w.Samples[i] = int16((i * 37) % 2000)
			}
			frames, err := encodeOpus(w, tt.maxFrames)
			if err != nil {
				t.Fatal(err)
			}
			if len(frames) != tt.want {
				t.Fatalf("%d frames, want %d", len(frames), tt.want)
			}
			dec, err := opus.NewDecoder(48000, tt.ch)
			if err != nil {
				t.Fatal(err)
			}
			pcm := make([]int16, 5760*tt.ch)
			for i, f := range frames {
				n, err := dec.Decode(f, pcm)
				if err != nil || n != 960 {
					t.Fatalf("frame %d: %d samples per channel at 48 kHz, err %v; want 960", i, n, err)
				}
			}
		})
	}
}

// TestEncodeOpusResamples: WAV files at rates libopus does not take
// (22,050 Hz from espeak-ng, 44,100 Hz from CDs) are resampled to 48 kHz
// before encoding: a 1 kHz tone keeps its pitch and its length.
func TestEncodeOpusResamples(t *testing.T) {
	for _, rate := range []int{11025, 22050, 44100, 32000, 96000} {
		t.Run(fmt.Sprint(rate), func(t *testing.T) {
			const seconds, tone = 2, 1000.0
			w := &WAV{SampleRate: rate, Channels: 1, Samples: make([]int16, seconds*rate)}
			for i := range w.Samples {
				w.Samples[i] = int16(10000 * math.Sin(2*math.Pi*tone*float64(i)/float64(rate)))
			}
			frames, err := encodeOpus(w, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := seconds * 50; len(frames) < want || len(frames) > want+1 {
				t.Fatalf("%d frames, want %d (%d s of 20 ms)", len(frames), want, seconds)
			}
			dec, err := opus.NewDecoder(48000, 1)
			if err != nil {
				t.Fatal(err)
			}
			var pcm []int16
			buf := make([]int16, 5760)
			for i, f := range frames {
				n, err := dec.Decode(f, buf)
				if err != nil || n != 960 {
					t.Fatalf("frame %d: %d samples, %v", i, n, err)
				}
				pcm = append(pcm, buf[:n]...)
			}
			// Count rising zero crossings over the middle second.
			mid := pcm[len(pcm)/4 : len(pcm)/4+48000]
			crossings := 0
			for i := 1; i < len(mid); i++ {
				if mid[i-1] < 0 && mid[i] >= 0 {
					crossings++
				}
			}
			if math.Abs(float64(crossings)-tone) > tone/100 {
				t.Fatalf("decoded tone at %d Hz, want %.0f Hz", crossings, tone)
			}
		})
	}
}
