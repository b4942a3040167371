package setupbench

import (
	"fmt"
	"slices"
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
	kinds := map[string]string{} // client kind → its name in the results
	for _, r := range results {
		if _, ok := kinds[r.Kind]; !ok || r.Client != r.Kind {
			kinds[r.Kind] = r.Client
		}
	}
	has := func(k string) bool { _, ok := kinds[k]; return ok }
	chromium := has(ClientChromium) || has(ClientChromiumSPED) || has(ClientChromiumSPEDNoPQ)
	browser := chromium || has(ClientFirefox)
	b.WriteString("Each cell is `ms (round trips; expected)`. Clients:")
	if chromium {
		name := kinds[ClientChromium]
		for _, k := range []string{ClientChromiumSPED, ClientChromiumSPEDNoPQ} {
			if name == "" {
				name, _, _ = strings.Cut(kinds[k], " with ")
			}
		}
		fmt.Fprintf(&b, " headless %s running the demo page (`internal/web`), one browser per client (with `--force-fieldtrials=WebRTC-IceHandshakeDtls/Enabled/` for chromium-sped, and also `--disable-features=WebRtcPqcForDtls` for chromium-sped-nopq), a fresh tab per call; "+
			"times taken in the page on its `performance.now()` clock (first echo: `getStats` polled every 5 ms; first audio at backend: the backend's clock mapped onto the page's).", name)
	}
	if has(ClientFirefox) {
		fmt.Fprintf(&b, " Headless %s running the demo page (`internal/web`) in a network namespace of the run's, one browser, a fresh page per call; "+
			"times taken in the page on its `performance.now()` clock (first audio at backend: the backend's wall clock against the page's `performance.timeOrigin`).", kinds[ClientFirefox])
	}
	if has(ClientPion) {
		fmt.Fprintf(&b, " Pion (`callclient`), ICE check tick %s", opts.ClientICETick)
		if opts.ClientICETick >= pionCheckInterval {
			b.WriteString(" (Pion's default)")
		}
		if opts.ClientSkipHelloVerify {
			b.WriteString(", its DTLS server skips HelloVerifyRequest")
		} else {
			b.WriteString(", its DTLS server sends HelloVerifyRequest (Pion's default)")
		}
		b.WriteString(".")
	}
	b.WriteString(" The DTLS column is the transceiver's role and `-dtls-version`; chromium-sped's calls have SPED (the handshake in the ICE checks), which makes it the DTLS server with DTLS 1.3.\n\n")

	b.WriteString("| Client | Path | DTLS | Runs (failed) | Answer | ICE connected | DTLS connected | First audio at backend | First echo at client | vs direct at backend | Data channel open | Gathering before POST |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	cell := func(s Stats, exp float64) string {
		if s.Median == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f (%.2f; %s)", s.Median, s.RTTs(rtt), trimFloat(exp))
	}
	key := func(r Result) string { return r.Kind + "/" + r.DTLSRole + "/" + r.DTLSVersion }
	label := func(r Result) string {
		if isSPED(r.Kind) {
			return r.Kind + " " + r.Path
		}
		return r.Kind + " " + r.Path + " " + r.DTLSRole + "/" + r.DTLSVersion
	}
	dtlsCell := func(r Result) string {
		if isSPED(r.Kind) {
			return "SPED (server, 1.3)"
		}
		return r.DTLSRole + ", " + r.DTLSVersion
	}
	direct := map[string]Result{}
	for _, r := range results {
		if r.Path == PathDirect && r.Runs > r.Failures {
			direct[key(r)] = r
		}
	}
	for _, r := range results {
		if r.Runs == 0 {
			fmt.Fprintf(&b, "| %s | %s | %s | – | %s |||||||| \n", r.Client, r.Path, dtlsCell(r), r.Note)
			continue
		}
		vs := "–"
		if d, ok := direct[key(r)]; ok && r.Path != PathDirect && r.FirstAudioBackendMS.Median > 0 {
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
		fmt.Fprintf(&b, "| %s | %s | %s | %d (%d) | %s | %s | %s | **%s** | %s | %s | %s | %s |\n",
			r.Client, r.Path, dtlsCell(r), r.Runs, r.Failures,
			cell(r.SignalingMS, r.Expected.Signaling), cell(r.ICEMS, r.Expected.ICE), cell(r.DTLSMS, r.Expected.DTLS),
			cell(r.FirstAudioBackendMS, r.Expected.FirstAudioBackend), cell(r.FirstAudioClientMS, r.Expected.FirstAudioClient),
			vs, dc, gather)
	}
	b.WriteString("\nFrom the answer's arrival, in round trips (median of each call's phase minus its answer): ")
	var fromAnswer []string
	for _, r := range results {
		if r.FirstAudioBackendFromAnswerMS.Median > 0 {
			fromAnswer = append(fromAnswer, fmt.Sprintf("%s: ICE %.2f, DTLS %.2f, backend %.2f, echo %.2f", label(r),
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
			spread = append(spread, fmt.Sprintf("%s min %.1f, median %.1f, p90 %.1f, max %.1f", label(r), s.Min, s.Median, s.P90, s.Max))
		}
	}
	b.WriteString(strings.Join(spread, "; "))
	b.WriteString(".\n")
	for _, r := range results {
		if r.Note != "" && r.Runs > 0 {
			fmt.Fprintf(&b, "\n%s: %s.", label(r), r.Note)
		}
		for _, e := range r.Errors {
			fmt.Fprintf(&b, "\n%s failure: %s", label(r), e)
		}
	}

	b.WriteString("\n\nExpected round trips, from the start of the POST (the package comment of `bench/setup` has the detail):\n\n")
	b.WriteString("| Phase | RTT | Why |\n|---|---|---|\n")
	b.WriteString("| Answer | 1 | POST → 201 with the complete answer (warm connection: the proxies do not delay the TCP handshake) |\n")
	if chromium {
		b.WriteString("| ICE connected | +1 | Chromium reports `connected` when its first check succeeds (the pair is writable); it nominates afterwards, with USE-CANDIDATE on its next scheduled check of that pair (0–60 ms later), which nothing waits for. TURN: CreatePermission and the first check (a Send indication) leave back to back, no extra round trip |\n")
		b.WriteString("| DTLS connected | +1 (role client), +2 (role server) | DTLS 1.2 full handshake, counted at the page. Role client: the transceiver's ClientHello leaves with the answer to Chromium's first check; Chromium keeps it and answers as the pair becomes writable (no HelloVerifyRequest), so its Finished comes 1 RTT after ICE. Role server: Chromium's ClientHello leaves as soon as the pair is writable and the transceiver answers at once: 2 RTT |\n")
	}
	if has(ClientFirefox) {
		b.WriteString("| ICE connected | +1 | Firefox nominates on every check: its first check's answer connects its ICE |\n")
		b.WriteString("| DTLS connected | +1 (role client), +2 (role server) | DTLS 1.2 full handshake, counted at the page. Role client: the transceiver's ClientHello leaves right after the answer to Firefox's first check; Firefox drops DTLS that reaches it before its ICE layer has taken that answer, and a dropped ClientHello waits for the transceiver's retransmission (2.5 × answer → first check). Role server: Firefox's ClientHello leaves once its ICE is up: 2 RTT |\n")
	}
	if browser {
		b.WriteString("| DTLS connected, `-dtls-version 1.3` | +1 (both roles) | DTLS 1.3 (Chromium and Firefox take it): in role server the browser, DTLS client, is done as it takes the transceiver's first flight, a round trip before DTLS 1.2's; in role client the browser, DTLS server, waits for the transceiver's Finished either way |\n")
	}
	if has(ClientChromiumSPEDNoPQ) {
		b.WriteString("| ICE and DTLS connected, SPED | +1 | chromium-sped-nopq: the ClientHello rides Chromium's first check, the transceiver's DTLS 1.3 ServerHello…Finished the response to it; Chromium's pair turns writable and its DTLS client is done on that one response |\n")
	}
	if has(ClientChromiumSPED) {
		b.WriteString("| DTLS connected, SPED with Chromium's post-quantum ClientHello | +2 | chromium-sped: the ClientHello (an X25519MLKEM768 key share, 1,413 bytes) spans two datagrams; the first rides the first check, the second leaves once that check's response made Chromium's ICE writable, and the ServerHello flight answers it a round trip after the first check's |\n")
	}
	if has(ClientPion) {
		b.WriteString("| ICE connected | +2 (TURN +3) | Pion uses regular nomination: a check makes the pair valid (1), a USE-CANDIDATE check nominates it (1); the ICE-lite server selects the pair 0.5 RTT after the nomination leaves. TURN: CreatePermission first (+1) |\n")
		hvr := "the Pion client, DTLS server, sends HelloVerifyRequest (+1), then ServerHello…Done (+1)"
		if opts.ClientSkipHelloVerify {
			hvr = "the client, DTLS server, answers at once: +1 after ICE (the ClientHello rode with the nomination)"
		}
		b.WriteString("| DTLS connected | +2 (role client: " + hvr + "; role server: ClientHello after ICE, no HelloVerifyRequest, 2 RTT) | DTLS 1.2 full handshake, counted at the client (Pion has no DTLS 1.3) |\n")
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
		fmt.Fprintf(&b, "* %s: POST → first audio at backend %.2f RTT (≤ 3 RTT: %s; the protocols as this client runs them allow %s; %+.1f ms over that, processing and timers); DTLS connected %.2f RTT after the answer.\n",
			label(r), r.RTTs, verdict, trimFloat(r.Expected.FirstAudioBackend), excess, r.DTLSFromAnswerMS.RTTs(rtt))
	}
	for _, r := range results {
		d, ok := direct[key(r)]
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
		fmt.Fprintf(&b, "* Relay over direct, %s: %+.2f ms median, %+.2f ms min (< 1 ms: %s).\n", label(r), delta, dmin, verdict)
	}
	for _, r := range results {
		d, ok := direct[key(r)]
		if r.Path != PathTURN || !ok || r.FirstAudioBackendMS.Median == 0 {
			continue
		}
		delta := r.FirstAudioBackendMS.Median - d.FirstAudioBackendMS.Median
		total := delta + r.GatheringMS.Median - d.GatheringMS.Median
		fmt.Fprintf(&b, "* TURN over direct, %s: %+.1f ms (%+.2f RTT) after the POST, %+.1f ms (%+.2f RTT) counting its gathering.\n",
			label(r), delta, delta/ms(rtt), total, total/ms(rtt))
	}
	return b.String()
}

// impairment describes Options.Loss and DropFlight, or "" without them.
func impairment(opts Options) string {
	var parts []string
	if opts.Loss > 0 {
		parts = append(parts, fmt.Sprintf("%s%% random loss each way", trimFloat(100*opts.Loss)))
	}
	if opts.Audio != 300*time.Millisecond && slices.Contains(opts.Clients, ClientPion) {
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
