// Package chromium holds how Switchboard drives Debian's headless Chromium
// (through chromedp) for real-browser calls: the demo's browser test and
// the setup benchmark's Chromium client.
package chromium

import (
	"io"

	"github.com/chromedp/chromedp"
)

// Options returns chromedp allocator options for a headless Chromium at
// bin that makes WebRTC calls on this machine: the microphone is granted
// without a prompt and fed from the WAV file fakeAudio (looped), autoplay
// is allowed, loopback candidates are gathered, nothing reaches out to the
// network on its own, and its output goes to output. No user-data dir is
// set: chromedp makes a temporary profile, kills any child still using it
// when the browser exits, and removes it. Callers append their own options.
func Options(bin, fakeAudio string, output io.Writer) []chromedp.ExecAllocatorOption {
	return []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Headless,  // also --hide-scrollbars and --mute-audio
		chromedp.NoSandbox, // we may run as root (CI containers)
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		// This machine's network is closed: no background connections.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-breakpad", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.Flag("use-mock-keychain", true),
		// Hidden or background tabs must not throttle the page's timers
		// (stats polling, first-packet timing).
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("disable-backgrounding-occluded-windows", true),
		// Media: http://127.0.0.1 is a secure context, so getUserMedia
		// works without TLS.
		chromedp.Flag("use-fake-ui-for-media-stream", true),
		chromedp.Flag("use-fake-device-for-media-stream", true),
		chromedp.Flag("use-file-for-fake-audio-capture", fakeAudio),
		chromedp.Flag("autoplay-policy", "no-user-gesture-required"),
		// WebRTC: gather on loopback too (Chromium skips it by default), so
		// calls work in a network namespace with only lo.
		chromedp.Flag("allow-loopback-in-peer-connection", true),
		chromedp.CombinedOutput(output),
	}
}

// SPEDFieldTrial is the field trial that makes Chromium offer
// a=ice-options:goog-sped-v1 and carry its DTLS handshake in its ICE
// checks (libwebrtc's WebRTC-IceHandshakeDtls; internal/peer sped.go).
const SPEDFieldTrial = "WebRTC-IceHandshakeDtls/Enabled/"

// FieldTrials returns the option that forces libwebrtc field trials, e.g.
// SPEDFieldTrial ("Name/Group/" pairs, concatenated).
func FieldTrials(trials string) chromedp.ExecAllocatorOption {
	return chromedp.Flag("force-fieldtrials", trials)
}

// NoPQDTLS turns off Chromium's post-quantum DTLS key share (its feature
// WebRtcPqcForDtls, on in 156): with it Chromium's ClientHello carries an
// X25519MLKEM768 share of 1,216 bytes and spans two datagrams, so that a
// SPED handshake's ServerHello waits for the second, which Chromium sends
// once its ICE is up, a round trip after its first check.
func NoPQDTLS() chromedp.ExecAllocatorOption {
	return chromedp.Flag("disable-features", "WebRtcPqcForDtls")
}
