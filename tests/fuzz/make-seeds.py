#!/usr/bin/env python3
"""make-seeds: write the named seed corpus of the fuzz targets (run once;
the seeds are committed). What each session seed must reach when the
corpus is replayed is listed in fuzz_session_reach.c."""
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def shortstr(s):
    b = s.encode()
    return bytes([len(b)]) + b


def longstr(b):
    return struct.pack(">I", len(b)) + b


def table(entries):
    body = b""
    for k, kind, v in entries:
        body += shortstr(k) + kind + v
    return struct.pack(">I", len(body)) + body


def frame(t, ch, payload, end=0xCE):
    return struct.pack(">BHI", t, ch, len(payload)) + payload + bytes([end])


def method(cls, mid, args):
    return struct.pack(">HH", cls, mid) + args


nested = table([("n", b"l", struct.pack(">q", -5)), ("s", b"S", longstr(b"deep"))])
headers = table([
    ("acemq-reply-to", b"S", longstr(b"replies")),
    ("nested", b"F", nested),
    ("list", b"A", struct.pack(">I", 5) + b"t\x01" + b"b\x07" + b""),
    ("when", b"T", struct.pack(">Q", 1700000000)),
    ("dec", b"D", b"\x02" + struct.pack(">I", 12345)),
    ("void", b"V", b""),
    ("bytes", b"x", longstr(b"\x00\x01\x02")),
    ("f", b"f", struct.pack(">f", 1.5)),
    ("d", b"d", struct.pack(">d", 2.5)),
])
flags = 0xFFFC  # every basic property
props = (struct.pack(">H", flags) + shortstr("application/json") + shortstr("gzip") + headers
         + b"\x02" + b"\x07" + shortstr("corr") + shortstr("replies") + shortstr("60000")
         + shortstr("m-1") + struct.pack(">Q", 1700000001) + shortstr("order")
         + shortstr("guest") + shortstr("app") + shortstr("c"))
publish = method(60, 40, b"\x00\x00" + shortstr("ex") + shortstr("rk") + b"\x01")
deliver = method(60, 60, shortstr("ctag") + struct.pack(">Q", 9) + b"\x00" + shortstr("ex") + shortstr("rk"))
start_ok = method(10, 11, table([("product", b"S", longstr(b"x"))]) + shortstr("PLAIN")
                  + longstr(b"\x00guest\x00guest") + shortstr("en_US"))
tune_ok = method(10, 31, struct.pack(">HIH", 2047, 131072, 60))
close = method(10, 50, struct.pack(">H", 320) + shortstr("CONNECTION_FORCED") + struct.pack(">HH", 0, 0))
header = struct.pack(">HHQ", 60, 0, 5) + props

seeds = {
    "frame_scan": {
        "publish-header-body": frame(1, 1, publish) + frame(2, 1, header) + frame(3, 1, b"hello"),
        "heartbeat": frame(8, 0, b""),
        "start-ok-plain": frame(1, 0, start_ok),
        "tune-ok": frame(1, 0, tune_ok),
        "regress-bad-end-octet": frame(3, 1, b"abc", end=0x00),
        "regress-heartbeat-on-channel": frame(8, 3, b""),
        "regress-unknown-type": frame(9, 1, b"x"),
        "regress-oversize-claim": struct.pack(">BHI", 3, 1, 0xFFFFFFFF) + b"x" * 16,
        "regress-truncated-header": b"\x01\x00",
        "regress-method-too-short": frame(1, 1, b"\x00\x3c"),
        "regress-empty-body-frame": frame(3, 1, b""),
    },
    "props": {
        "every-property": props,
        "no-properties": b"\x00\x00",
        "regress-flags-without-values": b"\xff\xfc",
        "regress-headers-length-overrun": b"\x20\x00" + struct.pack(">I", 0xFFFFFF00),
        "regress-continuation-flag": b"\x00\x01\x00\x00",
    },
    "table": {
        "nested-and-every-kind": headers,
        "empty": table([]),
        "regress-length-past-end": struct.pack(">I", 100) + b"\x01a",
        "regress-unknown-kind": table([("k", b"?", b"")]),
        "regress-deep-nesting": table([("a", b"F", table([("b", b"F", table([("c", b"F", table([]))]))]))]),
    },
    "method": {
        "basic-publish": publish,
        "basic-deliver": deliver,
        "connection-start-ok": start_ok,
        "connection-tune-ok": tune_ok,
        "connection-close": close,
        "basic-ack": method(60, 80, struct.pack(">Q", 5) + b"\x01"),
        "regress-unknown-method": method(99, 99, b""),
        "regress-shortstr-past-end": method(60, 40, b"\x00\x00\xff"),
        "regress-truncated-tune-ok": method(10, 31, b"\x07"),
    },
}

for target, files in seeds.items():
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
print("seeds written")


# ---- fuzz_session: scripts of events (see tests/fuzz/fuzz_session.c) ----
(CLIENT_RAW, BROKER_RAW, CONNECT_OK, CONNECT_FAIL, TIMER, CLIENT_CLOSE, CLIENT_SHUT,
 BROKER_CLOSE, RELOAD, CLIENT_SILENT, BROKER_SILENT, CLIENT_FRAME, BROKER_FRAME,
 AUTO_BROKER, CLIENT_READING, SHUTDOWN, BROKER_ERROR) = range(17)


def cf(k, p=0):
    return bytes([CLIENT_FRAME, k, p])


def bf(k, p=0):
    return bytes([BROKER_FRAME, k, p])


def raw(op, data):
    return bytes([op, len(data)]) + data


HANDSHAKE = cf(0) + bytes([CONNECT_OK]) + cf(1) + cf(2) + cf(3)
body_on_1 = frame(3, 1, b"abc")
session_seeds = {
    "valid-session": HANDSHAKE + cf(4, 0) + cf(5, 0) + cf(6, 3) + cf(6, 0) + cf(6, 6)
    + cf(7, 0) + cf(7, 3) + bf(5, 12) + bf(5, 12) + bf(5, 12) + cf(8, 4) + cf(8, 9)
    + cf(11, 0) + bf(6, 0) + cf(12, 0) + cf(13) + bf(13),
    "plain-vhost": cf(0) + bytes([CONNECT_OK]) + cf(1) + cf(2) + cf(3, 1) + cf(4, 0)
    + cf(6, 5) + cf(7, 3) + bf(5, 12) + cf(8, 4) + cf(13),
    "stream-publish": HANDSHAKE + cf(4, 0) + cf(5, 0) + cf(6, 0x90) + cf(6, 0x99) + cf(13),
    "reload-mid-session": HANDSHAKE + cf(4, 0) + bytes([RELOAD, 1]) + cf(6, 3)
    + bytes([RELOAD, 0]) + cf(6, 5) + cf(13),
    "broker-lost": HANDSHAKE + cf(4, 0) + cf(6, 3) + bytes([BROKER_CLOSE]),
    "broker-silent": cf(0) + bytes([CONNECT_OK]) + cf(1) + cf(2, 2) + cf(3)
    + bytes([BROKER_SILENT, CLIENT_SILENT]),
    # 72 deliveries of 8 KiB on the consumer's channel while the client
    # reads nothing: more than the socket and buffer_limit hold.
    "backpressure": HANDSHAKE + cf(4, 0) + cf(7, 1) + bytes([CLIENT_READING])
    + bf(5, 0x54) * 72 + bytes([CLIENT_READING]) + cf(13),
    "shutdown": HANDSHAKE + cf(4, 0) + bytes([SHUTDOWN]) + bf(13),
    "update-secret": HANDSHAKE + cf(17) + cf(4, 0) + cf(13),
    "regress-garbage-before-connect": cf(0) + raw(CLIENT_RAW, body_on_1)
    + bytes([CONNECT_OK]),
    "regress-random-before-connect": cf(0) + raw(CLIENT_RAW, b"\x17garbage-garbage")
    + bytes([CONNECT_OK]),
    "regress-close-before-connect": cf(0) + bytes([CLIENT_CLOSE, CONNECT_OK]),
    "regress-pipelined-handshake": cf(0) + cf(1) + cf(2) + cf(3) + cf(4, 0)
    + bytes([CONNECT_OK]) + cf(6, 3),
    "regress-connect-refused": cf(0) + bytes([CONNECT_FAIL]) + cf(1),
    "regress-timer-while-connecting": cf(0) + bytes([TIMER, CONNECT_OK]),
}
os.makedirs(os.path.join(here, "corpus", "session"), exist_ok=True)
for name, data in session_seeds.items():
    with open(os.path.join(here, "corpus", "session", name), "wb") as f:
        f.write(data)
session_seeds_cc = {
    "claim-offload": HANDSHAKE + cf(4, 0) + cf(5, 0) + cf(6, 15) + cf(6, 0x8c) + cf(6, 0x30)
    + cf(6, 2) + cf(13),
    "claim-rehydrate": HANDSHAKE + cf(4, 0) + cf(7, 9) + bf(5, 0x36) + bf(5, 0x30) + bf(5, 0x72)
    + bf(5, 0x3c) + cf(8, 4) + cf(11, 0) + bf(6, 0x36) + bf(9, 0x36) + cf(13),
    "claim-rehydrate-slow-client": HANDSHAKE + cf(4, 0) + cf(7, 9) + bytes([CLIENT_READING])
    + bf(5, 0x36) * 4 + bytes([CLIENT_CLOSE]),
    "claim-offload-client-vanishes": HANDSHAKE + cf(4, 0) + cf(6, 200) + bytes([CLIENT_CLOSE]),
}
for name, data in session_seeds_cc.items():
    with open(os.path.join(here, "corpus", "session", name), "wb") as f:
        f.write(data)
session_seeds_idem = {
    # consume from "q" (the idempotency rule's queue), deliveries carrying
    # message-ids m0..m3 (p & 0x80), acks, nacks and a recover
    "idempotency-duplicates": HANDSHAKE + cf(4, 0) + cf(7, 9) + bf(5, 0x84) + bf(5, 0x84)
    + bf(5, 0x85) + bf(5, 0x84) + cf(8, 4) + cf(9, 8) + cf(8, 13) + cf(19, 0) + cf(13),
    "idempotency-get-and-close": HANDSHAKE + cf(4, 0) + cf(11, 0) + bf(6, 0x84) + cf(11, 0)
    + bf(6, 0x84) + cf(12, 0) + bf(14, 0) + cf(13),
}
for name, data in session_seeds_idem.items():
    with open(os.path.join(here, "corpus", "session", name), "wb") as f:
        f.write(data)

session_seeds_schedule = {
    # publishes carrying x-delay (p & 4, p & 8): 1500 ms (p & 2), "soon"
    # (p & 1) and "-3": rewritten onto the ladder, or delivered at once
    "schedule-delayed-publish": HANDSHAKE + cf(4, 0) + cf(5, 0) + cf(6, 0x0e) + cf(6, 0x0d)
    + cf(6, 0x0c) + cf(6, 0x2e) + cf(13),
}
for name, data in session_seeds_schedule.items():
    with open(os.path.join(here, "corpus", "session", name), "wb") as f:
        f.write(data)

ladder_headers = table([
    ("x-schedule-exchange", b"S", longstr(b"billing")),
    ("x-schedule-routing-key", b"S", longstr(b"invoice.due")),
    ("x-schedule-due-at", b"l", struct.pack(">q", 1700000000500)),
    ("x-schedule-content-type", b"S", longstr(b"application/json")),
    ("x-death", b"A", longstr(b"F" + table([("queue", b"S", longstr(b"acemq.schedule.1s"))]))),
    ("x-first-death-queue", b"S", longstr(b"acemq.schedule.1s")),
    ("x-delay", b"S", longstr(b"1500")),
])
props_seeds_ladder = {
    # what the scheduler reads from the control queue, and a delay header
    "ladder-scheduling-headers": struct.pack(">H", 0x2000) + ladder_headers,
    "regress-ladder-due-at-string": struct.pack(">H", 0x2000) + table([
        ("x-schedule-exchange", b"S", longstr(b"")),
        ("x-schedule-routing-key", b"S", longstr(b"q")),
        ("x-schedule-due-at", b"S", longstr(b"5"))]),
}
for name, data in props_seeds_ladder.items():
    with open(os.path.join(here, "corpus", "props", name), "wb") as f:
        f.write(data)
# loop turns for the state layer's writer to answer (reading toggled twice)
PAUSE = bytes([CLIENT_READING, CLIENT_READING]) * 16
session_seeds_dedup = {
    # publishes to the default exchange (the dedup_publish rule's) carrying
    # x-deduplication-header m0..m3 (p & 0x80): mandatory ones with small
    # bodies (0xB1) and large ones the claim check streams (0x81), on a
    # confirmed channel 1 and an unconfirmed channel 2; a nack, a return, a
    # channel closed and reopened
    "dedup-publish": HANDSHAKE + cf(4, 0) + cf(5, 0) + cf(4, 1) + cf(6, 0xB1) + cf(6, 0xB1)
    + cf(6, 0x81) + cf(6, 0x81) + cf(6, 0x82) + cf(6, 0x82) + bf(9, 0xB1) + bf(8, 0x18)
    + cf(6, 0xB4) + cf(12, 0) + bf(14, 0) + cf(4, 0) + cf(6, 0xB1) + cf(13),
    # the scripted broker does not answer: identical publishes wait for the
    # first, then its ack (channel 1, tag 1) comes; the client vanishes
    "dedup-publish-in-flight": HANDSHAKE + cf(4, 0) + cf(5, 0) + bytes([AUTO_BROKER])
    + cf(6, 0xB1) + cf(6, 0xB1) + cf(6, 0xB1) + PAUSE + bf(7, 6) + PAUSE + cf(6, 0xB4) + PAUSE
    + bf(8, 9) + bytes([CLIENT_CLOSE]),
}
for name, data in session_seeds_dedup.items():
    with open(os.path.join(here, "corpus", "session", name), "wb") as f:
        f.write(data)

session_seeds_pool = {
    # pooled ("/" with rules 3): a channel in confirm mode closed after its
    # publish is confirmed (kept: the proxy's qos(0) answered), opened again
    # (taken from the kept ones, confirm.select answered by the proxy), a
    # channel without confirms (a plain one); then a client that vanishes
    # while the qos is out and its answer never comes
    "pool-kept-channel": bytes([RELOAD, 3]) + HANDSHAKE + cf(4, 0) + cf(5, 0) + cf(6, 3)
    + PAUSE + cf(12, 0) + PAUSE + cf(4, 0) + cf(5, 0) + cf(6, 3) + PAUSE + cf(12, 0) + PAUSE
    + cf(4, 0) + cf(6, 3) + PAUSE + cf(13),
    "pool-kept-channel-client-vanishes": bytes([RELOAD, 3]) + HANDSHAKE + cf(4, 0) + cf(5, 0)
    + cf(6, 3) + PAUSE + bytes([AUTO_BROKER]) + cf(12, 0) + PAUSE + bytes([CLIENT_CLOSE])
    + bytes([AUTO_BROKER]) + PAUSE,
}
session_seeds_surplus = {
    # a prefetch of 2 on channel 1 (cf 20, p 0x42) and a consume of "q":
    # the proxy asks the broker for 7 (the rule's prefetch_ahead of 5; its
    # qos before the consume, the client's after, both answered); 9
    # deliveries with message-ids of their own (0xC6: channel 1, consumer
    # ctag, p & 0x40 a fresh id), seven kept past the prefetch; acks (1,
    # up to 3, 5) let them go while the confirms are out; the client
    # cancels with some kept, then a recover, the broker's own cancel, and
    # the close
    "idempotency-surplus": HANDSHAKE + cf(4, 0) + cf(20, 0x42) + cf(7, 9) + PAUSE
    + bf(5, 0xC6) * 9 + PAUSE * 8 + cf(8, 4) + PAUSE + cf(8, 0x0D) + PAUSE + cf(8, 20) + PAUSE * 4
    + bf(5, 0xC6) * 4 + PAUSE * 4 + cf(21, 9) + PAUSE + cf(19, 0) + bf(16, 0x84) + PAUSE
    + cf(13),
    # deliveries kept while the timer looks at them (the fuzzer ages them:
    # their claims are renewed), then an ack lets them go
    # (a prefetch of 2, the rule asking 5 ahead)
    "idempotency-surplus-renewed": HANDSHAKE + cf(4, 0) + cf(20, 0x42) + cf(7, 9) + PAUSE
    + bf(5, 0xC6) * 6 + PAUSE * 8 + bytes([TIMER]) + PAUSE + bytes([TIMER]) + PAUSE
    + cf(8, 0x09) + PAUSE * 2 + bytes([TIMER]) + PAUSE + cf(13),
    # the client vanishes with deliveries kept and confirms out
    "idempotency-surplus-client-vanishes": HANDSHAKE + cf(4, 0) + cf(20, 0x42) + cf(7, 9)
    + PAUSE + bf(5, 0xC6) * 8 + PAUSE * 8 + cf(8, 0x05) + bytes([CLIENT_CLOSE]) + PAUSE,
}
for name, data in session_seeds_surplus.items():
    with open(os.path.join(here, "corpus", "session", name), "wb") as f:
        f.write(data)

for name, data in session_seeds_pool.items():
    with open(os.path.join(here, "corpus", "session", name), "wb") as f:
        f.write(data)
