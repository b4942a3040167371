package udpio

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Drops returns how many datagrams the kernel dropped on c's receive side
// since the socket was opened, almost all of them because its receive
// buffer was full when they arrived (the socket's sk_drops: the
// SK_MEMINFO_DROPS word of getsockopt SO_MEMINFO, Linux 4.x and later,
// the "drops" column of /proc/net/udp). The kernel keeps it in 32 bits,
// so it wraps after 2³² drops. Such a datagram never reaches the
// process: this count is the only trace it leaves. On another OS, or a
// kernel without the word, the error wraps errors.ErrUnsupported.
func Drops(c syscall.Conn) (uint64, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var info [unix.SK_MEMINFO_VARS]uint32
	size := uint32(unsafe.Sizeof(info))
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&size)), 0)
	}); err != nil {
		return 0, err
	}
	switch {
	case errno != 0:
		return 0, fmt.Errorf("udpio: getsockopt SO_MEMINFO: %w", errno)
	case size < (unix.SK_MEMINFO_DROPS+1)*4:
		return 0, fmt.Errorf("udpio: SO_MEMINFO has %d bytes, no drop count: %w", size, errors.ErrUnsupported)
	}
	return uint64(info[unix.SK_MEMINFO_DROPS]), nil
}
