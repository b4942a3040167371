package callclient

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// fixturePath is the speech fixture shared with the browser tests.
const fixturePath = "../../testdata/speech.wav"

// wavOpts describes a WAV file to synthesize.
type wavOpts struct {
	format     uint16
	channels   uint16
	rate       uint32
	bits       uint16
	blockAlign uint16 // 0 = channels*bits/8
	extensible bool   // WAVE_FORMAT_EXTENSIBLE with sub-format = format
	extra      []byte // chunk inserted before fmt
	data       []byte
	dataSize   int // -1 = len(data)
	noData     bool
}

func makeWAV(o wavOpts) []byte {
	var b bytes.Buffer
	chunk := func(id string, body []byte, size int) {
		b.WriteString(id)
		_ = binary.Write(&b, binary.LittleEndian, uint32(size))
		b.Write(body)
		if len(body)%2 == 1 {
			b.WriteByte(0)
		}
	}
	if o.extra != nil {
		chunk("LIST", o.extra, len(o.extra))
	}
	ba := o.blockAlign
	if ba == 0 {
		ba = o.channels * o.bits / 8
	}
	var f bytes.Buffer
	tag := o.format
	if o.extensible {
		tag = wavFormatExtensible
	}
	for _, v := range []any{tag, o.channels, o.rate, o.rate * uint32(ba), ba, o.bits} {
		_ = binary.Write(&f, binary.LittleEndian, v)
	}
	if o.extensible {
		for _, v := range []any{uint16(22), o.bits, uint32(0), o.format} {
			_ = binary.Write(&f, binary.LittleEndian, v)
		}
		f.Write(make([]byte, 14)) // rest of the GUID
	}
	chunk("fmt ", f.Bytes(), f.Len())
	if !o.noData {
		size := o.dataSize
		if size < 0 {
			size = len(o.data)
		}
		chunk("data", o.data, size)
	}
	riff := append([]byte("RIFF"), 0, 0, 0, 0)
	riff = append(riff, "WAVE"...)
	riff = append(riff, b.Bytes()...)
	binary.LittleEndian.PutUint32(riff[4:], uint32(len(riff)-8))
	return riff
}

func pcmOK() wavOpts {
	return wavOpts{format: 1, channels: 1, rate: 48000, bits: 16, data: []byte{1, 0, 2, 0, 0xff, 0xff, 0, 0x80}, dataSize: -1}
}

func TestReadWAV(t *testing.T) {
	with := func(f func(*wavOpts)) []byte { o := pcmOK(); f(&o); return makeWAV(o) }
	tests := []struct {
		name    string
		in      []byte
		want    *WAV
		wantErr error
	}{
		{name: "mono 48k", in: makeWAV(pcmOK()), want: &WAV{SampleRate: 48000, Channels: 1, Samples: []int16{1, 2, -1, -32768}}},
		{name: "stereo 16k", in: with(func(o *wavOpts) { o.channels, o.rate = 2, 16000 }), want: &WAV{SampleRate: 16000, Channels: 2, Samples: []int16{1, 2, -1, -32768}}},
		{name: "extensible 8k", in: with(func(o *wavOpts) { o.extensible, o.rate = true, 8000 }), want: &WAV{SampleRate: 8000, Channels: 1, Samples: []int16{1, 2, -1, -32768}}},
		{name: "skips other chunks, odd sized", in: with(func(o *wavOpts) { o.extra = []byte("abc") }), want: &WAV{SampleRate: 48000, Channels: 1, Samples: []int16{1, 2, -1, -32768}}},
		{name: "empty", in: nil, wantErr: ErrNotWAV},
		{name: "not riff", in: []byte("RIFX\x00\x00\x00\x00WAVEfmt "), wantErr: ErrNotWAV},
		{name: "mp3", in: []byte("ID3\x04\x00\x00\x00\x00\x00\x00\x00\x00"), wantErr: ErrNotWAV},
		{name: "float", in: with(func(o *wavOpts) { o.format, o.bits = 3, 32 }), wantErr: ErrUnsupportedFormat},
		{name: "extensible float", in: with(func(o *wavOpts) { o.format, o.extensible = 3, true }), wantErr: ErrUnsupportedFormat},
		{name: "8 bit", in: with(func(o *wavOpts) { o.bits = 8 }), wantErr: ErrUnsupportedFormat},
		{name: "24 bit", in: with(func(o *wavOpts) { o.bits = 24; o.data = o.data[:6] }), wantErr: ErrUnsupportedFormat},
		{name: "44.1k", in: with(func(o *wavOpts) { o.rate = 44100 }), want: &WAV{SampleRate: 44100, Channels: 1, Samples: []int16{1, 2, -1, -32768}}},
		{name: "22.05k stereo", in: with(func(o *wavOpts) { o.channels, o.rate = 2, 22050 }), want: &WAV{SampleRate: 22050, Channels: 2, Samples: []int16{1, 2, -1, -32768}}},
		{name: "4k", in: with(func(o *wavOpts) { o.rate = 4000 }), wantErr: ErrUnsupportedFormat},
		{name: "384k", in: with(func(o *wavOpts) { o.rate = 384000 }), wantErr: ErrUnsupportedFormat},
		{name: "6 channels", in: with(func(o *wavOpts) { o.channels = 6 }), wantErr: ErrUnsupportedFormat},
		{name: "bad block align", in: with(func(o *wavOpts) { o.blockAlign = 3 }), wantErr: ErrMalformedWAV},
		{name: "no data", in: with(func(o *wavOpts) { o.noData = true }), wantErr: ErrMalformedWAV},
		{name: "data size past end", in: with(func(o *wavOpts) { o.dataSize = 1 << 20 }), wantErr: ErrMalformedWAV},
		{name: "half a stereo frame", in: with(func(o *wavOpts) { o.channels = 2; o.data = o.data[:6] }), wantErr: ErrMalformedWAV},
		{name: "truncated header", in: makeWAV(pcmOK())[:40], wantErr: ErrMalformedWAV},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadWAV(bytes.NewReader(tt.in))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.SampleRate != tt.want.SampleRate || got.Channels != tt.want.Channels ||
				!equalInt16(got.Samples, tt.want.Samples) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func equalInt16(a, b []int16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestLoadWAVFixture(t *testing.T) {
	w, err := LoadWAV(fixturePath)
	if err != nil {
		t.Fatal(err)
	}
	if w.SampleRate != 48000 || w.Channels != 1 {
		t.Errorf("fixture is %d Hz, %d channels; want 48000 Hz mono", w.SampleRate, w.Channels)
	}
	if d := w.Duration(); d < 2*time.Second || d > 10*time.Second {
		t.Errorf("fixture lasts %v, want a few seconds", d)
	}
}

func FuzzReadWAV(f *testing.F) {
	f.Add(makeWAV(pcmOK()))
	o := pcmOK()
	o.extensible, o.extra = true, []byte("x")
	f.Add(makeWAV(o))
	f.Add([]byte("RIFF\x00\x00\x00\x00WAVE"))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := ReadWAV(bytes.NewReader(b))
		if err != nil {
			return
		}
		if len(w.Samples)*2 > len(b) || len(w.Samples)%w.Channels != 0 || w.SampleRate < minWAVRate || w.SampleRate > maxWAVRate {
			t.Fatalf("inconsistent result %d Hz %d ch %d samples from %d bytes", w.SampleRate, w.Channels, len(w.Samples), len(b))
		}
	})
}
