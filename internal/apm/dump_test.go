package apm

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"
)

// TestDumpReplay: a dump holds every call a Cleaner was given, so that a
// fresh Cleaner fed the dump's records cleans the input to the same
// samples; a dump cut short gives the records before the cut and
// ErrDump; something else is refused.
func TestDumpReplay(t *testing.T) {
	const rate = 16000
	n := rate / 50
	// Noise with a syllable's rhythm (4 Hz), so that its echo is found
	// whatever the input's offset within a frame.
	far := whiteNoise(1, 5*rate, 3000)
	for i := range far {
		far[i] *= 0.55 + 0.45*math.Sin(2*math.Pi*4*float64(i)/rate)
	}
	near := whiteNoise(2, len(far), 30)
	for i := range near {
		if j := i - rate/5; j >= 0 {
			near[i] += 0.5 * far[j]
		}
	}
	fb, nb := pcmBytes(far), pcmBytes(near)
	cfg := Config{Rate: rate, EchoCancellation: true, GuardFirstReply: true}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var dump bytes.Buffer
	if err := c.DumpTo(&dump); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(100, 0)
	var want []byte
	for k := 0; (k+1)*n <= len(far); k++ {
		at := t0.Add(time.Duration(k) * 20 * time.Millisecond)
		if err := c.Played(at, fb[2*k*n:2*(k+1)*n]); err != nil {
			t.Fatal(err)
		}
		f := append([]byte(nil), nb[2*k*n:2*(k+1)*n]...)
		if err := c.Process(f, int64(k*n), at.Add(3*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		want = append(want, f...)
	}
	st := c.Stats()
	c.Close()
	if c.DumpErr() != nil {
		t.Fatal(c.DumpErr())
	}
	if !st.Measured {
		t.Fatalf("the echo was not found (delay %d ms): the test proves nothing about the gate", st.DelayMs)
	}

	replayInto := func(b []byte) ([]byte, int, error) {
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var got []byte
		recs := 0
		err = ReadDump(bytes.NewReader(b), func(rt int, rec DumpRecord) error {
			recs++
			if rt != rate {
				t.Fatalf("dump rate %d, want %d", rt, rate)
			}
			if rec.Kind == DumpPlayed {
				return r.Played(rec.At, rec.PCM)
			}
			f := append([]byte(nil), rec.PCM...)
			if err := r.Process(f, rec.Pos, rec.At); err != nil {
				return err
			}
			got = append(got, f...)
			return nil
		})
		return got, recs, err
	}
	got, recs, err := replayInto(dump.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if frames := len(far) / n; recs != 2*frames {
		t.Errorf("%d records, want %d", recs, 2*frames)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the replay cleaned the input differently from the session")
	}
	cut, _, err := replayInto(dump.Bytes()[:dump.Len()-100])
	if !errors.Is(err, ErrDump) || len(cut) == 0 {
		t.Errorf("a dump cut short: err %v after %d bytes of output, want ErrDump after some", err, len(cut))
	}
	if _, _, err := replayInto([]byte("RIFF....WAVE")); !errors.Is(err, ErrDump) {
		t.Errorf("not a dump: err %v, want ErrDump", err)
	}
}
