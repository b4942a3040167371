package trxbench

import (
	"fmt"
	"math"
	"strings"
)

// Markdown renders res as the docs/benchmarks.md section.
func Markdown(res Result, opt Options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Transceiver pinned to its own core; generator, relay and echo agent on the other. %d run(s), medians; %v measured per N once all sessions were up.\n\n", res.Runs, res.Window)
	fmt.Fprintf(&b, "Idle transceiver: RSS %.0f KiB, %.0f goroutines.\n\n", res.IdleRSSKiB, res.IdleGoroutines)
	b.WriteString("| N | transceiver cores | sessions per busy core | carried (sessions' worth) | carried per busy core | live heap KiB/session | RSS KiB/session | goroutines/session | delay in→bridge p50/p99 ms | bridge→out p50/p99 ms | setup p50/p99 ms | failures | loss | core 0 busy (generator+relay+agent) | spread |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, s := range res.Steps {
		bound := ""
		if s.GenBound {
			bound = " (generator-bound)"
		}
		fmt.Fprintf(&b, "| %d | %.3f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %s / %s | %s / %s | %.0f / %.0f | %d | %.2f%% | %.2f%s | ±%.0f%% |\n",
			s.N, s.TrxCores, s.PerCore, s.Carried, s.PerCoreCarried, s.LivePerSession, s.RSSPerSession, s.GoroutinesPerSession,
			ms(s.ToBackendP50), ms(s.ToBackendP99), ms(s.ToClientP50), ms(s.ToClientP99),
			s.SetupP50MS, s.SetupP99MS, s.Failures, 100*s.Loss, s.GenCores, bound, 100*res.Spread[i])
	}
	return b.String()
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}
