"""Reply-address normalisation through the real proxy against a real broker."""
import threading
import time
import uuid

import pika

from conftest import Proxy, write_rules

HEADER = "acemq-reply-to"


def conn(port):
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def direct():
    return conn(5672)


def temp_queue(ch):
    return ch.queue_declare(f"acemq-it-{uuid.uuid4().hex[:10]}", auto_delete=False).method.queue


def get_direct(q, timeout=5.0):
    """What the broker holds, read by a consumer connected straight to it.
    The publishes are unconfirmed: one may still be on its way to the queue
    when the get arrives, so an empty queue is asked again for a while."""
    c = direct()
    try:
        ch = c.channel()
        deadline = time.monotonic() + timeout
        while True:
            m, p, b = ch.basic_get(q, auto_ack=True)
            if m is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert m is not None, "nothing in " + q
        return p, b
    finally:
        c.close()


def test_property_only_gets_header(reply_proxy):
    c = conn(reply_proxy.port)
    ch = c.channel()
    q = temp_queue(ch)
    try:
        ch.basic_publish("", q, b"x", pika.BasicProperties(
            reply_to="answers", headers={"n": 7, "nested": {"k": [1, "two"]}}))
        p, _ = get_direct(q)
        assert p.reply_to == "answers"
        assert p.headers[HEADER] == "answers"
        assert p.headers["n"] == 7 and p.headers["nested"] == {"k": [1, b"two"]} or \
            p.headers["nested"] == {"k": [1, "two"]}
    finally:
        ch.queue_delete(q)
        c.close()


def test_header_only_gets_property(reply_proxy):
    c = conn(reply_proxy.port)
    ch = c.channel()
    q = temp_queue(ch)
    try:
        ch.basic_publish("", q, b"x", pika.BasicProperties(headers={HEADER: "hq"}))
        p, _ = get_direct(q)
        assert p.reply_to == "hq" and p.headers[HEADER] == "hq"
    finally:
        ch.queue_delete(q)
        c.close()


def test_mismatch_header_wins_and_is_counted(reply_proxy):
    before = reply_proxy.stats()["reply_to_mismatch"]
    c = conn(reply_proxy.port)
    ch = c.channel()
    q = temp_queue(ch)
    try:
        ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to="p", headers={HEADER: "h"}))
        p, _ = get_direct(q)
        assert p.reply_to == "h" and p.headers[HEADER] == "h"
        assert reply_proxy.stats()["reply_to_mismatch"] == before + 1
    finally:
        ch.queue_delete(q)
        c.close()


def test_untouched_messages_identical(reply_proxy):
    """Messages needing no change arrive exactly as sent directly would."""
    props = pika.BasicProperties(content_type="a/b", headers={"z": 1, HEADER: "r"}, reply_to="r",
                                 message_id="m", priority=3, timestamp=1234)
    bodies = []
    for port in (5672, reply_proxy.port):
        c = conn(port)
        ch = c.channel()
        q = temp_queue(ch)
        ch.basic_publish("", q, b"same", props)
        p, b = get_direct(q)
        bodies.append((p.content_type, p.headers, p.reply_to, p.message_id, p.priority,
                       p.timestamp, b))
        ch.queue_delete(q)
        c.close()
    assert bodies[0] == bodies[1]


def test_header_added_keeps_every_other_property_and_the_body(reply_proxy):
    """The header is spliced into the frame as it came: every other property,
    a table the frame had or none, and a body of several frames stay as
    sent; only the new entry is added, last."""
    body = bytes(range(256)) * 1200  # past one frame
    shapes = [
        dict(content_type="application/json", content_encoding="gzip", delivery_mode=2,
             priority=4, correlation_id="c-1", reply_to="answers.q", expiration="600000",
             message_id="m-1", timestamp=1700000000, type="order", user_id="guest",
             app_id="app"),
        dict(content_type="text/plain", reply_to="r2"),
        dict(reply_to="r3", headers={"a": 1, "b": "two", "c": {"d": [1, 2]}}),
        dict(reply_to="x" * 255, headers={}),
    ]
    before = reply_proxy.stats()["reply_to_header_added"]
    c = conn(reply_proxy.port)
    ch = c.channel()
    q = temp_queue(ch)
    try:
        for shape in shapes:
            ch.basic_publish("", q, body, pika.BasicProperties(**shape))
            p, b = get_direct(q)
            assert b == body
            want = dict(shape)
            want_headers = dict(want.pop("headers", None) or {})
            want_headers[HEADER] = shape["reply_to"]
            for k, v in want.items():
                assert getattr(p, k) == v, (k, getattr(p, k), v)
            got = {k: (v.decode() if isinstance(v, bytes) else v)
                   for k, v in p.headers.items()}
            assert list(got)[-1] == HEADER
            assert got == want_headers, got
        assert reply_proxy.stats()["reply_to_header_added"] == before + len(shapes)
    finally:
        ch.queue_delete(q)
        c.close()


def test_delivery_side_normalised_for_direct_publishers(reply_proxy):
    """Published straight to the broker, consumed through the proxy."""
    d = direct()
    dch = d.channel()
    q = temp_queue(dch)
    try:
        dch.basic_publish("", q, b"1", pika.BasicProperties(reply_to="only-prop"))
        dch.basic_publish("", q, b"2", pika.BasicProperties(headers={HEADER: "only-head"}))
        c = conn(reply_proxy.port)
        ch = c.channel()
        m, p, _ = ch.basic_get(q, auto_ack=True)
        assert p.reply_to == "only-prop" and p.headers[HEADER] == "only-prop"
        got = []
        for m, p, b in ch.consume(q, inactivity_timeout=2):
            if m is None:
                break
            got.append((p.reply_to, p.headers[HEADER]))
            ch.basic_ack(m.delivery_tag)
            break
        assert got == [("only-head", "only-head")]
        ch.cancel()
        c.close()
    finally:
        dch.queue_delete(q)
        d.close()


def rpc_round_trip(port, responder_reads_header, use_direct_reply, requester_header_only):
    """A requester and a responder, both through the proxy; the responder
    answers at the address it reads (header first, or property only)."""
    req_c, resp_c = conn(port), conn(port)
    req, resp = req_c.channel(), resp_c.channel()
    service = temp_queue(req)
    answers = []
    try:
        if use_direct_reply:
            reply_q = "amq.rabbitmq.reply-to"
            req.basic_consume(reply_q, lambda ch, m, p, b: answers.append(b), auto_ack=True)
        else:
            reply_q = temp_queue(req)

        def respond(ch, m, p, b):
            h = (p.headers or {}).get(HEADER)
            addr = h if responder_reads_header else p.reply_to
            if responder_reads_header:
                assert h is not None, "no header for a header-first responder"
            ch.basic_publish("", addr, b"re:" + b)
            ch.basic_ack(m.delivery_tag)

        resp.basic_consume(service, respond)
        if requester_header_only:
            props = pika.BasicProperties(headers={HEADER: reply_q})
        else:
            props = pika.BasicProperties(reply_to=reply_q)
        req.basic_publish("", service, b"ping", props)
        for _ in range(50):
            resp_c.process_data_events(time_limit=0.05)
            if use_direct_reply:
                req_c.process_data_events(time_limit=0.05)
            else:
                m, p, b = req.basic_get(reply_q, auto_ack=True)
                if m:
                    answers.append(b)
            if answers:
                break
        assert answers == [b"re:ping"]
        if not use_direct_reply:
            req.queue_delete(reply_q)
    finally:
        req.queue_delete(service)
        req_c.close()
        resp_c.close()


def test_native_requester_header_reading_responder_queue(reply_proxy):
    rpc_round_trip(reply_proxy.port, True, False, False)


def test_acemq_requester_native_responder_queue(reply_proxy):
    rpc_round_trip(reply_proxy.port, False, False, True)


def test_direct_reply_to_header_first_responder(reply_proxy):
    rpc_round_trip(reply_proxy.port, True, True, False)


def test_direct_reply_to_property_responder(reply_proxy):
    rpc_round_trip(reply_proxy.port, False, True, False)


def test_direct_reply_to_header_only_requester(reply_proxy):
    rpc_round_trip(reply_proxy.port, True, True, True)


def test_vhost_without_rules_untouched(rules_dir):
    write_rules(rules_dir, "other.json", '{"vhost": "other", "reply_to": {"enabled": true}}')
    p = Proxy(rules_dir)
    try:
        c = conn(p.port)
        ch = c.channel()
        q = temp_queue(ch)
        ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to="r"))
        props, _ = get_direct(q)
        assert props.reply_to == "r" and props.headers is None
        ch.queue_delete(q)
        c.close()
    finally:
        p.stop()
