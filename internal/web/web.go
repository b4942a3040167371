// Package web serves the Switchboard demo page: one self-contained HTML
// file (inline CSS and vanilla JS, no external assets) in which a person
// clicks "Call", grants the microphone and talks with the agent (the
// parrot, which answers with what it heard; or the echo).
//
// The page speaks the signaling contract of docs/design.md §6: it POSTs a
// complete offer (ICE gathering finished) as application/sdp to
// /v1/calls (or the URL typed in the page), applies the 201 answer, opens
// the data channel "oai-events", and DELETEs the Location on hang-up.
//
// The server tells the page which agent answers (Page.Agent, as the
// body's data-agent attribute): with the parrot, which does not echo the
// client's data-channel messages, the page sends no pings, disables its
// Ping button and says why in its data-channel echo row. With an agent
// the server does not know (a standalone transceiver), it pings once the
// data channel opens and learns it: an echo, an "error" event back (the
// parrot's and OpenAI's answer to an event they do not handle: Ping is
// then disabled, with why), or nothing within 3 s (the row says so).
// Page.Auth (data-auth) makes the token field say that it is required.
// On hang-up (or when the server ends the call) it shows ICE, DTLS and
// the peer connection "closed" and empties its level meters.
//
// The page explains itself: a three-step hint for the agent behind it;
// an error shown by the Call button with what usually causes it (the
// backend down, 401, no media path to the relay, the microphone refused);
// a conversation view (who spoke when, how long after the end of your
// speech the agent answered, how soon it went quiet when talked over);
// and an events panel with every data-channel event, expandable to its
// JSON.
//
// For automated browser tests it exposes window.switchboard:
//
//	state     "idle" | "calling" | "connected" | "disconnected" | "failed" | "closed" | "ended"
//	agent     "parrot" | "echo" | "" (Page.Agent)
//	dcEcho    true once a ping on "oai-events" came back
//	setupMs   POST start → peer connection "connected"
//	echoMs    last data-channel ping round trip
//	location  absolute session URL
//	error     last error message, or null
//	hint      what usually causes the last error and what to do, or null
//	relay     the address the answer advertises ("ip:port/udp"), or null
//	stats     {packetsSent, packetsReceived, packetsLost, jitterMs, rttMs,
//	           audioLevel, totalAudioEnergy}, polled from getStats every 500 ms
//	messages  data-channel messages received
//	timing    ms from the POST: gathering, answer, ICE connected, DTLS
//	          connected, peer connected, data channel open, first inbound packet
//	talk      the conversation as heard in the page: youDb, agentDb (RMS of
//	          the last 10 ms of the microphone and of the agent's stream,
//	          dBFS), speaking ("you" | "agent" | "": your turn from the
//	          edge's speech events, or, for an agent without turn
//	          detection (turnEvents false), the microphone heard), events (the
//	          input_audio_buffer.* and output_audio_buffer.* events, with
//	          performance.now() times), turns [{n, onsetAt, endAt, replyMs,
//	          interrupted, quietMs, audioStartMs, audioEndMs, stoppedAt,
//	          startedAt, jb}]: replyMs is the end of your speech to the
//	          agent's first sound, quietMs your onset to 250 ms of agent
//	          quiet when you talked over it; stoppedAt and startedAt when
//	          speech_stopped and the reply's output_audio_buffer.started
//	          arrived; jb {before, after} the agent stream's getStats
//	          jitter buffer counters at speech_stopped and 300 ms into the
//	          reply
//	jitterBufferTarget  the agent receiver's jitterBufferTarget set by
//	          call(opts), ms, or null
//	call(opts), hangup(), ping()   opts: optional {url, iceServers,
//	          iceTransportPolicy, jitterBufferTarget (ms)}
//
// "ended" means the server ended the call (a switchboard.session.end event
// on oai-events, or the data channel or DTLS closing).
//
// and mirrors state in document.body.dataset.state.
package web

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"html"
	"net/http"
	"strings"
)

//go:embed index.html
var indexHTML []byte

// contentSecurityPolicy allows only the page's own inline script and style
// (by hash), fetches to any origin (the signaling URL is editable), and
// nothing else.
var contentSecurityPolicy = "default-src 'none'; " +
	"script-src " + inlineHash("script") + "; " +
	"style-src " + inlineHash("style") + "; " +
	"connect-src *; media-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// inlineHash returns the CSP source expression for the text of the page's
// first <tag> element; it panics at start-up if the page has none, which
// only an edit of index.html can cause.
func inlineHash(tag string) string {
	body := inlineElement(indexHTML, tag)
	if body == nil {
		panic("web: index.html has no <" + tag + "> element")
	}
	sum := sha256.Sum256(body)
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// inlineElement returns the bytes between "<tag>" and "</tag>", or nil.
func inlineElement(page []byte, tag string) []byte {
	open, end := []byte("<"+tag+">"), []byte("</"+tag+">")
	i := bytes.Index(page, open)
	if i < 0 {
		return nil
	}
	rest := page[i+len(open):]
	j := bytes.Index(rest, end)
	if j < 0 {
		return nil
	}
	return rest[:j]
}

// Page is what the server tells the page about itself.
type Page struct {
	// Agent is the agent mode behind the signaling API: "parrot" or
	// "echo" (package agent's ModeParrot, ModeEcho), or "" when the server
	// does not know (a backend of its own), which the page treats as an
	// agent that may echo data-channel pings, and learns from its first.
	Agent string
	// Auth says that offers need a client token (the server's auth is
	// on): the page says its token field is required.
	Auth bool
}

// agentAttr and authAttr are the body attributes, empty in index.html,
// that NewHandler fills with Page.Agent and Page.Auth ("on").
const (
	agentAttr = `data-agent=""`
	authAttr  = `data-auth=""`
)

// Handler serves the demo page at "/" and 404 elsewhere, for an agent it
// does not know (NewHandler with a zero Page). Mount it after the API
// routes, e.g. mux.Handle("/", web.Handler()).
func Handler() http.Handler { return NewHandler(Page{}) }

// NewHandler is Handler for the page p describes.
func NewHandler(p Page) http.Handler {
	page := bytes.Replace(indexHTML, []byte(agentAttr), []byte(`data-agent="`+html.EscapeString(p.Agent)+`"`), 1)
	if p.Auth {
		page = bytes.Replace(page, []byte(authAttr), []byte(`data-auth="on"`), 1)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" && !strings.EqualFold(r.URL.Path, "/index.html") {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(page)
	})
}
