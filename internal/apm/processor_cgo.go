//go:build cgo

package apm

/*
#cgo pkg-config: webrtc-audio-processing
#cgo CXXFLAGS: -std=c++11
#cgo LDFLAGS: -lstdc++
#include "apm_shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// processor is one instance of WebRTC's audio processing module. Not safe
// for concurrent use.
type processor struct {
	p *C.sb_apm
}

func newProcessor(rate int, aec bool, nsLevel int) (*processor, error) {
	a := C.int(0)
	if aec {
		a = 1
	}
	// The high-pass filter (80 Hz) comes with noise suppression, as in
	// WebRTC's own capture pipeline; the echo canceller alone leaves the
	// signal's band as it is.
	hpf := C.int(0)
	if nsLevel >= 0 {
		hpf = 1
	}
	p := C.sb_apm_new(C.int(rate), a, C.int(nsLevel), hpf)
	if p == nil {
		return nil, fmt.Errorf("%w: AudioProcessing at %d Hz (echo cancellation %v, noise suppression level %d) could not be set up", ErrConfig, rate, aec, nsLevel)
	}
	return &processor{p: p}, nil
}

// render gives the module one 10 ms frame of the far end (what the
// client plays).
func (p *processor) render(frame []int16) error {
	if e := C.sb_apm_render(p.p, (*C.int16_t)(unsafe.Pointer(&frame[0]))); e != 0 {
		return fmt.Errorf("apm: ProcessReverseStream: error %d", int(e))
	}
	return nil
}

// capture processes one 10 ms frame of the near end in place; delayMs is
// how much later than its reference the echo is expected.
func (p *processor) capture(frame []int16, delayMs int) error {
	if e := C.sb_apm_capture(p.p, (*C.int16_t)(unsafe.Pointer(&frame[0])), C.int(delayMs)); e != 0 {
		return fmt.Errorf("apm: ProcessStream: error %d", int(e))
	}
	return nil
}

func (p *processor) echoStats() (EchoStats, bool) {
	var s C.sb_apm_echo
	if C.sb_apm_echo_stats(p.p, &s) != 0 {
		return EchoStats{}, false
	}
	return EchoStats{ERL: int(s.erl), ERLE: int(s.erle), HasEcho: s.has_echo != 0, DelayMedianMs: int(s.delay_median_ms), DelayStdMs: int(s.delay_std_ms)}, true
}

func (p *processor) close() {
	if p.p != nil {
		C.sb_apm_free(p.p)
		p.p = nil
	}
}
