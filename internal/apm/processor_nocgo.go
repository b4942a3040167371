//go:build !cgo

package apm

// processor stands in for WebRTC's audio processing module in a build
// without cgo, where New fails with ErrUnavailable.
type processor struct{}

func newProcessor(int, bool, int) (*processor, error) { return nil, ErrUnavailable }

func (*processor) render([]int16) error         { return ErrUnavailable }
func (*processor) capture([]int16, int) error   { return ErrUnavailable }
func (*processor) echoStats() (EchoStats, bool) { return EchoStats{}, false }
func (*processor) close()                       {}
