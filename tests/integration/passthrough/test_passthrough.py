"""Message bodies and properties pass through unchanged."""

import datetime
import decimal
import hashlib
import os

import pika
import pytest

import amqp_wire as wire
import support

MiB = 1024 * 1024

# Body sizes; "fm" is the frame_max the connection negotiated.
SIZES = {
    "empty": lambda fm: 0,
    "one": lambda fm: 1,
    "frame_max-8": lambda fm: fm - 8,
    "frame_max+1": lambda fm: fm + 1,
    "1MiB": lambda fm: MiB,
    "16MiB": lambda fm: 16 * MiB,
}

ROUTES = [("proxy", "proxy"), ("proxy", "direct"), ("direct", "proxy"), ("direct", "direct")]


def all_properties(tag):
    headers = {
        "str": "value",
        "unicode": "\u00e9\u4e2d",
        "int": 42,
        "negative": -7,
        "int64": 2 ** 40,
        "true": True,
        "false": False,
        "decimal": decimal.Decimal("3.14"),
        "decimal-int": decimal.Decimal("12"),
        "timestamp": datetime.datetime(2021, 3, 4, 5, 6, 7),
        "bytes": b"\x00\x01\xfe\xff",
        "void": None,
        "array": [1, "two", True, [3, [4, "deep"]], {"in": "array"}, None, b"\x7f"],
        "table": {"nested": {"deeper": {"n": 1, "list": [False, decimal.Decimal("-0.5")]}}, "empty": {}},
        "empty-array": [],
        "tag": tag,
    }
    return pika.BasicProperties(
        content_type="application/octet-stream",
        content_encoding="identity",
        headers=headers,
        delivery_mode=2,
        priority=7,
        correlation_id="corr-" + tag,
        reply_to="reply-" + tag,
        expiration="600000",
        message_id="msg-" + tag,
        timestamp=1600000000,
        type="acemq.test",
        user_id="guest",
        app_id="acemq-it",
        cluster_id="cluster-a",
    )


PROPERTY_NAMES = ["content_type", "content_encoding", "headers", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                  "user_id", "app_id", "cluster_id"]


def assert_properties_equal(got, want):
    diffs = []
    for name in PROPERTY_NAMES:
        if getattr(got, name) != getattr(want, name):
            diffs.append("%s: got %r want %r" % (name, getattr(got, name), getattr(want, name)))
    assert not diffs, "properties differ:\n" + "\n".join(diffs)


def negotiated_frame_max(conn):
    return conn._impl.params.frame_max


def describe(body):
    return "%d bytes sha1=%s" % (len(body), hashlib.sha1(body).hexdigest())


def test_tune_parameters_match(direct_port, proxy_port, connections):
    """The proxy presents the same negotiated limits as the broker."""
    got = {}
    for name, port in (("direct", direct_port), ("proxy", proxy_port)):
        conn = connections(port)
        p = conn._impl.params
        got[name] = (p.frame_max, p.channel_max, p.heartbeat, conn._impl.server_capabilities)
    assert got["proxy"] == got["direct"]
    assert got["direct"][0] == 131072


@pytest.mark.parametrize("size_name", list(SIZES))
@pytest.mark.parametrize("route", ROUTES, ids=["%s-to-%s" % r for r in ROUTES])
def test_body_and_properties_roundtrip(size_name, route, direct_port, proxy_port, connections, new_queue):
    ports = {"direct": direct_port, "proxy": proxy_port}
    pub_port, con_port = ports[route[0]], ports[route[1]]
    queue = new_queue("acemq-it-body")

    pub = connections(pub_port)
    frame_max = negotiated_frame_max(pub)
    assert frame_max == 131072
    size = SIZES[size_name](frame_max)
    body = os.urandom(size)
    props = all_properties(size_name)
    ch = pub.channel()
    ch.confirm_delivery()
    ch.basic_publish("", queue, body, props, mandatory=True)

    con = connections(con_port)
    cch = con.channel()
    cch.basic_qos(prefetch_count=1)
    got = None
    for method, gprops, gbody in cch.consume(queue, inactivity_timeout=30):
        assert method is not None, "no delivery within 30 s"
        got = (method, gprops, gbody)
        cch.basic_ack(method.delivery_tag)
        break
    cch.cancel()
    method, gprops, gbody = got
    assert method.delivery_tag == 1
    assert method.redelivered is False
    assert method.exchange == ""
    assert method.routing_key == queue
    assert gbody == body, "body differs: got %s want %s" % (describe(gbody), describe(body))
    assert_properties_equal(gprops, props)


@pytest.mark.parametrize("size_name", ["empty", "frame_max-8", "frame_max+1", "1MiB"])
def test_basic_get_roundtrip(size_name, endpoint, connections, new_queue):
    queue = new_queue("acemq-it-get")
    conn = connections(endpoint.port)
    size = SIZES[size_name](negotiated_frame_max(conn))
    body = os.urandom(size)
    props = all_properties("get-" + size_name)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", queue, body, props)
    method, gprops, gbody = ch.basic_get(queue, auto_ack=False)
    assert method is not None
    assert method.message_count == 0
    assert gbody == body, "body differs: got %s want %s" % (describe(gbody), describe(body))
    assert_properties_equal(gprops, props)
    ch.basic_ack(method.delivery_tag)


def raw_get(port, queue, frame_max=None):
    c = wire.RawClient(port).handshake(frame_max=frame_max)
    try:
        c.channel_open(1)
        c.send(wire.method_frame(1, wire.BASIC_GET, b"\x00\x00" + wire.shortstr(queue) + b"\x01"))
        frames = [c.read_frame()]
        assert frames[0].method == wire.BASIC_GET_OK, frames[0]
        frames.append(c.read_frame())
        size = wire.parse_content_header(frames[1].payload)["body_size"]
        got = 0
        while got < size:
            f = c.read_frame()
            assert f.type == wire.FRAME_BODY, f
            got += len(f.payload)
            frames.append(f)
        c.close()
        return frames
    finally:
        c.close_socket()


def test_content_frames_byte_identical(direct_port, proxy_port, connections, new_queue):
    """The frames a raw client receives for the same message are identical
    whether it talks to the broker or to the proxy."""
    body = os.urandom(3 * 131072 + 17)
    props = all_properties("raw")
    q_direct = new_queue("acemq-it-raw")
    q_proxy = new_queue("acemq-it-raw")
    conn = connections(direct_port)
    ch = conn.channel()
    ch.confirm_delivery()
    # same routing key length so that the get-ok payloads line up exactly
    assert len(q_direct) == len(q_proxy)
    for q in (q_direct, q_proxy):
        ch.basic_publish("", q, body, props)

    via_direct = raw_get(direct_port, q_direct)
    via_proxy = raw_get(proxy_port, q_proxy)
    assert [f.type for f in via_proxy] == [f.type for f in via_direct]
    get_d = wire.parse_get_ok(via_direct[0].args)
    get_p = wire.parse_get_ok(via_proxy[0].args)
    get_d.pop("routing_key")
    get_p.pop("routing_key")
    assert get_p == get_d
    assert via_proxy[1].payload == via_direct[1].payload, "content header payload differs"
    assert [len(f.payload) for f in via_proxy[2:]] == [len(f.payload) for f in via_direct[2:]]
    assert b"".join(f.payload for f in via_proxy[2:]) == body
    assert b"".join(f.payload for f in via_direct[2:]) == body


def test_small_client_frame_max_respected(endpoint, connections, new_queue):
    """A client that negotiates frame_max=4096 never receives a larger frame."""
    queue = new_queue("acemq-it-fm")
    body = os.urandom(100000)
    conn = connections(endpoint.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", queue, body)
    frames = raw_get(endpoint.port, queue, frame_max=4096)
    assert all(len(f.payload) + 8 <= 4096 for f in frames), [len(f.payload) for f in frames]
    assert b"".join(f.payload for f in frames[2:]) == body
    assert len(frames) - 2 == -(-len(body) // (4096 - 8))


def test_pika_small_frame_max_publish(endpoint, connections, new_queue):
    """A pika client with frame_max=4096 publishes and consumes a large body."""
    queue = new_queue("acemq-it-fm")
    conn = connections(endpoint.port, frame_max=4096)
    assert negotiated_frame_max(conn) == 4096
    body = os.urandom(300000)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", queue, body, all_properties("fm4096"))
    method, props, got = ch.basic_get(queue, auto_ack=True)
    assert got == body
    assert_properties_equal(props, all_properties("fm4096"))
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)
