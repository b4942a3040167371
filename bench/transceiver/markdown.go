package trxbench

import (
	"fmt"
	"math"
	"strings"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// Markdown renders res as the docs/benchmarks.md section: one row per
// format and N, then the PCM ÷ Opus CPU ratio per N when both formats ran.
func Markdown(res Result, opt Options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Transceiver pinned to its own core; generator, relay and echo agent on the other. %d run(s), each format with fresh processes in turn, medians; %v measured per N once all sessions were up.\n\n", res.Runs, res.Window)
	for _, f := range opt.Formats {
		fmt.Fprintf(&b, "Idle transceiver (%s): RSS %.0f KiB, %.0f goroutines.\n", f, res.IdleRSSKiB[f], res.IdleGoroutines[f])
	}
	b.WriteString("\n| format | N | transceiver cores | sessions per busy core | carried (sessions' worth) | carried per busy core | live heap KiB/session | RSS KiB/session | goroutines/session | delay in→bridge p50/p99 ms | paced send→out p50/p99 ms | setup p50/p99 ms | failures | packets not back | core 0 busy (generator+relay+agent) | spread |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, s := range res.Steps {
		bound := ""
		if s.GenBound {
			bound = " (generator-bound)"
		}
		fmt.Fprintf(&b, "| %s | %d | %.3f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %s / %s | %s / %s | %.0f / %.0f | %d | %.2f%% | %.2f%s | ±%.0f%% |\n",
			formatLabel(s.Format), s.N, s.TrxCores, s.PerCore, s.Carried, s.PerCoreCarried, s.LivePerSession, s.RSSPerSession, s.GoroutinesPerSession,
			ms(s.ToBackendP50), ms(s.ToBackendP99), ms(s.ToClientP50), ms(s.ToClientP99),
			s.SetupP50MS, s.SetupP99MS, s.Failures, 100*s.Loss, s.GenCores, bound, 100*res.Spread[i])
	}
	b.WriteString("\n\"Packets not back\" counts the echoed packets by distinct RTP sequence number, not by payload: the transceiver numbers its paced packets itself, and a PCM session re-encodes the agent's audio, so it is audio received against audio sent, not an echo matched packet for packet.\n")
	if len(res.PCMRatio) > 0 {
		b.WriteString("\nPCM ÷ Opus passthrough, transceiver CPU per carried session, within each run (median):\n\n| N | ratio | runs |\n|---:|---:|---:|\n")
		for _, r := range res.PCMRatio {
			fmt.Fprintf(&b, "| %d | %.2f× | %d |\n", r.N, r.Ratio, r.Runs)
		}
	}
	return b.String()
}

// formatLabel names a bridge format in the table.
func formatLabel(f string) string {
	if f == bridge.FormatOpus {
		return "Opus passthrough"
	}
	return "PCM " + f
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}
