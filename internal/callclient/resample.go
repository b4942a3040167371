package callclient

// Resampling through SpeexDSP's resampler (libspeexdsp, Xiph.Org), the one
// VoIP stacks use, linked with cgo like libopus. It is called directly: no
// Go binding of it is kept up to date, and the three calls below are all
// this package needs.

/*
#cgo pkg-config: speexdsp
#include <speex/speex_resampler.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// resampleQuality is SpeexDSP's quality (0-10): 10 is its best; a file is
// converted once, offline, so speed does not matter.
const resampleQuality = 10

// resample converts interleaved 16-bit PCM of the given channel count from
// rate in to rate out with SpeexDSP (a windowed-sinc filter, anti-aliased,
// at quality resampleQuality), flushing the filter's delay so the output
// has the input's length at the new rate, give or take a sample.
func resample(samples []int16, channels, in, out int) ([]int16, error) {
	if in == out || len(samples) == 0 {
		return samples, nil
	}
	var cerr C.int
	st := C.speex_resampler_init(C.spx_uint32_t(channels), C.spx_uint32_t(in), C.spx_uint32_t(out), resampleQuality, &cerr)
	if st == nil {
		return nil, fmt.Errorf("resampler %d Hz to %d Hz: %s", in, out, C.GoString(C.speex_resampler_strerror(cerr)))
	}
	defer C.speex_resampler_destroy(st)
	// The filter delays its output by its input latency: feed that much
	// silence after the samples, and skip as much output at the start.
	skip := int(C.speex_resampler_get_output_latency(st)) * channels
	flush := int(C.speex_resampler_get_input_latency(st)) * channels
	frames := len(samples) / channels
	want := int(int64(frames)*int64(out)/int64(in)) * channels
	dst := make([]int16, want+skip+64*channels)
	src := make([]int16, len(samples)+flush)
	copy(src, samples)
	done := 0
	for read := 0; read < len(src); {
		inLen := C.spx_uint32_t((len(src) - read) / channels)
		outLen := C.spx_uint32_t((len(dst) - done) / channels)
		if outLen == 0 {
			break
		}
		if e := C.speex_resampler_process_interleaved_int(st,
			(*C.spx_int16_t)(unsafe.Pointer(&src[read])), &inLen,
			(*C.spx_int16_t)(unsafe.Pointer(&dst[done])), &outLen); e != 0 {
			return nil, fmt.Errorf("resampler %d Hz to %d Hz: %s", in, out, C.GoString(C.speex_resampler_strerror(e)))
		}
		if inLen == 0 && outLen == 0 {
			break
		}
		read += int(inLen) * channels
		done += int(outLen) * channels
	}
	if done < skip {
		return nil, fmt.Errorf("resampler %d Hz to %d Hz: %d samples out, fewer than its latency", in, out, done)
	}
	res := dst[skip:done]
	return res[:min(len(res), want)], nil
}
