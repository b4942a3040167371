//go:build !linux

package redistest

import "testing"

// ClosedPort returns a loopback TCP port where connections are refused.
// Off Linux it is a port FreePort returned: nothing holds it, so another
// process (a redis-server another test starts) may listen there before
// the test dials it. On Linux a bound, non-listening socket holds it
// until the test ends.
func ClosedPort(tb testing.TB) int {
	tb.Helper()
	return FreePort(tb)
}
