package transceiver

import (
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/httpapi"
	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/webrtctest"
)

// setupLine matches every a=setup line of an SDP.
var setupLine = regexp.MustCompile(`(?m)^a=setup:[a-z]+\r?$`)

// TestAnswerDTLSRole: the answer's a=setup complements the offer's (RFC
// 4145 §4): active → passive, passive → active, actpass → the configured
// role; and the call connects, each side taking the role its SDP says.
func TestAnswerDTLSRole(t *testing.T) {
	tests := []struct {
		offer, role, want string
	}{
		{"active", "client", "passive"},
		{"active", "server", "passive"},
		{"passive", "client", "active"},
		{"passive", "server", "active"},
		{"actpass", "client", "active"},
		{"actpass", "server", "passive"},
	}
	for _, tt := range tests {
		t.Run(tt.offer+"/"+tt.role, func(t *testing.T) {
			_, url := directServer(t, func(c *Config) { c.DTLSRole = tt.role })
			c := dialLive(t, url, func(o string) string { return setupLine.ReplaceAllString(o, "a=setup:"+tt.offer+"\r") })
			got := setupLine.FindAllString(c.answer, -1)
			if len(got) == 0 {
				t.Fatalf("answer has no a=setup:\n%s", c.answer)
			}
			for _, l := range got {
				if strings.TrimSpace(l) != "a=setup:"+tt.want {
					t.Fatalf("offer a=setup:%s, dtls_role %s: answer has %q, want a=setup:%s", tt.offer, tt.role, l, tt.want)
				}
			}
			waitFor(t, c.connected, 10*time.Second, "the client's connection")
		})
	}
}

// TestAnswerSPED: with Config.SPED an actpass offer whose a=ice-options
// lists SPED's options is answered a=setup:passive with the same options
// (internal/peer sped.go); without it, with DTLS pinned to 1.2 (SPED needs
// 1.3), or for an offer without them, the
// configured role and no option. A plain client still connects (it sends
// its checks without SPED's attributes).
func TestAnswerSPED(t *testing.T) {
	iceOptions := regexp.MustCompile(`(?m)^a=ice-options:.*\r?$`)
	withSPED := func(o string) string {
		return strings.Replace(o, "a=ice-ufrag:", "a=ice-options:trickle sped googspedv1\r\na=ice-ufrag:", 1)
	}
	for _, tc := range []struct {
		name       string
		sped       bool
		version    string
		offer      func(string) string
		setup, opt string
	}{
		{"offer with sped", true, "1.3", withSPED, "passive", "a=ice-options:sped googspedv1"},
		{"sped off", false, "1.3", withSPED, "active", ""},
		{"dtls pinned to 1.2", true, "1.2", withSPED, "active", ""},
		{"plain offer", true, "1.3", func(o string) string { return o }, "active", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := directServer(t, func(c *Config) { c.SPED, c.DTLSVersion = tc.sped, tc.version })
			c := dialLive(t, url, tc.offer)
			for _, l := range setupLine.FindAllString(c.answer, -1) {
				if strings.TrimSpace(l) != "a=setup:"+tc.setup {
					t.Fatalf("answer has %q, want a=setup:%s:\n%s", l, tc.setup, c.answer)
				}
			}
			got := strings.TrimSpace(strings.Join(iceOptions.FindAllString(c.answer, -1), ";"))
			if got != tc.opt {
				t.Fatalf("answer's ice-options %q, want %q", got, tc.opt)
			}
			waitFor(t, c.connected, 10*time.Second, "the client's connection")
		})
	}
}

// TestOfferRefused: offers that could only fail later are refused at once
// with a 400 that says why.
func TestOfferRefused(t *testing.T) {
	s, url := directServer(t)
	base := clientOffer(t, true)
	fp := regexp.MustCompile(`(?m)^a=fingerprint:.*\r?$`)
	ufrag := regexp.MustCompile(`(?m)^a=ice-ufrag:.*\r?$`)
	tests := []struct {
		name    string
		rewrite func(string) string
		mention string
	}{
		{"holdconn", func(o string) string { return setupLine.ReplaceAllString(o, "a=setup:holdconn\r") }, "holdconn"},
		{"unknown setup", func(o string) string { return setupLine.ReplaceAllString(o, "a=setup:sideways\r") }, "sideways"},
		{"fingerprint not hex", func(o string) string {
			return fp.ReplaceAllString(o, "a=fingerprint:sha-256 "+strings.Repeat("ZZ:", 31)+"ZZ\r")
		}, "hex"},
		{"fingerprint short", func(o string) string { return fp.ReplaceAllString(o, "a=fingerprint:sha-256 AB:CD\r") }, "32"},
		{"fingerprint one field", func(o string) string { return fp.ReplaceAllString(o, "a=fingerprint:sha-256\r") }, "hash function"},
		{"fingerprint unknown hash", func(o string) string {
			return fp.ReplaceAllString(o, "a=fingerprint:whirlpool "+strings.Repeat("AB:", 63)+"AB\r")
		}, "whirlpool"},
		{"no fingerprint", func(o string) string { return fp.ReplaceAllString(o, "a=x-no-fingerprint\r") }, "no a=fingerprint"},
		{"fingerprint without colons", func(o string) string {
			return fp.ReplaceAllStringFunc(o, func(l string) string {
				hash, digest, _ := strings.Cut(l, " ")
				return hash + " " + strings.ReplaceAll(digest, ":", "")
			})
		}, "written without colons"},
		{"audio and data channel in two BUNDLE groups", func(o string) string {
			return regexp.MustCompile(`(?m)^a=group:BUNDLE (\S+) (\S+)\r?$`).ReplaceAllString(o, "a=group:BUNDLE $1\r\na=group:BUNDLE $2\r")
		}, "2 BUNDLE groups"},
		{"two ICE credentials in one BUNDLE group", func(o string) string {
			n := 0
			return ufrag.ReplaceAllStringFunc(o, func(l string) string {
				if n++; n == 2 {
					return "a=ice-ufrag:otherUfragXYZ\r"
				}
				return l
			})
		}, "BUNDLE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			offer := tt.rewrite(base)
			if offer == base {
				t.Fatal("the rewrite changed nothing")
			}
			resp := post(t, url+"/v1/calls", "application/sdp", offer)
			var e httpapi.Error
			_ = json.NewDecoder(resp.Body).Decode(&e)
			if resp.StatusCode != http.StatusBadRequest || e.Error.Code != "bad_offer" || !strings.Contains(e.Error.Message, tt.mention) {
				t.Fatalf("status %d, error %+v; want 400 bad_offer mentioning %q", resp.StatusCode, e.Error, tt.mention)
			}
		})
	}
	if n := s.Sessions(); n != 0 {
		t.Fatalf("%d sessions after refused offers", n)
	}
}

// FuzzParseOffer: any body is either refused with an error wrapping
// ErrBadOffer or accepted with a DTLS role the answer can take; never a
// panic.
func FuzzParseOffer(f *testing.F) {
	f.Add(webrtctest.AudioOffer(f, true, true))
	f.Add("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\na=rtpmap:111 opus/48000/2\r\na=setup:active\r\na=fingerprint:sha-256 " + strings.Repeat("AB:", 31) + "AB\r\n")
	f.Fuzz(func(t *testing.T, offer string) {
		info, err := parseOffer(offer)
		if err != nil {
			if !errors.Is(err, ErrBadOffer) {
				t.Fatalf("error %v does not wrap ErrBadOffer", err)
			}
			return
		}
		switch info.dtlsRole {
		case 0, peer.DTLSClient, peer.DTLSServer:
		default:
			t.Fatalf("role %v", info.dtlsRole)
		}
	})
}
