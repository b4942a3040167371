package callclient

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// WAV parsing errors. Every error returned by ReadWAV wraps one of them.
var (
	ErrNotWAV            = errors.New("wav: not a RIFF/WAVE file")
	ErrMalformedWAV      = errors.New("wav: malformed file")
	ErrUnsupportedFormat = errors.New("wav: unsupported format")
)

// maxWAVSize bounds the bytes ReadWAV accepts, so a bad size field cannot
// make it allocate without limit. 64 MiB is about 5.8 minutes of 48 kHz
// 16-bit stereo.
const maxWAVSize = 64 << 20

// opusRates are the rates libopus encodes natively; a WAV file at one of
// them is encoded at its own rate, any other rate is resampled to 48 kHz
// first (resample.go).
var opusRates = map[int]bool{8000: true, 12000: true, 16000: true, 24000: true, 48000: true}

// WAV format tags (the fmt chunk's wFormatTag).
const (
	wavFormatPCM        = 0x0001
	wavFormatExtensible = 0xFFFE
)

// WAV is decoded 16-bit linear PCM.
type WAV struct {
	SampleRate int     // Hz, minWAVRate to maxWAVRate (8 to 192 kHz)
	Channels   int     // 1 or 2
	Samples    []int16 // interleaved by channel
}

// Duration is the play-out time of the samples.
func (w *WAV) Duration() time.Duration {
	if w.SampleRate == 0 || w.Channels == 0 {
		return 0
	}
	frames := len(w.Samples) / w.Channels
	return time.Duration(frames) * time.Second / time.Duration(w.SampleRate)
}

// LoadWAV reads and parses the WAV file at path.
func LoadWAV(path string) (*WAV, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w, err := ReadWAV(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}

// ReadWAV parses a RIFF/WAVE stream holding 16-bit PCM, mono or stereo, at
// any rate from 8 to 192 kHz (22,050 Hz from espeak-ng, 44,100 Hz from a
// CD: encodeOpus resamples what libopus does not take). It accepts WAVE_FORMAT_PCM and
// WAVE_FORMAT_EXTENSIBLE with the PCM sub-format, skips chunks other than
// "fmt " and "data" (honouring the RIFF pad byte after odd-sized chunks),
// and rejects anything else with an error wrapping ErrNotWAV,
// ErrMalformedWAV or ErrUnsupportedFormat.
func ReadWAV(r io.Reader) (*WAV, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxWAVSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxWAVSize {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrUnsupportedFormat, maxWAVSize)
	}
	return parseWAV(b)
}

func parseWAV(b []byte) (*WAV, error) {
	if len(b) < 12 || string(b[0:4]) != "RIFF" || string(b[8:12]) != "WAVE" {
		return nil, ErrNotWAV
	}
	var (
		w          WAV
		haveFmt    bool
		blockAlign int
	)
	rest := b[12:]
	for len(rest) > 0 {
		if len(rest) < 8 {
			return nil, fmt.Errorf("%w: truncated chunk header", ErrMalformedWAV)
		}
		id := string(rest[0:4])
		size := int64(binary.LittleEndian.Uint32(rest[4:8]))
		rest = rest[8:]
		if size > int64(len(rest)) {
			return nil, fmt.Errorf("%w: chunk %q claims %d bytes, %d left", ErrMalformedWAV, id, size, len(rest))
		}
		body := rest[:size]
		rest = rest[size:]
		if size%2 == 1 && len(rest) > 0 { // RIFF pad byte
			rest = rest[1:]
		}
		switch id {
		case "fmt ":
			if haveFmt {
				return nil, fmt.Errorf("%w: two fmt chunks", ErrMalformedWAV)
			}
			var err error
			if blockAlign, err = parseFmt(&w, body); err != nil {
				return nil, err
			}
			haveFmt = true
		case "data":
			if !haveFmt {
				return nil, fmt.Errorf("%w: data chunk before fmt chunk", ErrMalformedWAV)
			}
			if len(body)%blockAlign != 0 {
				return nil, fmt.Errorf("%w: data size %d is not a multiple of the block size %d", ErrMalformedWAV, len(body), blockAlign)
			}
			w.Samples = make([]int16, len(body)/2)
			for i := range w.Samples {
				w.Samples[i] = int16(binary.LittleEndian.Uint16(body[2*i:]))
			}
			return &w, nil
		}
	}
	if !haveFmt {
		return nil, fmt.Errorf("%w: no fmt chunk", ErrMalformedWAV)
	}
	return nil, fmt.Errorf("%w: no data chunk", ErrMalformedWAV)
}

// parseFmt fills w from a "fmt " chunk body and returns the block size.
func parseFmt(w *WAV, b []byte) (int, error) {
	if len(b) < 16 {
		return 0, fmt.Errorf("%w: fmt chunk is %d bytes, want at least 16", ErrMalformedWAV, len(b))
	}
	format := binary.LittleEndian.Uint16(b[0:2])
	channels := int(binary.LittleEndian.Uint16(b[2:4]))
	rate := int(binary.LittleEndian.Uint32(b[4:8]))
	blockAlign := int(binary.LittleEndian.Uint16(b[12:14]))
	bits := int(binary.LittleEndian.Uint16(b[14:16]))
	if format == wavFormatExtensible {
		// cbSize(2) validBits(2) channelMask(4) subFormat GUID(16): the
		// GUID's first two bytes are the real format tag.
		if len(b) < 40 {
			return 0, fmt.Errorf("%w: WAVE_FORMAT_EXTENSIBLE fmt chunk is %d bytes, want 40", ErrMalformedWAV, len(b))
		}
		format = binary.LittleEndian.Uint16(b[24:26])
	}
	switch {
	case format != wavFormatPCM:
		return 0, fmt.Errorf("%w: format tag 0x%04x, want PCM (1)", ErrUnsupportedFormat, format)
	case bits != 16:
		return 0, fmt.Errorf("%w: %d bits per sample, want 16", ErrUnsupportedFormat, bits)
	case channels != 1 && channels != 2:
		return 0, fmt.Errorf("%w: %d channels, want 1 or 2", ErrUnsupportedFormat, channels)
	case rate < minWAVRate || rate > maxWAVRate:
		return 0, fmt.Errorf("%w: sample rate %d Hz, want %d to %d", ErrUnsupportedFormat, rate, minWAVRate, maxWAVRate)
	case blockAlign != channels*2:
		return 0, fmt.Errorf("%w: block align %d, want %d", ErrMalformedWAV, blockAlign, channels*2)
	}
	w.SampleRate, w.Channels = rate, channels
	return blockAlign, nil
}

// The sample rates ReadWAV accepts, in Hz.
const minWAVRate, maxWAVRate = 8000, 192000
