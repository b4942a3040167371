//go:build !linux

package udpio

import (
	"errors"
	"fmt"
	"syscall"
)

// Drops would return the datagrams the kernel dropped on c's receive
// side; this OS does not tell, so it returns an error wrapping
// errors.ErrUnsupported.
func Drops(c syscall.Conn) (uint64, error) {
	return 0, fmt.Errorf("udpio: socket drop count: %w", errors.ErrUnsupported)
}
