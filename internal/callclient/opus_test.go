package callclient

import (
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
