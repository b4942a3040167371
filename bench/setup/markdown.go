package setupbench

import (
	"fmt"
	"strings"
	"time"
)

// Markdown renders results as a section for docs/benchmarks.md: the
// medians of each phase in ms and in round trips beside the expected
// count, the cost against the direct path with the same DTLS role, the
// round-trip model, and the goals (docs/benchmarks.md, "Targets").
func Markdown(results []Result, opts Options) string {
	o, err := opts.withDefaults()
	if err == nil {
		opts = o
	}
	rtt := opts.RTT
	var b strings.Builder
	runs := 0
	for _, r := range results {
		runs = max(runs, r.Runs)
	}
	fmt.Fprintf(&b, "Setup latency from the POST of the offer, RTT %s (%s each way, userspace delay proxies on loopback), %d runs per row, medians.\n", rtt, rtt/2, runs)
	if imp := impairment(opts); imp != "" {
		fmt.Fprintf(&b, "Media path impaired: %s.\n", imp)
	}
	chromium := opts.Client == ClientChromium
	browser := chromium || opts.Client == ClientFirefox
	switch opts.Client {
	case ClientChromium:
		name := "Chromium"
		for _, r := range results {
			if strings.HasPrefix(r.Client, "Chromium") {
				name = r.Client
				break
			}
		}
		fmt.Fprintf(&b, "Each cell is `ms (round trips; expected)`. Client: headless %s running the demo page (`internal/web`), one browser, a fresh tab per call; "+
			"times taken in the page on its `performance.now()` clock (first echo: `getStats` polled every 5 ms; first audio at backend: the backend's clock mapped onto the page's).\n\n", name)
	case ClientFirefox:
		name := "Firefox"
		for _, r := range results {
			if strings.HasPrefix(r.Client, "Firefox") {
				name = r.Client
				break
			}
		}
		fmt.Fprintf(&b, "Each cell is `ms (round trips; expected)`. Client: headless %s running the demo page (`internal/web`) in a network namespace of the run's, one browser, a fresh page per call; "+
			"times taken in the page on its `performance.now()` clock (first echo: `getStats` polled every 5 ms; first audio at backend: the backend's wall clock against the page's `performance.timeOrigin`).\n\n", name)
	default:
		fmt.Fprintf(&b, "Each cell is `ms (round trips; expected)`. Client: Pion (`callclient`), ICE check tick %s", opts.ClientICETick)
		if opts.ClientICETick >= pionCheckInterval {
			b.WriteString(" (Pion's default)")
		}
		if opts.ClientSkipHelloVerify {
			b.WriteString(", its DTLS server skips HelloVerifyRequest")
		} else {
			b.WriteString(", its DTLS server sends HelloVerifyRequest (Pion's default)")
		}
		b.WriteString(".\n\n")
	}

	b.WriteString("| Path | DTLS role | Runs (failed) | Answer | ICE connected | DTLS connected | First audio at backend | First echo at client | vs direct at backend | Data channel open | Gathering before POST |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	cell := func(s Stats, exp float64) string {
		if s.Median == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f (%.2f; %s)", s.Median, s.RTTs(rtt), trimFloat(exp))
	}
	direct := map[string]Result{}
	for _, r := range results {
		if r.Path == PathDirect && r.Runs > r.Failures {
			direct[r.DTLSRole] = r
		}
	}
	for _, r := range results {
		if r.Runs == 0 {
			fmt.Fprintf(&b, "| %s | %s | – | %s |||||||| \n", r.Path, r.DTLSRole, r.Note)
			continue
		}
		vs := "–"
		if d, ok := direct[r.DTLSRole]; ok && r.Path != PathDirect && r.FirstAudioBackendMS.Median > 0 {
			delta := r.FirstAudioBackendMS.Median - d.FirstAudioBackendMS.Median
			vs = fmt.Sprintf("%+.1f ms (%+.2f RTT, ×%.2f)", delta, delta/ms(rtt), r.FirstAudioBackendMS.Median/d.FirstAudioBackendMS.Median)
		}
		gather := "–"
		if r.GatheringMS.Median >= 0.05*ms(rtt) || r.Expected.Gathering > 0 {
			gather = cell(r.GatheringMS, r.Expected.Gathering)
		}
		dc := "–"
		if r.DataChannelMS.Median > 0 {
			dc = fmt.Sprintf("%.1f (%.2f)", r.DataChannelMS.Median, r.DataChannelMS.RTTs(rtt))
		}
		fmt.Fprintf(&b, "| %s | %s | %d (%d) | %s | %s | %s | **%s** | %s | %s | %s | %s |\n",
			r.Path, r.DTLSRole, r.Runs, r.Failures,
			cell(r.SignalingMS, r.Expected.Signaling), cell(r.ICEMS, r.Expected.ICE), cell(r.DTLSMS, r.Expected.DTLS),
			cell(r.FirstAudioBackendMS, r.Expected.FirstAudioBackend), cell(r.FirstAudioClientMS, r.Expected.FirstAudioClient),
			vs, dc, gather)
	}
	b.WriteString("\nFrom the answer's arrival, in round trips (median of each call's phase minus its answer): ")
	var fromAnswer []string
	for _, r := range results {
		if r.FirstAudioBackendFromAnswerMS.Median > 0 {
			fromAnswer = append(fromAnswer, fmt.Sprintf("%s/%s ICE %.2f, DTLS %.2f, backend %.2f, echo %.2f", r.Path, r.DTLSRole,
				r.ICEFromAnswerMS.RTTs(rtt), r.DTLSFromAnswerMS.RTTs(rtt), r.FirstAudioBackendFromAnswerMS.RTTs(rtt), r.FirstAudioClientFromAnswerMS.RTTs(rtt)))
		}
	}
	b.WriteString(strings.Join(fromAnswer, "; "))
	b.WriteString(".\n")
	b.WriteString("\nSpread of first audio at backend (ms): ")
	var spread []string
	for _, r := range results {
		if r.FirstAudioBackendMS.Median > 0 {
			s := r.FirstAudioBackendMS
			spread = append(spread, fmt.Sprintf("%s/%s min %.1f, median %.1f, p90 %.1f, max %.1f", r.Path, r.DTLSRole, s.Min, s.Median, s.P90, s.Max))
		}
	}
	b.WriteString(strings.Join(spread, "; "))
	b.WriteString(".\n")
	for _, r := range results {
		if r.Note != "" && r.Runs > 0 {
			fmt.Fprintf(&b, "\n%s: %s.", r.Path, r.Note)
		}
		for _, e := range r.Errors {
			fmt.Fprintf(&b, "\n%s/%s failure: %s", r.Path, r.DTLSRole, e)
		}
	}

	b.WriteString("\n\nExpected round trips, from the start of the POST (the package comment of `bench/setup` has the detail):\n\n")
	b.WriteString("| Phase | RTT | Why |\n|---|---|---|\n")
	b.WriteString("| Answer | 1 | POST → 201 with the complete answer (warm connection: the proxies do not delay the TCP handshake) |\n")
	switch {
	case chromium:
		b.WriteString("| ICE connected | +1 | Chromium reports `connected` when its first check succeeds (the pair is writable); it nominates afterwards, with USE-CANDIDATE on its next scheduled check of that pair (0–60 ms later), which nothing waits for. TURN: CreatePermission and the first check (a Send indication) leave back to back, no extra round trip |\n")
		b.WriteString("| DTLS connected | +1 (role client), +2 (role server) | DTLS 1.2 full handshake, counted at the page. Role client: the transceiver's ClientHello leaves with the answer to Chromium's first check; Chromium keeps it and answers as the pair becomes writable (no HelloVerifyRequest), so its Finished comes 1 RTT after ICE. Role server: Chromium's ClientHello leaves as soon as the pair is writable and the transceiver answers at once: 2 RTT |\n")
	case browser:
		b.WriteString("| ICE connected | +1 | Firefox nominates on every check: its first check's answer connects its ICE |\n")
		b.WriteString("| DTLS connected | +1 (role client), +2 (role server) | DTLS 1.2 full handshake, counted at the page. Role client: the transceiver's ClientHello leaves right after the answer to Firefox's first check; Firefox drops DTLS that reaches it before its ICE layer has taken that answer, and a dropped ClientHello waits for the transceiver's retransmission (2.5 × answer → first check). Role server: Firefox's ClientHello leaves once its ICE is up: 2 RTT |\n")
	default:
		b.WriteString("| ICE connected | +2 (TURN +3) | Pion uses regular nomination: a check makes the pair valid (1), a USE-CANDIDATE check nominates it (1); the ICE-lite server selects the pair 0.5 RTT after the nomination leaves. TURN: CreatePermission first (+1) |\n")
		hvr := "the Pion client, DTLS server, sends HelloVerifyRequest (+1), then ServerHello…Done (+1)"
		if opts.ClientSkipHelloVerify {
			hvr = "the client, DTLS server, answers at once: +1 after ICE (the ClientHello rode with the nomination)"
		}
		b.WriteString("| DTLS connected | +2 (role client: " + hvr + "; role server: ClientHello after ICE, no HelloVerifyRequest, 2 RTT) | DTLS 1.2 full handshake, counted at the client |\n")
	}
	b.WriteString("| First audio at backend | +0.5 | first RTP after connected, half a round trip to the transceiver, then the bridge on loopback |\n")
	b.WriteString("| First echo at client | +0.5 | back |\n")
	b.WriteString("| Gathering (before POST) | TURN 2 | Allocate → 401 → authenticated Allocate; the offer is complete, so the POST waits |\n")

	b.WriteString("\nGoals:\n\n")
	for _, r := range results {
		if r.FirstAudioBackendMS.Median == 0 {
			continue
		}
		verdict := "missed"
		if r.RTTs <= 3 {
			verdict = "met"
		}
		excess := r.FirstAudioBackendMS.Median - r.Expected.FirstAudioBackend*ms(rtt)
		fmt.Fprintf(&b, "* %s, DTLS role %s: POST → first audio at backend %.2f RTT (≤ 3 RTT: %s; the protocols as this client runs them allow %s; %+.1f ms over that, processing and timers).\n",
			r.Path, r.DTLSRole, r.RTTs, verdict, trimFloat(r.Expected.FirstAudioBackend), excess)
	}
	for _, r := range results {
		d, ok := direct[r.DTLSRole]
		if r.Path != PathRelay || !ok || r.FirstAudioBackendMS.Median == 0 {
			continue
		}
		delta := r.FirstAudioBackendMS.Median - d.FirstAudioBackendMS.Median
		dmin := r.FirstAudioBackendMS.Min - d.FirstAudioBackendMS.Min
		// Half the min-to-p90 spread of the noisier of the two: what one
		// median can be off by on this machine.
		noise := max(r.FirstAudioBackendMS.P90-r.FirstAudioBackendMS.Min, d.FirstAudioBackendMS.P90-d.FirstAudioBackendMS.Min) / 2
		verdict := fmt.Sprintf("no difference beyond the run-to-run spread of ±%.1f ms, so this harness can bound the relay's cost only to that; its per-packet cost needs a forwarding benchmark", noise)
		if delta > noise {
			verdict = fmt.Sprintf("missed: %+.1f ms is beyond the ±%.1f ms spread", delta, noise)
		}
		fmt.Fprintf(&b, "* Relay over direct, DTLS role %s: %+.2f ms median, %+.2f ms min (< 1 ms: %s).\n", r.DTLSRole, delta, dmin, verdict)
	}
	for _, r := range results {
		d, ok := direct[r.DTLSRole]
		if r.Path != PathTURN || !ok || r.FirstAudioBackendMS.Median == 0 {
			continue
		}
		delta := r.FirstAudioBackendMS.Median - d.FirstAudioBackendMS.Median
		total := delta + r.GatheringMS.Median - d.GatheringMS.Median
		fmt.Fprintf(&b, "* TURN over direct, DTLS role %s: %+.1f ms (%+.2f RTT) after the POST, %+.1f ms (%+.2f RTT) counting its gathering.\n",
			r.DTLSRole, delta, delta/ms(rtt), total, total/ms(rtt))
	}
	return b.String()
}

// impairment describes Options.Loss and DropFlight, or "" without them.
func impairment(opts Options) string {
	var parts []string
	if opts.Loss > 0 {
		parts = append(parts, fmt.Sprintf("%s%% random loss each way", trimFloat(100*opts.Loss)))
	}
	if opts.Audio != 300*time.Millisecond && opts.Client == ClientPion {
		parts = append(parts, fmt.Sprintf("the client sends %v of audio per call", opts.Audio))
	}
	switch opts.DropFlight {
	case DropToClient:
		parts = append(parts, "each call's first DTLS datagram toward the client dropped")
	case DropToServer:
		parts = append(parts, "each call's first DTLS datagram toward the server dropped")
	}
	return strings.Join(parts, ", ")
}

func trimFloat(f float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", f), "0"), ".")
}
