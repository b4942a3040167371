//go:build cgo

package vad

/*
#cgo pkg-config: webrtc-audio-processing
#include <stddef.h>
#include <stdint.h>

// The C interface of WebRTC's voice activity detector
// (webrtc/common_audio/vad/include/webrtc_vad.h), which Debian's
// libwebrtc-audio-processing (0.3) builds and exports but whose header it
// does not install; these are its declarations.
typedef struct WebRtcVadInst VadInst;
VadInst* WebRtcVad_Create(void);
void WebRtcVad_Free(VadInst* handle);
int WebRtcVad_Init(VadInst* handle);
int WebRtcVad_set_mode(VadInst* handle, int mode);
int WebRtcVad_Process(VadInst* handle, int fs, const int16_t* audio_frame, size_t frame_length);
*/
import "C"

import (
	"errors"
	"fmt"
)

// engine is one instance of WebRTC's voice activity detector: a Gaussian
// mixture model over six sub-band log energies (80 Hz to 4 kHz) whose
// noise model adapts as it runs. It keeps state between frames, so each
// audio stream needs its own engine. Not safe for concurrent use.
type engine struct {
	inst *C.VadInst
}

// newEngine returns an engine in the given aggressiveness mode, 0 (least
// aggressive: most frames called speech) to 3 (most aggressive). Close
// frees it.
func newEngine(mode int) (*engine, error) {
	inst := C.WebRtcVad_Create()
	if inst == nil {
		return nil, errors.New("vad: WebRtcVad_Create failed")
	}
	if C.WebRtcVad_Init(inst) != 0 {
		C.WebRtcVad_Free(inst)
		return nil, errors.New("vad: WebRtcVad_Init failed")
	}
	if C.WebRtcVad_set_mode(inst, C.int(mode)) != 0 {
		C.WebRtcVad_Free(inst)
		return nil, fmt.Errorf("vad: WebRtcVad_set_mode(%d) failed", mode)
	}
	return &engine{inst: inst}, nil
}

// process classifies one frame of rate Hz mono samples (rate 8000, 16000,
// 32000 or 48000; 10, 20 or 30 ms of samples) and reports whether it
// holds speech.
func (e *engine) process(rate int, frame []int16) (bool, error) {
	if e.inst == nil {
		return false, ErrClosed
	}
	if len(frame) == 0 {
		return false, errors.New("vad: empty frame")
	}
	switch C.WebRtcVad_Process(e.inst, C.int(rate), (*C.int16_t)(&frame[0]), C.size_t(len(frame))) {
	case 1:
		return true, nil
	case 0:
		return false, nil
	default:
		return false, fmt.Errorf("vad: WebRtcVad_Process refused %d samples at %d Hz", len(frame), rate)
	}
}

// close frees the engine; later calls do nothing.
func (e *engine) close() {
	if e.inst != nil {
		C.WebRtcVad_Free(e.inst)
		e.inst = nil
	}
}
