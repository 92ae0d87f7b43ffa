"""Clients that break the protocol early, or in an order the proxy does not
expect: each gets what the broker itself gives, and the proxy goes on
serving everyone else (the crash of issue 7 and its family)."""

import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import amqp_wire as wire
import support

START_OK = wire.method_frame(0, wire.CONNECTION_START_OK, wire.table({}) + wire.shortstr("PLAIN")
                             + wire.longstr(b"\x00guest\x00guest") + wire.shortstr("en_US"))
TUNE_OK = wire.method_frame(0, wire.CONNECTION_TUNE_OK, struct.pack(">HIH", 2047, 131072, 0))
OPEN = wire.method_frame(0, wire.CONNECTION_OPEN, wire.shortstr("/") + wire.shortstr("") + b"\x00")
CHANNEL_OPEN_1 = wire.method_frame(1, wire.CHANNEL_OPEN, wire.shortstr(""))
UPDATE_SECRET = (10, 70)
UPDATE_SECRET_OK = (10, 71)

# Sent right after the protocol header, before the client has seen
# connection.start (and through the proxy, before the broker leg is up).
BEFORE_START_OK = {
    "body-frame-on-channel-1": wire.frame(wire.FRAME_BODY, 1, b"abc"),
    "random-bytes": b"\x17garbage-garbage-garbage",
    "unknown-frame-type": wire.frame(9, 0, b"abc"),
    "channel-open-before-start-ok": CHANNEL_OPEN_1,
    "frame-end-not-ce": wire.frame(wire.FRAME_METHOD, 0, b"\x00\x0a\x00\x0b", end=0),
    "oversize-frame": struct.pack(">BHI", 1, 0, 1 << 30),
}


def exchange(port, data, timeout=6.0):
    """Send data at once; collect what comes back until EOF or timeout.
    Returns (frames, closed)."""
    c = wire.RawClient(port, timeout=timeout)
    try:
        c.send(data)
        return c.read_until_eof(timeout)
    finally:
        c.close_socket()


def describe(frames):
    out = []
    for f in frames:
        if f.method == wire.CONNECTION_CLOSE:
            close = wire.parse_connection_close(f.args)
            out.append(("connection.close", close["reply_code"]))
        else:
            out.append(f.method if f.type == wire.FRAME_METHOD else ("frame", f.type))
    return out


@pytest.mark.parametrize("name", list(BEFORE_START_OK))
def test_bad_frame_before_start_ok_like_broker(name, direct_port, proxy_port):
    """The broker answers with connection.start, then closes the socket
    without a connection.close; so does the proxy, and it stays up."""
    data = wire.PROTOCOL_HEADER + BEFORE_START_OK[name]
    with ThreadPoolExecutor(2) as ex:
        direct, proxy = ex.map(lambda p: exchange(p, data), (direct_port, proxy_port))
    print("direct:", describe(direct[0]), direct[1], "proxy:", describe(proxy[0]), proxy[1])
    assert describe(direct[0]) == [wire.CONNECTION_START]
    assert direct[1], "the broker did not close the socket"
    assert describe(proxy[0]) == describe(direct[0])
    assert proxy[1], "the proxy did not close the socket"
    # And it still serves a real client.
    conn = support.connect(proxy_port)
    conn.channel().queue_declare("", exclusive=True)
    conn.close()


def test_close_right_after_header(proxy_port):
    """Many clients close (or reset) right after the header, before the broker
    leg is up; then a normal client is served."""
    def one(i):
        s = socket.create_connection((support.HOST, proxy_port))
        s.sendall(wire.PROTOCOL_HEADER + (wire.frame(wire.FRAME_BODY, 1, b"x") if i % 3 == 0 else b""))
        if i % 2:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(200)))
    conn = support.connect(proxy_port)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"still here")
    assert support.wait_until(lambda: ch.basic_get(q, auto_ack=True)[2] == b"still here", 5)
    conn.close()


@pytest.mark.parametrize("case", ["after-start-ok", "after-tune-ok"])
def test_bad_frame_during_handshake_like_broker(case, direct_port, proxy_port):
    """Until tune-ok the broker closes the socket without connection.close;
    after it, it says connection.close 505. So does the proxy."""
    def run(port):
        c = wire.RawClient(port)
        try:
            c.send(wire.PROTOCOL_HEADER)
            c.expect(wire.CONNECTION_START, 0)
            c.send(START_OK + (TUNE_OK if case == "after-tune-ok" else b"")
                   + wire.frame(wire.FRAME_BODY, 1, b"abc"))
            return c.read_until_eof(6.0)
        finally:
            c.close_socket()
    with ThreadPoolExecutor(2) as ex:
        direct, proxy = ex.map(run, (direct_port, proxy_port))
    print("direct:", describe(direct[0]), "proxy:", describe(proxy[0]))
    if case == "after-start-ok":
        assert direct[1] and proxy[1], "the socket was not closed"
    closes = [d for d in describe(direct[0]) if d[0] == "connection.close"]
    assert closes == ([("connection.close", 505)] if case == "after-tune-ok" else [])
    assert [d for d in describe(proxy[0]) if d[0] == "connection.close"] == closes


@pytest.mark.parametrize("port_name", ["direct_port", "proxy_port"])
def test_pipelined_handshake(port_name, request):
    """Header, start-ok, tune-ok, open and channel.open in one write: the
    broker accepts it, and through the proxy the channel opens too."""
    port = request.getfixturevalue(port_name)
    c = wire.RawClient(port)
    try:
        c.send(wire.PROTOCOL_HEADER + START_OK + TUNE_OK + OPEN + CHANNEL_OPEN_1)
        c.expect(wire.CONNECTION_START, 0)
        c.expect(wire.CONNECTION_TUNE, 0)
        c.expect(wire.CONNECTION_OPEN_OK, 0)
        c.expect(wire.CHANNEL_OPEN_OK, 1)
        c.frame_max = 131072
        c.queue_declare(1, "", exclusive=True)
        c.close()
    finally:
        c.close_socket()


@pytest.mark.parametrize("port_name", ["direct_port", "proxy_port"])
def test_update_secret_passes_through(port_name, request):
    """connection.update-secret (10/70) is newer than the codec; the broker
    judges it and answers update-secret-ok, through the proxy too."""
    port = request.getfixturevalue(port_name)
    c = wire.RawClient(port).handshake()
    try:
        c.send(wire.method_frame(0, UPDATE_SECRET, wire.longstr(b"\x00guest\x00guest")
                                 + wire.shortstr("refresh")))
        c.expect(UPDATE_SECRET_OK, 0)
        c.channel_open(1)
        c.close()
    finally:
        c.close_socket()


def test_early_errors_under_load(proxy_port):
    """A crowd of early misbehaving clients while one client publishes and
    consumes with confirms: all its messages arrive."""
    stop = time.monotonic() + 4

    def misbehave(i):
        n = 0
        while time.monotonic() < stop:
            data = wire.PROTOCOL_HEADER + list(BEFORE_START_OK.values())[n % len(BEFORE_START_OK)]
            try:
                s = socket.create_connection((support.HOST, proxy_port), timeout=2)
                s.sendall(data[: 8 + (n * 7) % (len(data) - 7)])
                s.close()
            except OSError:
                pass
            n += 1
        return n

    conn = support.connect(proxy_port)
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    with ThreadPoolExecutor(6) as ex:
        futs = [ex.submit(misbehave, i) for i in range(6)]
        sent = 0
        while time.monotonic() < stop:
            ch.basic_publish("", q, b"m%d" % sent)
            sent += 1
        total = sum(f.result() for f in futs)
    got = []
    while True:
        m = ch.basic_get(q, auto_ack=True)
        if m[0] is None:
            break
        got.append(m[2])
    conn.close()
    print("misbehaving connections:", total, "messages:", sent)
    assert got == [b"m%d" % i for i in range(sent)]
    assert total > 50
