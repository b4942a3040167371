#!/usr/bin/python3
"""A call from GStreamer's webrtcbin (libnice ICE) to a Switchboard signaling URL.

Sends a 440 Hz tone as Opus, opens the oai-events data channel and sends a
ping on it, and prints one JSON line: whether ICE connected, whether the ping
came back, how many audio buffers came back decoded and their loudest level.
Exits 0 when the call did all of that, 1 otherwise. Run by the demo package's
TestGStreamerCall (docs/interop.md); needs Debian's gstreamer1.0-nice,
gstreamer1.0-plugins-{base,good,bad}, python3-gst-1.0 and the GstWebRTC and
GstSdp typelibs.

usage: gst_call.py URL [--add-local-ip ADDR] [--seconds N]
"""
import argparse
import json
import sys
import urllib.request

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstWebRTC", "1.0")
gi.require_version("GstSdp", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

PIPELINE = (
    "webrtcbin name=wb bundle-policy=max-bundle "
    "audiotestsrc is-live=true wave=sine freq=440 volume=0.3 ! audioconvert ! audioresample ! "
    "opusenc ! rtpopuspay pt=111 ! "
    "application/x-rtp,media=audio,encoding-name=OPUS,payload=111,clock-rate=48000 ! wb."
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--add-local-ip", action="append", default=[],
                    help="an address libnice should also gather on (it skips loopback otherwise)")
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()

    Gst.init(None)
    loop = GLib.MainLoop()
    pipe = Gst.parse_launch(PIPELINE)
    wb = pipe.get_by_name("wb")
    # Keep the agent's Python wrapper alive as long as the pipeline: PyGObject
    # (3.42) drops a reference it does not own when a wrapper of the
    # ice-agent property goes away, which frees webrtcbin's agent.
    ice = wb.get_property("ice-agent")
    for a in args.add_local_ip:
        ice.emit("add-local-ip-address", a)
    res = {"gstreamer": Gst.version_string(), "connected": False, "dc_echo": False,
           "audio_buffers": 0, "peak_db": -200.0, "status": 0, "error": ""}
    nonce = "gst-ping-%d" % GLib.random_int()

    def fail(msg):
        res["error"] = msg
        loop.quit()

    def done_if_complete():
        if res["connected"] and res["dc_echo"] and res["audio_buffers"] > 50 and res["peak_db"] > -60:
            loop.quit()

    def post_offer(offer_sdp):
        req = urllib.request.Request(args.url, data=offer_sdp.encode(), method="POST",
                                     headers={"Content-Type": "application/sdp"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                res["status"] = r.status
                answer = r.read().decode()
        except Exception as e:  # noqa: BLE001 - reported, not raised
            return fail("POST: %s" % e)
        _, sdp = GstSdp.SDPMessage.new_from_text(answer)
        desc = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, sdp)
        wb.emit("set-remote-description", desc, Gst.Promise.new())

    def on_gathering(element, _pspec):
        if element.get_property("ice-gathering-state") == GstWebRTC.WebRTCICEGatheringState.COMPLETE:
            # A complete offer (ICE-lite answers once, no trickle).
            GLib.idle_add(lambda: post_offer(element.get_property("local-description").sdp.as_text()) and False)

    def on_offer(promise, _data):
        reply = promise.get_reply()
        offer = reply.get_value("offer")
        wb.emit("set-local-description", offer, Gst.Promise.new())

    def on_negotiation_needed(element):
        element.emit("create-offer", None, Gst.Promise.new_with_change_func(on_offer, None))

    def on_ice_state(element, _pspec):
        st = element.get_property("ice-connection-state")
        if st in (GstWebRTC.WebRTCICEConnectionState.CONNECTED, GstWebRTC.WebRTCICEConnectionState.COMPLETED):
            res["connected"] = True
        elif st == GstWebRTC.WebRTCICEConnectionState.FAILED:
            fail("ICE failed")

    def on_pad_added(_element, pad):
        if pad.direction != Gst.PadDirection.SRC:
            return
        sink = Gst.parse_bin_from_description(
            "rtpopusdepay ! opusdec ! audioconvert ! level name=lvl interval=100000000 post-messages=true ! fakesink sync=false",
            True)
        pipe.add(sink)
        sink.sync_state_with_parent()
        pad.link(sink.get_static_pad("sink"))

        def count(_pad, _info):
            res["audio_buffers"] += 1
            return Gst.PadProbeReturn.OK
        sink.get_by_name("lvl").get_static_pad("src").add_probe(Gst.PadProbeType.BUFFER, count)

    def on_message(_bus, msg):
        if msg.type == Gst.MessageType.ERROR:
            err, dbg = msg.parse_error()
            fail("pipeline: %s (%s)" % (err, dbg))
        elif msg.type == Gst.MessageType.ELEMENT and msg.get_structure().get_name() == "level":
            peak = msg.get_structure().get_value("peak")
            if peak:
                res["peak_db"] = max(res["peak_db"], max(peak))
            done_if_complete()

    wb.connect("on-negotiation-needed", on_negotiation_needed)
    wb.connect("notify::ice-gathering-state", on_gathering)
    wb.connect("notify::ice-connection-state", on_ice_state)
    wb.connect("pad-added", on_pad_added)
    bus = pipe.get_bus()
    bus.add_signal_watch()
    bus.connect("message", on_message)

    pipe.set_state(Gst.State.READY)
    dc = wb.emit("create-data-channel", "oai-events", None)
    if dc is None:
        print(json.dumps(dict(res, error="create-data-channel failed")))
        return 1

    def on_open(channel):
        channel.emit("send-string", json.dumps({"type": "ping", "nonce": nonce}))

    def on_string(_channel, s):
        if nonce in s:
            res["dc_echo"] = True
            done_if_complete()

    dc.connect("on-open", on_open)
    dc.connect("on-message-string", on_string)
    pipe.set_state(Gst.State.PLAYING)
    GLib.timeout_add(int(args.seconds * 1000), lambda: fail("timed out") or False)
    loop.run()
    pipe.set_state(Gst.State.NULL)
    del ice
    ok = res["connected"] and res["dc_echo"] and res["audio_buffers"] > 50 and res["peak_db"] > -60
    if ok:
        res["error"] = ""
    print(json.dumps(res))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
