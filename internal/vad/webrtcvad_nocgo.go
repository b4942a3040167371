//go:build !cgo

package vad

// engine stands in for WebRTC's VAD in a build without cgo, where
// NewDetector fails with ErrUnavailable.
type engine struct{}

func newEngine(int) (*engine, error) { return nil, ErrUnavailable }

func (*engine) process(int, []int16) (bool, error) { return false, ErrUnavailable }

func (*engine) close() {}
