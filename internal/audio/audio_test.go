package audio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"go.uber.org/goleak"
	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/audio/audiotest"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// speech returns testdata/speech.wav (48 kHz mono).
func speech(t testing.TB) []int16 {
	t.Helper()
	w, err := callclient.LoadWAV("../../testdata/speech.wav")
	if err != nil {
		t.Fatal(err)
	}
	if w.SampleRate != 48000 || w.Channels != 1 {
		t.Fatalf("speech.wav is %d Hz × %d, want 48000 × 1", w.SampleRate, w.Channels)
	}
	return w.Samples
}

// clientPackets encodes 48 kHz samples as a browser would: 20 ms Opus
// packets, VoIP, in-band FEC.
func clientPackets(t testing.TB, pcm []int16) [][]byte {
	t.Helper()
	enc, err := opus.NewEncoder(48000, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	_ = enc.SetInBandFEC(true)
	_ = enc.SetPacketLossPerc(0)
	var out [][]byte
	buf := make([]byte, maxOpusFrame)
	for i := 0; i+960 <= len(pcm); i += 960 {
		n, err := enc.Encode(pcm[i:i+960], buf)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
	return out
}

func samples(pcm []byte) []int16 {
	s := make([]int16, len(pcm)/2)
	for i := range s {
		s[i] = int16(binary.LittleEndian.Uint16(pcm[2*i:]))
	}
	return s
}

func TestPacketDuration(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		want    int
		wantErr bool
	}{
		{name: "empty", in: nil, wantErr: true},
		{name: "SILK WB 20 ms, code 0", in: []byte{9 << 3, 1, 2, 3}, want: 960},
		{name: "DTX: TOC only", in: []byte{9 << 3}, want: 960},
		{name: "CELT FB 10 ms, code 1", in: []byte{30<<3 | 1, 1, 2}, want: 960},
		{name: "code 1 odd", in: []byte{30<<3 | 1, 1, 2, 3}, wantErr: true},
		{name: "code 2", in: []byte{1<<3 | 2, 2, 0xaa, 0xbb, 0xcc}, want: 1920},
		{name: "code 2 first frame overruns", in: []byte{1<<3 | 2, 9, 0xaa}, wantErr: true},
		{name: "code 3 CBR 3×20 ms", in: []byte{1<<3 | 3, 3, 1, 2, 3}, want: 2880},
		{name: "code 3 CBR uneven", in: []byte{1<<3 | 3, 3, 1, 2}, wantErr: true},
		{name: "code 3 zero frames", in: []byte{1<<3 | 3, 0}, wantErr: true},
		{name: "code 3 over 120 ms", in: []byte{3<<3 | 3, 3}, wantErr: true}, // 3 × 60 ms
		{name: "code 3 VBR", in: []byte{1<<3 | 3, 0x80 | 2, 1, 0xaa, 0xbb, 0xcc}, want: 1920},
		{name: "code 3 VBR overrun", in: []byte{1<<3 | 3, 0x80 | 2, 5, 0xaa}, wantErr: true},
		{name: "code 3 padding", in: []byte{1<<3 | 3, 0x40 | 1, 2, 0xaa, 0, 0}, want: 960},
		{name: "code 3 padding overrun", in: []byte{1<<3 | 3, 0x40 | 1, 9, 0xaa}, wantErr: true},
		{name: "code 3 no count", in: []byte{1<<3 | 3}, wantErr: true},
		{name: "frame too long", in: append([]byte{9 << 3}, make([]byte, 1276)...), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PacketDuration(tt.in)
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, ErrInvalidOpus)) {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("duration %d, want %d", got, tt.want)
			}
		})
	}
	// Real packets from libopus at every frame size it encodes.
	for _, ms := range []float64{2.5, 5, 10, 20, 40, 60} {
		n := int(ms * 48)
		enc, _ := opus.NewEncoder(48000, 1, opus.AppVoIP)
		buf := make([]byte, 4000)
		m, err := enc.Encode(make([]int16, n), buf)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := PacketDuration(buf[:m]); err != nil || got != n {
			t.Errorf("%v ms libopus packet: duration %d, %v; want %d", ms, got, err, n)
		}
	}
}

func FuzzPacketDuration(f *testing.F) {
	for _, s := range [][]byte{{9 << 3}, {1<<3 | 3, 0x80 | 2, 1, 0xaa, 0xbb}, {1<<3 | 3, 0x40 | 1, 255, 3}} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := PacketDuration(b)
		if err == nil && (d <= 0 || d > MaxPacketDuration) {
			t.Fatalf("duration %d for a valid packet", d)
		}
	})
}

// TestDecoderClean decodes speech without loss at both bridge rates: a
// continuous clock, nothing concealed, and the speech preserved.
func TestDecoderClean(t *testing.T) {
	pcm := speech(t)
	pkts := clientPackets(t, pcm)
	for _, rate := range []int{24000, 16000} {
		d, err := NewDecoder(rate)
		if err != nil {
			t.Fatal(err)
		}
		var got []int16
		var n int
		for i, p := range pkts {
			for _, f := range d.Push(uint16(60000+i), uint32(1e9)+uint32(i*960), p) {
				if f.Seq != uint16(n) || f.Timestamp != uint32(n*FrameSamples(rate)) || f.Concealed || len(f.PCM) != 2*FrameSamples(rate) {
					t.Fatalf("rate %d frame %d: seq %d ts %d concealed %v len %d", rate, n, f.Seq, f.Timestamp, f.Concealed, len(f.PCM))
				}
				got = append(got, samples(f.PCM)...)
				n++
			}
		}
		if n != len(pkts) {
			t.Fatalf("rate %d: %d frames from %d packets", rate, n, len(pkts))
		}
		w, env, lag := audiotest.Similarity(audiotest.Decimate(pcm, 48000/rate), toFloat(got), rate, rate/100)
		t.Logf("rate %d: correlation with the original: waveform %.3f, envelope %.3f, at lag %d samples", rate, w, env, lag)
		if w < 0.9 || env < 0.9 {
			t.Errorf("rate %d: correlation waveform %.3f, envelope %.3f, want ≥ 0.9", rate, w, env)
		}
	}
}

func toFloat(s []int16) []float64 {
	f := make([]float64, len(s))
	for i, v := range s {
		f[i] = float64(v)
	}
	return f
}

// TestDecoderLoss drops packets, reorders and duplicates some, sends a DTX
// gap and a long hole, and checks the frame clock and the flags.
func TestDecoderLoss(t *testing.T) {
	pkts := clientPackets(t, speech(t))
	d, err := NewDecoder(24000)
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		seq    int // packet index, also its seq; RTP ts is index*960 + tsShift
		shift  int // extra RTP timestamp (DTX)
		frames int // frames expected from this push
		conc   int // of which concealed
		jump   int // expected timestamp jump before the first frame, in 24 kHz samples
	}
	steps := []step{
		{seq: 0, frames: 1},
		{seq: 1, frames: 1},
		{seq: 3, frames: 2, conc: 1},                      // 2 lost: FEC from 3
		{seq: 2, frames: 0},                               // late
		{seq: 3, frames: 0},                               // duplicate
		{seq: 7, frames: 4, conc: 3},                      // 4,5,6 lost: PLC 40 ms, FEC 20 ms
		{seq: 8, shift: 4800, frames: 1, jump: 2400},      // DTX: 100 ms without packets, no seq gap
		{seq: 30, shift: 4800, frames: 1, jump: 21 * 480}, // 21 lost (420 ms > MaxConceal): a jump
		{seq: 31, shift: 4800, frames: 1},
	}
	ts := uint32(0)
	for _, s := range steps {
		fs := d.Push(uint16(s.seq), uint32(s.seq*960+s.shift), pkts[s.seq])
		conc := 0
		for i, f := range fs {
			want := ts
			if i == 0 {
				want += uint32(s.jump)
			}
			if f.Timestamp != want {
				t.Fatalf("packet %d frame %d: timestamp %d, want %d", s.seq, i, f.Timestamp, want)
			}
			ts = f.Timestamp + 480
			if f.Concealed {
				conc++
			}
		}
		if len(fs) != s.frames || conc != s.conc {
			t.Fatalf("packet %d: %d frames (%d concealed), want %d (%d)", s.seq, len(fs), conc, s.frames, s.conc)
		}
	}
	st := d.Stats()
	want := DecoderStats{Packets: 7, Late: 2, FECSamples: 960, PLCSamples: 960, Discontinuity: 2}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
	if fs := d.Push(40, 40*960, []byte{}); len(fs) != 0 || d.Stats().Invalid != 1 {
		t.Fatalf("an empty payload gave %d frames, invalid %d", len(fs), d.Stats().Invalid)
	}
	// The sender restarts its numbering far back: after resyncLate late
	// packets the decoder follows it, its own clock unbroken.
	for i := range resyncLate {
		fs := d.Push(uint16(5+i), uint32(9e6+i*960), pkts[40+i])
		if i < resyncLate-1 {
			if len(fs) != 0 {
				t.Fatalf("late packet %d gave %d frames", i, len(fs))
			}
			continue
		}
		if len(fs) != 1 || fs[0].Timestamp != ts {
			t.Fatalf("resync frames %+v, want one at timestamp %d", fs, ts)
		}
	}
	if st := d.Stats(); st.Resyncs != 1 || st.Late != 2+resyncLate-1 {
		t.Fatalf("stats %+v, want 1 resync", st)
	}
	// One stray packet far ahead is dropped and does not derail the
	// stream; two in sequence far ahead are a restart.
	next := uint16(5 + resyncLate)
	ts += 480
	for _, step := range []struct {
		seq    uint16
		frames int
	}{
		{next + 30000, 0}, // stray
		{next, 1},         // the stream goes on
		{next + 1, 1},
		{next + 20000, 0}, // a jump...
		{next + 20001, 1}, // ...confirmed: a restart
		{next + 20002, 1},
	} {
		fs := d.Push(step.seq, uint32(9e6+int(step.seq-5)*960), pkts[50])
		if len(fs) != step.frames {
			t.Fatalf("seq %d: %d frames, want %d", step.seq, len(fs), step.frames)
		}
		for _, f := range fs {
			if f.Timestamp != ts {
				t.Fatalf("seq %d: timestamp %d, want %d (unbroken)", step.seq, f.Timestamp, ts)
			}
			ts += 480
		}
	}
	if st := d.Stats(); st.Resyncs != 2 {
		t.Fatalf("stats %+v, want 2 resyncs", st)
	}
}

// TestEncoderChunking: PCM in chunks of any size encodes to the same
// packets as in whole frames; odd lengths are refused; Flush pads.
func TestEncoderChunking(t *testing.T) {
	pcm := speech(t)
	in := make([]byte, 0, len(pcm))
	for i := 0; i+2 <= len(pcm); i += 2 { // 48 → 24 kHz
		in = binary.LittleEndian.AppendUint16(in, uint16(int16((int(pcm[i])+int(pcm[i+1]))/2)))
	}
	encode := func(chunks []int) [][]byte {
		e, err := NewEncoder(24000, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out [][]byte
		rest := in
		for i := 0; len(rest) > 0; i++ {
			n := min(chunks[i%len(chunks)]*2, len(rest))
			ps, err := e.Write(rest[:n])
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				out = append(out, append([]byte(nil), p.Payload...))
			}
			rest = rest[n:]
		}
		ps, err := e.Flush()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			out = append(out, append([]byte(nil), p.Payload...))
		}
		return out
	}
	whole := encode([]int{480})
	wantPackets := (len(in)/2 + 479) / 480
	if len(whole) != wantPackets {
		t.Fatalf("%d packets, want %d", len(whole), wantPackets)
	}
	for _, chunks := range [][]int{{1}, {7, 333, 1000}, {len(in)}} {
		got := encode(chunks)
		if len(got) != len(whole) {
			t.Fatalf("chunks %v: %d packets, want %d", chunks, len(got), len(whole))
		}
		for i := range got {
			if string(got[i]) != string(whole[i]) {
				t.Fatalf("chunks %v: packet %d differs", chunks, i)
			}
		}
	}
	for _, p := range whole {
		if d, err := PacketDuration(p); err != nil || d != 960 {
			t.Fatalf("packet duration %d, %v", d, err)
		}
	}
	e, _ := NewEncoder(16000, 24000)
	if _, err := e.Write([]byte{1, 2, 3}); !errors.Is(err, ErrOddLength) {
		t.Fatalf("odd length: %v", err)
	}
	if ps, _ := e.Write(make([]byte, 100)); len(ps) != 0 || e.Pending() != 50 {
		t.Fatalf("partial write: %d packets, %d pending", len(ps), e.Pending())
	}
	if err := e.Reset(); err != nil || e.Pending() != 0 {
		t.Fatalf("Reset: %v, pending %d", err, e.Pending())
	}
	for _, bad := range []struct{ rate, bitrate int }{{44100, 0}, {24000, 100}} {
		if _, err := NewEncoder(bad.rate, bad.bitrate); err == nil {
			t.Errorf("NewEncoder(%d, %d) succeeded", bad.rate, bad.bitrate)
		}
	}
	if _, err := NewDecoder(22050); err == nil {
		t.Error("NewDecoder(22050) succeeded")
	}
}

// TestRoundTrip: client Opus → Decoder → Encoder → a 48 kHz decoder at the
// client keeps the speech (what the PCM echo does).
func TestRoundTrip(t *testing.T) {
	pcm := speech(t)
	pkts := clientPackets(t, pcm)
	d, _ := NewDecoder(24000)
	e, _ := NewEncoder(24000, 0)
	client, _ := opus.NewDecoder(48000, 1)
	var got []int16
	buf := make([]int16, 5760)
	for i, p := range pkts {
		for _, f := range d.Push(uint16(i), uint32(i*960), p) {
			ps, err := e.Write(f.PCM)
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range ps {
				n, err := client.Decode(op.Payload, buf)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, buf[:n]...)
			}
		}
	}
	w, env, lag := audiotest.Similarity(audiotest.Decimate(pcm, 2), audiotest.Decimate(got, 2), 24000, 24000/20)
	t.Logf("48 kHz → Opus → 24 kHz PCM → Opus → 48 kHz: correlation waveform %.3f, envelope %.3f, at lag %d samples", w, env, lag)
	// Two Opus generations keep the speech, not the waveform's phase
	// (audiotest.Similarity): the envelope must match, the waveform
	// closely.
	if env < 0.9 || w < 0.8 {
		t.Errorf("correlation waveform %.3f (want ≥ 0.8), envelope %.3f (want ≥ 0.9)", w, env)
	}
}

func TestAllocs(t *testing.T) {
	pkts := clientPackets(t, speech(t))
	d, _ := NewDecoder(24000)
	e, _ := NewEncoder(24000, 0)
	i := 0
	push := func() {
		for _, f := range d.Push(uint16(i), uint32(i*960), pkts[i%len(pkts)]) {
			_, _ = e.Write(f.PCM)
		}
		i++
	}
	for range 10 {
		push()
	}
	if n := testing.AllocsPerRun(100, push); n != 0 {
		t.Errorf("decode + encode of one packet: %v allocations, want 0", n)
	}
	lossy := func() { i++; push() } // every other packet lost: PLC and FEC
	for range 10 {
		lossy()
	}
	if n := testing.AllocsPerRun(100, lossy); n != 0 {
		t.Errorf("decode with concealment: %v allocations, want 0", n)
	}
}

// TestEncoderTenMs: with FrameMs 10 every packet is 10 ms (480 samples on
// the RTP clock, per its TOC), a partial frame is flushed as one more, and
// the speech survives the round trip as with 20 ms packets; other frame
// lengths are refused.
func TestEncoderTenMs(t *testing.T) {
	pcm := speech(t) // 48 kHz
	in := make([]byte, 0, len(pcm))
	for i := 0; i+2 <= len(pcm); i += 2 { // 48 → 24 kHz
		in = binary.LittleEndian.AppendUint16(in, uint16(int16((int(pcm[i])+int(pcm[i+1]))/2)))
	}
	e, err := NewEncoderConfig(EncoderConfig{Rate: 24000, FrameMs: 10})
	if err != nil {
		t.Fatal(err)
	}
	if e.FrameSamples() != 240 {
		t.Fatalf("FrameSamples = %d, want 240", e.FrameSamples())
	}
	client, _ := opus.NewDecoder(48000, 1)
	buf := make([]int16, 5760)
	var got []int16
	packets := 0
	take := func(ps []Packet) {
		for _, p := range ps {
			packets++
			if d, err := PacketDuration(p.Payload); err != nil || d != 480 {
				t.Fatalf("packet %d: duration %d (%v), want 480", packets, d, err)
			}
			n, err := client.Decode(p.Payload, buf)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, buf[:n]...)
		}
	}
	ps, err := e.Write(in)
	if err != nil {
		t.Fatal(err)
	}
	take(ps)
	ps, err = e.Flush()
	if err != nil {
		t.Fatal(err)
	}
	take(ps)
	if want := (len(in)/2 + 239) / 240; packets != want {
		t.Fatalf("%d packets, want %d", packets, want)
	}
	w, env, lag := audiotest.Similarity(audiotest.Decimate(pcm, 2), audiotest.Decimate(got, 2), 24000, 24000/20)
	t.Logf("10 ms packets: correlation waveform %.3f, envelope %.3f, at lag %d samples", w, env, lag)
	if env < 0.9 || w < 0.8 {
		t.Errorf("correlation waveform %.3f (want ≥ 0.8), envelope %.3f (want ≥ 0.9)", w, env)
	}
	for _, ms := range []int{5, 15, 40, -10} {
		if _, err := NewEncoderConfig(EncoderConfig{Rate: 24000, FrameMs: ms}); err == nil {
			t.Errorf("FrameMs %d accepted", ms)
		}
	}
}

// TestDecoderPartial: with 10 ms client packets every other Push returns
// no frame and leaves half a frame in Partial, under the Seq and
// Timestamp of the frame the next Push returns, whose first half it is
// byte for byte; that holds when the frame is completed by a packet, by
// concealment of a lost one, and by DTX padding. After a Push that ends
// on a frame, Partial is empty.
func TestDecoderPartial(t *testing.T) {
	pcm := speech(t) // 48 kHz
	e, err := NewEncoderConfig(EncoderConfig{Rate: 48000, FrameMs: 10})
	if err != nil {
		t.Fatal(err)
	}
	in := make([]byte, 0, 2*len(pcm))
	for _, v := range pcm {
		in = binary.LittleEndian.AppendUint16(in, uint16(v))
	}
	pkts, err := e.Write(in)
	if err != nil {
		t.Fatal(err)
	}
	const rate = 16000
	half := 2 * FrameSamples(rate) / 2
	d, err := NewDecoder(rate)
	if err != nil {
		t.Fatal(err)
	}
	var part Frame
	var partPCM []byte
	checked := map[string]int{}
	ts := uint32(0)
	seq := uint16(0)
	for i, p := range pkts {
		how := "packet"
		switch {
		case i%40 == 21: // lost: the next packet's Push conceals it
			seq++
			ts += 480
			continue
		case i%40 == 31: // DTX: a timestamp jump without lost packets
			ts += 4800
			how = "dtx"
		case i%40 == 22:
			how = "concealed"
		}
		fs := d.Push(seq, ts, p.Payload)
		seq++
		ts += 480
		if partPCM != nil {
			if len(fs) == 0 || fs[0].Seq != part.Seq || fs[0].Timestamp != part.Timestamp || !bytes.Equal(fs[0].PCM[:half], partPCM) {
				t.Fatalf("packet %d (%s): the frame after Partial %+v is %v", i, how, part, fs)
			}
			checked[how]++
			partPCM = nil
		}
		part = d.Partial()
		switch len(part.PCM) {
		case 0:
		case half:
			partPCM = append([]byte(nil), part.PCM...)
		default:
			t.Fatalf("packet %d: Partial holds %d bytes, want 0 or %d", i, len(part.PCM), half)
		}
	}
	t.Logf("frames checked against Partial: %v", checked)
	for _, how := range []string{"packet", "concealed", "dtx"} {
		if checked[how] == 0 {
			t.Errorf("no frame completed by %s was checked: %v", how, checked)
		}
	}
}
