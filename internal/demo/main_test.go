package demo

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines after all tests. The browser test
// stops Chromium and every chromedp goroutine in its cleanup (chromedp.Cancel,
// then the allocator's cancel, which waits for the process and its output
// readers), so no goroutine needs to be ignored.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
