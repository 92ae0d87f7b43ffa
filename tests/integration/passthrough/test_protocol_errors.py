"""Protocol headers and malformed frames from raw clients: the proxy answers
with the same reply codes as the broker and stays healthy."""

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import amqp_wire as wire
import support

FRAME_MAX = 131072


# -- protocol header ----------------------------------------------------------

REFUSED_HEADERS = {
    "http-request-line": b"HTTP/1.1",
    "http-get": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "amqp-1.0": b"AMQP\x00\x01\x00\x00",
    "amqp-1.0-sasl": b"AMQP\x03\x01\x00\x00",
    "amqp-0-9-2": b"AMQP\x00\x00\x09\x02",
    "amqp-0-10": b"AMQP\x01\x01\x00\x0a",
    "zeros": b"\x00" * 8,
}

# Headers RabbitMQ 3.10 accepts for older protocol versions: it answers with
# connection.start (version 0-9 resp. 8-0) instead of refusing.
LEGACY_HEADERS = {
    "amqp-0-9": b"AMQP\x01\x01\x00\x09",
    "amqp-0-8": b"AMQP\x01\x01\x08\x00",
}


def send_header(port, data, timeout=5.0):
    """Send data, collect what comes back until EOF (or timeout).
    Returns (bytes, closed, seconds)."""
    s = socket.create_connection((support.HOST, port), timeout=timeout)
    t0 = time.monotonic()
    out = b""
    closed = False
    try:
        s.sendall(data)
        deadline = t0 + timeout
        while True:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                closed = True
                break
            except socket.timeout:
                break
            if not chunk:
                closed = True
                break
            out += chunk
    finally:
        s.close()
    return out, closed, time.monotonic() - t0


@pytest.mark.parametrize("name", list(REFUSED_HEADERS))
def test_refused_protocol_header(name, direct_port, proxy_port):
    data = REFUSED_HEADERS[name]
    with ThreadPoolExecutor(2) as ex:
        direct, proxy = ex.map(lambda p: send_header(p, data), (direct_port, proxy_port))
    print("direct:", direct, "proxy:", proxy)
    assert direct[:2] == (wire.PROTOCOL_HEADER, True)
    assert proxy[0] == direct[0]
    assert proxy[1], "proxy did not close the socket within 5 s"


def first_frame_after_header(port, data, timeout=5.0):
    s = socket.create_connection((support.HOST, port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + timeout
        while True:
            if len(out) >= 8 and out[:4] == b"AMQP":
                return out[:8]
            if len(out) >= 7:
                size = int.from_bytes(out[3:7], "big")
                if len(out) >= 8 + size:
                    return out[:8 + size]
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                return out
            if not chunk:
                return out
            out += chunk
    finally:
        s.close()


def describe_reply(data):
    if data.startswith(b"AMQP"):
        return "protocol header %r" % data
    if len(data) >= 11 and data[0] == wire.FRAME_METHOD:
        method, args = wire.parse_method(data[7:-1])
        if method == wire.CONNECTION_START:
            st = wire.parse_connection_start(args)
            return "connection.start version %d-%d" % (st["version_major"], st["version_minor"])
        return "method %r" % (method,)
    return repr(data[:40])


@pytest.mark.parametrize("name", list(LEGACY_HEADERS))
def test_legacy_protocol_header_like_broker(name, direct_port, proxy_port):
    data = LEGACY_HEADERS[name]
    direct = first_frame_after_header(direct_port, data)
    proxy = first_frame_after_header(proxy_port, data)
    print("direct: %s\nproxy:  %s" % (describe_reply(direct), describe_reply(proxy)))
    assert direct, "broker sent nothing"
    assert describe_reply(proxy) == describe_reply(direct)
    assert proxy == direct


def test_connection_start_identical(direct_port, proxy_port):
    direct = first_frame_after_header(direct_port, wire.PROTOCOL_HEADER)
    proxy = first_frame_after_header(proxy_port, wire.PROTOCOL_HEADER)
    assert describe_reply(direct) == "connection.start version 0-9"
    if proxy != direct:
        d = wire.parse_connection_start(wire.parse_method(direct[7:-1])[1])
        p = wire.parse_connection_start(wire.parse_method(proxy[7:-1])[1])
        assert p == d
    assert proxy == direct


# -- malformed frames after a correct handshake ---------------------------------


def _publish(ch=1):
    return wire.method_frame(ch, wire.BASIC_PUBLISH, wire.basic_publish_args("", "acemq-it-nowhere"))


BAD_FRAMES = {
    # name: (open channel 1 first?, bytes to send)
    "frame-end-not-ce": (True, wire.frame(wire.FRAME_METHOD, 1, wire.method_payload(
        wire.BASIC_PUBLISH, wire.basic_publish_args("", "x")), end=0x00)),
    "heartbeat-frame-end-not-ce": (False, wire.frame(wire.FRAME_HEARTBEAT, 0, b"", end=0xAB)),
    "body-frame-over-frame-max": (True, _publish() + wire.content_header_frame(1, FRAME_MAX + 100)
                                  + wire.frame(wire.FRAME_BODY, 1, b"x" * (FRAME_MAX + 100))),
    "method-frame-over-frame-max": (True, wire.frame(wire.FRAME_METHOD, 1, wire.method_payload(
        wire.BASIC_PUBLISH, wire.basic_publish_args("", "x")) + b"\x00" * FRAME_MAX)),
    "frame-payload-frame_max+1": (True, _publish() + wire.content_header_frame(1, FRAME_MAX + 1)
                                  + wire.frame(wire.FRAME_BODY, 1, b"y" * (FRAME_MAX + 1))),
    "unknown-frame-type": (True, wire.frame(9, 1, b"abc")),
    "header-without-publish": (True, wire.content_header_frame(1, 5)),
    "body-without-header": (True, wire.frame(wire.FRAME_BODY, 1, b"hello")),
    "body-after-publish-without-header": (True, _publish() + wire.frame(wire.FRAME_BODY, 1, b"hello")),
    "header-on-unopened-channel": (False, wire.content_header_frame(5, 5)),
    "header-on-channel-0": (False, wire.content_header_frame(0, 5)),
    "method-on-unopened-channel": (False, wire.method_frame(5, (60, 10), b"\x00\x00\x00\x00\x00\x0a\x00")),
    "publish-then-new-method": (True, _publish() + wire.method_frame(1, (60, 10), b"\x00\x00\x00\x00\x00\x0a\x00")),
}

# Frames RabbitMQ accepts: a frame whose payload is larger than frame_max - 8
# (so the whole frame exceeds frame_max) but not larger than frame_max.
ACCEPTED_FRAMES = {
    "frame-size-frame_max": (True, _publish() + wire.content_header_frame(1, FRAME_MAX - 8)
                             + wire.frame(wire.FRAME_BODY, 1, b"z" * (FRAME_MAX - 8))),
    "frame-size-frame_max+1": (True, _publish() + wire.content_header_frame(1, FRAME_MAX - 7)
                               + wire.frame(wire.FRAME_BODY, 1, b"z" * (FRAME_MAX - 7))),
    "frame-payload-frame_max": (True, _publish() + wire.content_header_frame(1, FRAME_MAX)
                                + wire.frame(wire.FRAME_BODY, 1, b"z" * FRAME_MAX)),
}

BASIC_QOS = (60, 10)
BASIC_QOS_OK = (60, 11)


def run_bad_client(port, open_channel, data, probe=False):
    """Handshake, send data, and report how the server reacts.

    Returns a dict: close (decoded connection.close or None), other (frames
    before it), eof (socket closed after our close-ok), t_close, t_eof, and
    for probe=True whether a basic.qos round trip on channel 1 still works.
    """
    res = {"close": None, "other": [], "eof": False, "t_close": None, "t_eof": None, "probe": None}
    c = wire.RawClient(port).handshake()
    try:
        if open_channel:
            c.channel_open(1)
        t0 = time.monotonic()

        def sender():
            try:
                c.send(data)
                if probe:
                    c.send(wire.method_frame(1, BASIC_QOS, b"\x00\x00\x00\x00\x00\x0a\x00"))
            except OSError:
                pass

        th = threading.Thread(target=sender)
        th.start()
        deadline = t0 + 10
        try:
            while time.monotonic() < deadline:
                f = c.read_frame(max(deadline - time.monotonic(), 0.01))
                if f.method == wire.CONNECTION_CLOSE:
                    res["close"] = wire.parse_connection_close(f.args)
                    res["t_close"] = round(time.monotonic() - t0, 2)
                    break
                if probe and f.method == BASIC_QOS_OK and f.channel == 1:
                    res["probe"] = "qos-ok"
                    break
                res["other"].append(repr(f))
        except (wire.ConnectionClosedError, ConnectionResetError, BrokenPipeError):
            res["eof"] = True
            res["t_eof"] = round(time.monotonic() - t0, 2)
        except socket.timeout:
            pass
        th.join(10)
        if res["close"] is not None:
            try:
                c.send(wire.method_frame(0, wire.CONNECTION_CLOSE_OK))
            except OSError:
                pass
            frames, closed = c.read_until_eof(timeout=10)
            res["other"].extend(repr(f) for f in frames)
            res["eof"] = closed
            res["t_eof"] = round(time.monotonic() - t0, 2)
    finally:
        c.close_socket()
    return res


@pytest.fixture(scope="module")
def bad_frame_results(direct_port, proxy_port):
    """Run every case against both sides concurrently (the broker waits ~3 s
    before closing after a frame error), once per module."""
    jobs = {}
    with ThreadPoolExecutor(16) as ex:
        for name, (open_channel, data) in BAD_FRAMES.items():
            for side, port in (("direct", direct_port), ("proxy", proxy_port)):
                jobs[(name, side)] = ex.submit(run_bad_client, port, open_channel, data)
        for name, (open_channel, data) in ACCEPTED_FRAMES.items():
            for side, port in (("direct", direct_port), ("proxy", proxy_port)):
                jobs[(name, side)] = ex.submit(run_bad_client, port, open_channel, data, True)
        return {k: f.result() for k, f in jobs.items()}


def assert_healthy(port):
    conn = support.connect(port)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, b"healthy")
        assert ch.basic_get(q, auto_ack=True)[2] == b"healthy"
    finally:
        support.safe_close(conn)


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_bad_frame_reply_code_matches_broker(name, bad_frame_results, proxy_port):
    direct = bad_frame_results[(name, "direct")]
    proxy = bad_frame_results[(name, "proxy")]
    print("%s\n  direct: %r\n  proxy:  %r" % (name, direct, proxy))
    assert direct["close"] is not None, "broker did not send connection.close: %r" % direct
    assert proxy["close"] is not None, "proxy did not send connection.close: %r" % proxy
    assert proxy["close"]["reply_code"] == direct["close"]["reply_code"], \
        "proxy %d (%s) vs broker %d (%s)" % (proxy["close"]["reply_code"], proxy["close"]["reply_text"],
                                             direct["close"]["reply_code"], direct["close"]["reply_text"])
    assert proxy["eof"], "proxy kept the socket open after connection.close/close-ok"
    assert_healthy(proxy_port)


@pytest.mark.parametrize("name", list(ACCEPTED_FRAMES))
def test_large_frame_accepted_like_broker(name, bad_frame_results, proxy_port):
    direct = bad_frame_results[(name, "direct")]
    proxy = bad_frame_results[(name, "proxy")]
    print("%s\n  direct: %r\n  proxy:  %r" % (name, direct, proxy))
    assert direct["probe"] == "qos-ok" and direct["close"] is None, direct
    assert proxy["probe"] == direct["probe"] and proxy["close"] == direct["close"], proxy
    assert_healthy(proxy_port)


def test_expected_broker_reply_codes(bad_frame_results):
    """The reply codes RabbitMQ itself uses for the cases above (documents
    what the comparisons compare against)."""
    codes = {name: bad_frame_results[(name, "direct")]["close"]["reply_code"] for name in BAD_FRAMES}
    print(codes)
    frame_errors = ["frame-end-not-ce", "heartbeat-frame-end-not-ce", "body-frame-over-frame-max",
                    "method-frame-over-frame-max", "frame-payload-frame_max+1", "unknown-frame-type"]
    assert {codes[n] for n in frame_errors} == {501}
    assert {codes[n] for n in ["header-without-publish", "body-without-header",
                               "body-after-publish-without-header", "header-on-unopened-channel",
                               "header-on-channel-0", "publish-then-new-method"]} == {505}
    assert codes["method-on-unopened-channel"] == 504


def test_bad_clients_do_not_disturb_others(proxy_port, new_queue, connections):
    """A healthy connection opened before a burst of bad clients keeps working."""
    queue = new_queue("acemq-it-bystander")
    conn = connections(proxy_port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"before")
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda item: run_bad_client(proxy_port, *item[1]),
                    [(n, BAD_FRAMES[n]) for n in ("header-without-publish", "body-without-header",
                                                  "unknown-frame-type", "publish-then-new-method")]))
    ch.basic_publish("", queue, b"after")
    assert [ch.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [b"before", b"after"]
