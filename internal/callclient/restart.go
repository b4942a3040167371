package callclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/sdpfrag"
)

// RestartICE restarts ICE on pc, a connected client session whose
// Location is sessionURL and whose current ETag is etag (RFC 9725 §4.3):
//
//	PATCH <sessionURL>
//	If-Match: <etag>
//	Content-Type: application/trickle-ice-sdpfrag
//	<new offer's fragment: new ice-ufrag, ice-pwd, candidates>
//
//	200 OK
//	ETag: <the new ICE session's tag>
//	<answer fragment: the server's new ice-ufrag, ice-pwd and candidate>
//
// It creates an offer with fresh credentials, sends its fragment, applies
// the answer fragment to pc's last remote answer and returns the new ETag.
// header holds extra request headers (authorization, region); nil for
// none. DTLS and SRTP carry on over the new ICE session.
func RestartICE(ctx context.Context, httpc *http.Client, pc *webrtc.PeerConnection, sessionURL, etag string, header http.Header) (string, error) {
	remote := pc.RemoteDescription()
	if remote == nil {
		return "", fmt.Errorf("%w: ICE restart before the answer was applied", ErrSignaling)
	}
	lastAnswer := remote.SDP
	offer, err := pc.CreateOffer(&webrtc.OfferOptions{ICERestart: true})
	if err != nil {
		return "", fmt.Errorf("ICE restart offer: %w", err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		return "", fmt.Errorf("ICE restart: set local description: %w", err)
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return "", fmt.Errorf("%w: ICE restart gathering: %w", ErrConnect, ctx.Err())
	}
	frag, err := sdpfrag.FromSDP(pc.LocalDescription().SDP)
	if err != nil {
		return "", fmt.Errorf("ICE restart: own offer: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, sessionURL, strings.NewReader(frag.String()))
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrSignaling, err)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Content-Type", sdpfrag.ContentType)
	req.Header.Set("If-Match", etag)
	resp, err := httpc.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w: PATCH: %w", ErrSignaling, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, sdpfrag.MaxLen))
	if err != nil {
		return "", fmt.Errorf("%w: reading PATCH answer: %w", ErrSignaling, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%w: PATCH: %s: %s", ErrSignaling, resp.Status, errorMessage(body))
	}
	ans, err := sdpfrag.Parse(string(body))
	if err != nil {
		return "", fmt.Errorf("%w: PATCH answer: %w", ErrSignaling, err)
	}
	if ans.Ufrag == "" {
		return "", fmt.Errorf("%w: PATCH answer has no ice-ufrag and ice-pwd", ErrSignaling)
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: ans.ApplyTo(lastAnswer)}); err != nil {
		return "", fmt.Errorf("%w: ICE restart: set remote description: %w", ErrSignaling, err)
	}
	tag := resp.Header.Get("ETag")
	if tag == "" {
		return "", fmt.Errorf("%w: PATCH 200 without ETag", ErrSignaling)
	}
	return tag, nil
}
