package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func TestParseAudioFrame(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		want    AudioFrame
		wantErr error
	}{
		{
			name: "opus packet",
			in:   []byte{0x01, 0x00, 0x12, 0x34, 0xde, 0xad, 0xbe, 0xef, 0xfc, 0xff, 0xfe},
			want: AudioFrame{Seq: 0x1234, Timestamp: 0xdeadbeef, Payload: []byte{0xfc, 0xff, 0xfe}},
		},
		{
			name: "empty payload",
			in:   []byte{0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02},
			want: AudioFrame{Seq: 1, Timestamp: 2, Payload: []byte{}},
		},
		{
			name: "flags ignored",
			in:   []byte{0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x07},
			want: AudioFrame{Seq: 0xffff, Timestamp: 0xffffffff, Payload: []byte{0x07}},
		},
		{
			name: "concealed",
			in:   []byte{0x01, 0x01, 0x00, 0x05, 0x00, 0x00, 0x01, 0xe0, 0x00, 0x00},
			want: AudioFrame{Seq: 5, Timestamp: 480, Payload: []byte{0, 0}, Concealed: true},
		},
		{name: "empty", in: nil, wantErr: ErrProtocol},
		{name: "short header", in: []byte{0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00}, wantErr: ErrProtocol},
		{name: "kind only", in: []byte{0x01}, wantErr: ErrProtocol},
		{name: "unknown kind", in: []byte{0x02, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02}, wantErr: ErrFrameKind},
		{name: "unknown kind short", in: []byte{0x7f}, wantErr: ErrFrameKind},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAudioFrame(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			if got.Seq != tt.want.Seq || got.Timestamp != tt.want.Timestamp || !bytes.Equal(got.Payload, tt.want.Payload) ||
				(tt.name != "flags ignored" && got.Concealed != tt.want.Concealed) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestAppendAudioFrame(t *testing.T) {
	tests := []struct {
		name string
		f    AudioFrame
		want []byte
	}{
		{name: "zero", f: AudioFrame{}, want: []byte{1, 0, 0, 0, 0, 0, 0, 0}},
		{
			name: "big endian",
			f:    AudioFrame{Seq: 0x0102, Timestamp: 0x03040506, Payload: []byte{9, 8}},
			want: []byte{1, 0, 1, 2, 3, 4, 5, 6, 9, 8},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AppendAudioFrame(nil, tt.f); !bytes.Equal(got, tt.want) {
				t.Fatalf("got % x, want % x", got, tt.want)
			}
		})
	}
}

func TestAppendAudioFrameNoAlloc(t *testing.T) {
	buf := make([]byte, 0, 2048)
	f := AudioFrame{Seq: 1, Timestamp: 960, Payload: make([]byte, 160)}
	allocs := testing.AllocsPerRun(100, func() {
		buf = AppendAudioFrame(buf[:0], f)
		if _, err := ParseAudioFrame(buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("AppendAudioFrame+ParseAudioFrame: %v allocs per run, want 0", allocs)
	}
}

// FuzzParseAudioFrame checks that ParseAudioFrame never panics, that a
// frame it accepts re-encodes to the same bytes (reserved flag bits
// zeroed, the concealed bit kept), and that
// encoding any frame parses back to it.
func FuzzParseAudioFrame(f *testing.F) {
	f.Add([]byte{0x01, 0x00, 0x12, 0x34, 0xde, 0xad, 0xbe, 0xef, 0xfc, 0xff, 0xfe})
	f.Add([]byte{0x01, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00})
	f.Add([]byte{0x01, 0x00, 0x00})
	f.Add([]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseAudioFrame(b)
		if err != nil {
			if !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrFrameKind) {
				t.Fatalf("error %v wraps neither ErrProtocol nor ErrFrameKind", err)
			}
		} else {
			want := append([]byte{}, b...)
			want[1] &= FlagConcealed
			if got := AppendAudioFrame(nil, fr); !bytes.Equal(got, want) {
				t.Fatalf("re-encode: got % x, want % x", got, want)
			}
		}
		// Any payload, with header fields taken from the input, round-trips.
		var in AudioFrame
		if len(b) >= 6 {
			in.Seq = uint16(b[0])<<8 | uint16(b[1])
			in.Timestamp = uint32(b[2])<<24 | uint32(b[3])<<16 | uint32(b[4])<<8 | uint32(b[5])
		}
		in.Payload = b
		out, err := ParseAudioFrame(AppendAudioFrame(nil, in))
		if err != nil {
			t.Fatalf("parse of encoded frame: %v", err)
		}
		if out.Seq != in.Seq || out.Timestamp != in.Timestamp || !bytes.Equal(out.Payload, in.Payload) {
			t.Fatalf("round trip: got %+v, want %+v", out, in)
		}
	})
}

// FuzzParseControl: any text message parses without panicking, and a
// control message that parses survives a round trip through its wire form.
func FuzzParseControl(f *testing.F) {
	for _, s := range []string{
		`{"type":"output.clear"}`,
		`{"type":"output.mark","name":"m1","cleared":true}`,
		`{"type":"output.response","id":"resp_1"}`,
		`{"type":"output.cleared","played_ms":1260}`,
		`{"type":"output.stopped","played_ms":-1}`,
		`{"type":"error","code":"output_queue_full","message":"x"}`,
		`{"type":"output.mark","name":5}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseText(b)
		if err != nil {
			return
		}
		switch m.Type {
		case TypeOutputClear, TypeOutputCleared, TypeOutputMark, TypeOutputStarted, TypeOutputStopped, TypeOutputResponse, TypeError,
			TypeInputSpeechStarted, TypeInputSpeechStopped, TypeInputTurnDetection:
		default:
			return
		}
		c, err := parseControl(m)
		if err != nil {
			return
		}
		w, err := wireControl(*c)
		if err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := parseText(out)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		c2, err := parseControl(m2)
		if err != nil {
			t.Fatalf("round trip of %q: %v", b, err)
		}
		// turn_detection is carried as JSON: equal once compacted.
		var td, td2 bytes.Buffer
		_ = json.Compact(&td, c.TurnDetection)
		_ = json.Compact(&td2, c2.TurnDetection)
		plain, plain2 := *c, *c2
		plain.TurnDetection, plain2.TurnDetection = nil, nil
		if !reflect.DeepEqual(plain, plain2) || td.String() != td2.String() {
			t.Fatalf("round trip of %q: %+v; want %+v", b, c2, c)
		}
	})
}
