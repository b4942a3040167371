#!/usr/bin/python3
"""GStreamer webrtcbin takes internal/peer's SDP answer.

For each round, a webrtcbin (max-bundle) with an Opus audio stream and an
oai-events data channel (the "video" round adds a recvonly VP8 transceiver,
which the answer rejects) makes an offer, waits for ICE gathering to
complete (or 3 s), POSTs it to URL/offer?round=NAME, sets the answer the
server returns as its remote description, and records whether webrtcbin
took it and each transceiver's mid and negotiated direction. Prints the
rounds as one JSON array on stdout. Run by sdp_interop_test.go's
TestGStreamerTakesAnswer; needs Debian's python3-gst-1.0,
gir1.2-gst-plugins-bad-1.0, gstreamer1.0-nice and the base, good and bad
plugins.

usage: gst_offer.py URL
"""
import json
import sys
import urllib.parse
import urllib.request

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstWebRTC", "1.0")
gi.require_version("GstSdp", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

AUDIO = (
    "webrtcbin name=wb bundle-policy=max-bundle "
    "audiotestsrc is-live=true wave=silence ! audioconvert ! audioresample ! "
    "opusenc ! rtpopuspay pt=111 ! "
    "application/x-rtp,media=audio,encoding-name=OPUS,payload=111,clock-rate=48000 ! wb."
)
VIDEO_CAPS = "application/x-rtp,media=video,encoding-name=VP8,payload=96,clock-rate=90000"


def run_round(url, name, video):
    res = {"name": name, "ok": False}
    loop = GLib.MainLoop()
    pipe = Gst.parse_launch(AUDIO)
    wb = pipe.get_by_name("wb")
    state = {"posted": False}

    def fail(msg):
        res["error"] = msg
        loop.quit()

    def on_answer_set(promise, _data):
        promise.wait()
        reply = promise.get_reply()
        if reply is not None and reply.has_field("error"):
            err = reply.get_value("error")
            GLib.idle_add(lambda: fail("set-remote-description: %s" % err) and False)
            return
        GLib.idle_add(lambda: report() and False)

    def report():
        res["signalingState"] = wb.get_property("signaling-state").value_nick
        res["transceivers"] = []
        i = 0
        while True:
            t = wb.emit("get-transceiver", i)
            if t is None:
                break
            res["transceivers"].append({"mid": t.get_property("mid"),
                                        "kind": t.get_property("kind").value_nick,
                                        "currentDirection": t.get_property("current-direction").value_nick})
            i += 1
        res["ok"] = True
        loop.quit()

    def post_offer():
        if state["posted"]:
            return
        state["posted"] = True
        offer = wb.get_property("local-description").sdp.as_text()
        req = urllib.request.Request(url + "/offer?round=" + urllib.parse.quote(name), data=offer.encode(),
                                     method="POST", headers={"Content-Type": "application/sdp"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                answer = r.read().decode()
        except Exception as e:  # noqa: BLE001 - reported, not raised
            return fail("POST /offer: %s" % e)
        ok, sdp = GstSdp.SDPMessage.new_from_text(answer)
        if ok != GstSdp.SDPResult.OK:
            return fail("the answer does not parse: %s" % ok)
        desc = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, sdp)
        wb.emit("set-remote-description", desc, Gst.Promise.new_with_change_func(on_answer_set, None))

    def on_gathering(element, _pspec):
        if element.get_property("ice-gathering-state") == GstWebRTC.WebRTCICEGatheringState.COMPLETE:
            GLib.idle_add(lambda: post_offer() and False)

    def on_offer(promise, _data):
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None else None
        if offer is None:
            GLib.idle_add(lambda: fail("create-offer: %s" % (reply.to_string() if reply else None)) and False)
            return
        wb.emit("set-local-description", offer, Gst.Promise.new())
        GLib.timeout_add(3000, lambda: post_offer() and False)

    def create_offer():
        wb.emit("create-offer", None, Gst.Promise.new_with_change_func(on_offer, None))

    def on_message(_bus, msg):
        if msg.type == Gst.MessageType.ERROR:
            err, dbg = msg.parse_error()
            fail("pipeline: %s (%s)" % (err, dbg))

    wb.connect("notify::ice-gathering-state", on_gathering)
    bus = pipe.get_bus()
    bus.add_signal_watch()
    bus.connect("message", on_message)
    pipe.set_state(Gst.State.READY)
    if video:
        wb.emit("add-transceiver", GstWebRTC.WebRTCRTPTransceiverDirection.RECVONLY, Gst.Caps.from_string(VIDEO_CAPS))
    if wb.emit("create-data-channel", "oai-events", None) is None:
        res["error"] = "create-data-channel failed"
        pipe.set_state(Gst.State.NULL)
        return res
    # One offer, once playing: on-negotiation-needed fires for the data
    # channel while the pipeline is still READY, where create-offer can
    # answer with no offer at all.
    pipe.set_state(Gst.State.PLAYING)
    GLib.idle_add(lambda: create_offer() and False)
    GLib.timeout_add(20000, lambda: fail("timed out") or False)
    loop.run()
    bus.remove_signal_watch()
    pipe.set_state(Gst.State.NULL)
    return res


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    Gst.init(None)
    results = [run_round(sys.argv[1], "audio", False), run_round(sys.argv[1], "video", True)]
    print(json.dumps({"gstreamer": Gst.version_string(), "rounds": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
