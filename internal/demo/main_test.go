package demo

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines after all tests. (The browser
// tests that call the demo are in internal/testsupport/e2e.)
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
