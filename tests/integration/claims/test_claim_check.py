"""Claim check through the real proxy with a real broker and pika: what a
consumer behind the proxy gets, compared with what the broker holds and
with the original; the stores, the failure modes, restarts."""
import hashlib
import os
import re
import threading
import time
import uuid

import pika
import pytest

from conftest import SANITIZED, VHOST_FS, VHOST_PASS, Proxy, direct

PROPS = dict(content_type="application/pdf", content_encoding="identity", message_id="m-1",
             correlation_id="c-1", priority=3, delivery_mode=2, headers={"x-app": "docs", "n": 7},
             type="report", app_id="scanner", timestamp=1700000000)


def qname():
    return "acemq-cc-" + uuid.uuid4().hex[:12]


def declare(conn, q, **args):
    ch = conn.channel()
    ch.queue_declare(q, arguments=args or None)
    return ch


def get_one(ch, q, timeout=10.0, auto_ack=True):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = ch.basic_get(q, auto_ack=auto_ack)
        if m[0] is not None:
            return m
        time.sleep(0.05)
    return None


def same_props(a, b):
    keys = ("content_type", "content_encoding", "message_id", "correlation_id", "priority",
            "delivery_mode", "headers", "type", "app_id", "timestamp")
    return {k: getattr(a, k) for k in keys} == {k: getattr(b, k) for k in keys}


def framed_key(body):
    assert body[:3] == b"\xac\x01\x01", body[:16]
    return body[3:].decode()


@pytest.mark.parametrize("size", [1 << 20, 40 << 20])
def test_offload_and_rehydrate(proxy, size):
    body = os.urandom(size)
    q = qname()
    props = pika.BasicProperties(**PROPS)
    with proxy.connect() as c:
        ch = declare(c, q)
        ch.confirm_delivery()
        ch.basic_publish("", q, body, props)
        # The broker holds the claim check: three bytes of framing and a
        # key under 100 bytes, with the properties unchanged.
        with direct() as d:
            dch = d.channel()
            m = get_one(dch, q, auto_ack=False)
            assert len(m[2]) < 100
            key = framed_key(m[2])
            assert re.fullmatch(r"[0-9a-f]{32}", key), key
            assert same_props(m[1], props)
        # Closing the direct connection requeued it; behind the proxy it
        # is the original again.
        m = get_one(ch, q)
        assert m[2] == body
        assert same_props(m[1], props)
        ch.queue_delete(q)


def test_threshold_default_is_64k(proxy):
    q = qname()
    with proxy.connect() as c:
        ch = declare(c, q)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"a" * 65535)
        ch.basic_publish("", q, b"b" * 65536)
        with direct() as d:
            dch = d.channel()
            assert get_one(dch, q)[2] == b"a" * 65535  # untouched
            framed_key(get_one(dch, q)[2])  # offloaded
        ch.queue_delete(q)


def test_unmatched_exchange_untouched(proxy):
    q = qname()
    body = os.urandom(200000)
    with proxy.connect() as c:
        ch = declare(c, q)
        ch.queue_bind(q, "amq.topic", "other.#")
        ch.queue_bind(q, "amq.topic", "document.#")
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "other.x", body)
        ch.basic_publish("amq.topic", "document.x", body)
        with direct() as d:
            dch = d.channel()
            assert get_one(dch, q)[2] == body
            framed_key(get_one(dch, q)[2])
        ch.queue_delete(q)


def test_already_framed_not_framed_twice(proxy):
    q = qname()
    inline = b"\xac\x01\x00" + os.urandom(100000)
    with proxy.connect() as c:
        ch = declare(c, q)
        ch.confirm_delivery()
        ch.basic_publish("", q, inline)
        with direct() as d:
            assert get_one(d.channel(), q)[2] == inline
        ch.queue_delete(q)


def test_inline_framed_body_is_unframed(proxy):
    q = qname()
    with direct() as d:
        declare(d, q).basic_publish("", q, b"\xac\x01\x00hello, inline")
    with proxy.connect() as c:
        ch = c.channel()
        assert get_one(ch, q)[2] == b"hello, inline"
        ch.queue_delete(q)


def test_get_and_consume_and_return_rehydrate(proxy):
    q = qname()
    body = os.urandom(300000)
    with proxy.connect() as c:
        ch = declare(c, q)
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish("", q, body)
        assert get_one(ch, q)[2] == body
        got = []
        for method, props, b in ch.consume(q, inactivity_timeout=5):
            if method is None:
                break
            got.append(b)
            ch.basic_ack(method.delivery_tag)
            if len(got) == 2:
                break
        ch.cancel()
        assert got == [body, body]
        # Mandatory and unroutable: the publisher gets the original back.
        with pytest.raises(pika.exceptions.UnroutableError) as e:
            ch.basic_publish("", "acemq-cc-no-such-queue-" + uuid.uuid4().hex, body, mandatory=True)
        assert e.value.messages[0].body == body
        ch.queue_delete(q)


def _dead_letter_queues(conn):
    q, dlq = qname(), qname()
    ch = conn.channel()
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    return q, dlq


@pytest.mark.parametrize("key", ["0123456789abcdef0123456789abcdef", "../../etc/passwd"])
def test_missing_or_bad_key_dead_lettered(proxy, key):
    body = b"\xac\x01\x01" + key.encode()
    with direct() as d:
        q, dlq = _dead_letter_queues(d)
        d.channel().basic_publish("", q, body)
    with proxy.connect() as c:
        ch = c.channel()
        # The consumer never sees it ...
        assert get_one(ch, q, timeout=1.5, auto_ack=False) is None
        # ... the dead-letter queue has it, as it was.
        with direct() as d:
            m = get_one(d.channel(), dlq)
            assert m is not None and m[2] == body
        ch.queue_delete(q)
        ch.queue_delete(dlq)
    assert key[:16] in proxy.stderr()


def test_missing_key_passed_with_pass(proxy):
    body = b"\xac\x01\x01" + b"f" * 32
    q = qname()
    with direct(VHOST_PASS) as d:
        declare(d, q).basic_publish("", q, body)
    with proxy.connect(VHOST_PASS) as c:
        ch = c.channel()
        assert get_one(ch, q)[2] == body
        ch.queue_delete(q)


def test_key_of_another_vhost_does_not_resolve(proxy):
    payload = os.urandom(100000)
    qa, qb = qname(), qname()
    with proxy.connect(VHOST_PASS) as c:
        ch = declare(c, qa)
        ch.confirm_delivery()
        ch.basic_publish("", qa, payload)
    with direct(VHOST_PASS) as d:
        ref = get_one(d.channel(), qa)[2]
        framed_key(ref)
    # The same reference in vhost "/" names nothing there.
    with direct() as d:
        qb, dlq = _dead_letter_queues(d)
        d.channel().basic_publish("", qb, ref)
    with proxy.connect() as c:
        ch = c.channel()
        assert get_one(ch, qb, timeout=1.5, auto_ack=False) is None
        with direct() as d:
            assert get_one(d.channel(), dlq)[2] == ref
        ch.queue_delete(qb)
        ch.queue_delete(dlq)


def test_filesystem_store(proxy, dirs):
    payload = os.urandom(3 * (1 << 20) + 5)
    q = qname()
    with proxy.connect(VHOST_FS) as c:
        ch = declare(c, q)
        ch.confirm_delivery()
        ch.basic_publish("", q, payload)
        with direct(VHOST_FS) as d:
            key = framed_key(get_one(d.channel(), q, auto_ack=False)[2])
        # The file is named by the key and holds exactly the payload, as
        # another library's filesystem store expects; no partial is left.
        with open(os.path.join(dirs["fs"], key), "rb") as f:
            assert f.read() == payload
        assert [n for n in os.listdir(dirs["fs"]) if n.startswith(".")] == []
        assert get_one(ch, q)[2] == payload
        ch.queue_delete(q)


def test_memory_bounded_for_40mib_each_way(proxy):
    """The proxy streams a 40 MiB body to the store and back; its peak
    anonymous RSS (the heap: the store's pages mapped from its file are the
    page cache's) grows by less than 16 MiB."""
    if SANITIZED:
        pytest.skip("ASan keeps freed memory resident; measured on the normal build")
    body = os.urandom(40 << 20)
    q = qname()
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proxy.status("RssAnon"))
            time.sleep(0.005)

    with proxy.connect() as c:
        ch = declare(c, q)
        ch.confirm_delivery()
        base = proxy.status("RssAnon")
        t = threading.Thread(target=sample)
        t.start()
        try:
            ch.basic_publish("", q, body)
            assert get_one(ch, q)[2] == body
        finally:
            stop.set()
            t.join()
        ch.queue_delete(q)
    print("proxy anonymous RSS %d kB, peak %d kB while 40 MiB went each way" % (base, peak[0]))
    assert peak[0] - base < 16 * 1024


def test_kill9_then_restart_still_rehydrates(vhosts, dirs):
    data = os.path.join(dirs["top"], "data-kill9")
    p = Proxy(dirs["rules"], data)
    q = qname()
    payloads = [os.urandom(n) for n in (70000, 1 << 20, 3 << 20)]
    try:
        with p.connect() as c:
            ch = declare(c, q)
            ch.confirm_delivery()
            for b in payloads:
                ch.basic_publish("", q, b)  # confirmed: durable in the store
        p.kill9()
        p.start()
        with p.connect() as c:
            ch = c.channel()
            assert [get_one(ch, q)[2] for _ in payloads] == payloads
            ch.queue_delete(q)
    finally:
        p.stop()


def test_full_store_nacks_and_loses_nothing(vhosts, dirs):
    data = os.path.join(dirs["top"], "data-full")
    p = Proxy(dirs["rules"], data, ["--state-map-mb", "1"])
    q = qname()
    try:
        with p.connect() as c:
            ch = declare(c, q)
            ch.confirm_delivery()
            with pytest.raises(pika.exceptions.NackError):
                # Under 4 MiB: an LMDB store keeps larger ones in files.
                ch.basic_publish("", q, os.urandom((4 << 20) - 1))
            ch.basic_publish("", q, b"small and fine")
            ch.basic_publish("", q, os.urandom(100000))  # fits
            with direct() as d:
                dch = d.channel()
                assert get_one(dch, q)[2] == b"small and fine"
                framed_key(get_one(dch, q, auto_ack=False)[2])
                assert get_one(dch, q, timeout=0.5) is None
            assert len(get_one(ch, q)[2]) == 100000
            ch.queue_delete(q)
        assert "full" in p.stderr()
    finally:
        p.stop()


def test_200_publishers_of_1mib(proxy):
    q = qname()
    with proxy.connect() as c:
        declare(c, q)
    errors, digests = [], []
    lock = threading.Lock()

    def publish(i):
        try:
            body = hashlib.sha256(b"%d" % i).digest() * ((1 << 20) // 32)
            with proxy.connect() as c:
                ch = c.channel()
                ch.confirm_delivery()
                ch.basic_publish("", q, body)
            with lock:
                digests.append(hashlib.sha256(body).hexdigest())
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:3]
    got = []
    with proxy.connect() as c:
        ch = c.channel()
        while True:
            m = get_one(ch, q, timeout=2)
            if m is None:
                break
            got.append(hashlib.sha256(m[2]).hexdigest())
        ch.queue_delete(q)
    assert sorted(got) == sorted(digests)
    assert len(got) == 200


def _http_get(url):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_admin_claims_and_retention_purge(vhosts, dirs):
    """GET /claims/VHOST/KEY says whether the payload is there, its size and
    age; once retention_s has passed the purge removes it, and a consumer
    then gets the on_missing treatment."""
    import json
    rules = os.path.join(dirs["top"], "rules-retention")
    os.makedirs(rules, exist_ok=True)
    with open(os.path.join(rules, "r.json"), "w") as f:
        f.write('{"vhost": "/", "claim_check": {"match": [{"exchange": ""}], "retention_s": 2,'
                ' "on_missing": "pass"}}')
    admin = __import__("conftest").free_port()
    p = Proxy(rules, os.path.join(dirs["top"], "data-retention"),
              ["--admin", "127.0.0.1:%d" % admin, "--purge-interval-s", "1"])
    q = qname()
    try:
        with p.connect() as c:
            ch = declare(c, q)
            ch.confirm_delivery()
            ch.basic_publish("", q, b"r" * 100000)
            with direct() as d:
                ref = get_one(d.channel(), q, auto_ack=False)[2]
            key = framed_key(ref)
            code, text = _http_get("http://127.0.0.1:%d/claims/%%2F/%s" % (admin, key))
            assert code == 200, text
            info = json.loads(text)
            assert info["present"] is True and info["size"] == 100000 and info["age_s"] <= 2
            assert "rrrr" not in text
            code, text = _http_get("http://127.0.0.1:%d/claims/%%2F/%s" % (admin, "0" * 32))
            assert code == 404 and json.loads(text)["present"] is False
            code, _ = _http_get("http://127.0.0.1:%d/claims/%%2F/..%%2F..%%2Fetc%%2Fpasswd" % admin)
            assert code == 400
            code, _ = _http_get("http://127.0.0.1:%d/claims/no-such-vhost/%s" % (admin, key))
            assert code == 404
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                code, text = _http_get("http://127.0.0.1:%d/claims/%%2F/%s" % (admin, key))
                if code == 404:
                    break
                time.sleep(0.2)
            assert code == 404, text
            # Past retention: with on_missing "pass" the reference arrives as it is.
            assert get_one(ch, q)[2] == ref
            ch.queue_delete(q)
        assert "past 2 s removed" in p.stderr()
    finally:
        p.stop()


def test_client_vanishing_mid_upload_leaves_nothing(proxy, dirs):
    """A publisher that disappears half way through a large body: nothing
    reaches the queue, and the partial payload is removed."""
    import socket
    import struct as st
    import amqp_wire as wire
    q = qname()
    with direct(VHOST_FS) as d:
        d.channel().queue_declare(q)
    c = wire.RawClient(proxy.port).handshake(vhost=VHOST_FS)
    c.channel_open(1)
    size = 8 << 20
    c.send(wire.method_frame(1, wire.BASIC_PUBLISH, wire.basic_publish_args("", q))
           + wire.content_header_frame(1, size))
    chunk = wire.frame(wire.FRAME_BODY, 1, b"v" * (c.frame_max - 8))
    for _ in range((3 << 20) // len(chunk)):
        c.send(chunk)
    time.sleep(0.3)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, st.pack("ii", 1, 0))
    c.close_socket()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.listdir(dirs["fs"]) and any(
            n.startswith(".") for n in os.listdir(dirs["fs"])):
        time.sleep(0.1)
    assert [n for n in os.listdir(dirs["fs"]) if n.startswith(".")] == []
    with direct(VHOST_FS) as d:
        dch = d.channel()
        assert dch.queue_declare(q, passive=True).method.message_count == 0
        dch.queue_delete(q)


def test_store_failure_without_confirms_closes_the_channel(vhosts, dirs):
    """No confirm mode: the client learns of a store failure by its channel
    closing with 541, and the publish is not forwarded."""
    data = os.path.join(dirs["top"], "data-full-noconfirm")
    p = Proxy(dirs["rules"], data, ["--state-map-mb", "1"])
    q = qname()
    try:
        with p.connect() as c:
            ch = declare(c, q)
            # Under 4 MiB: an LMDB store keeps larger ones in files.
            ch.basic_publish("", q, os.urandom((4 << 20) - 1))
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                ch.queue_declare(q, passive=True)
                time.sleep(1)
                ch.queue_declare(q, passive=True)
            assert e.value.reply_code == 541
            ch2 = c.channel()
            assert ch2.queue_declare(q, passive=True).method.message_count == 0
            ch2.queue_delete(q)
    finally:
        p.stop()


def test_full_filesystem_store_nacks_and_leaves_nothing(vhosts, dirs):
    """A filesystem store on a 2 MiB tmpfs: a 4 MiB payload does not fit,
    the publisher gets a nack, no partial file is left, smaller ones go on."""
    import subprocess
    mnt = os.path.join(dirs["top"], "tiny-fs")
    os.makedirs(mnt, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    rules = os.path.join(dirs["top"], "rules-tiny-fs")
    os.makedirs(rules, exist_ok=True)
    with open(os.path.join(rules, "r.json"), "w") as f:
        f.write('{"vhost": "/", "claim_check": {"match": [{"exchange": ""}], '
                '"store": {"type": "filesystem", "path": "%s"}}}' % mnt)
    p = Proxy(rules, os.path.join(dirs["top"], "data-tiny-fs"))
    q = qname()
    try:
        with p.connect() as c:
            ch = declare(c, q)
            ch.confirm_delivery()
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("", q, os.urandom(4 << 20))
            # What was written of it is removed right after.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and os.listdir(mnt):
                time.sleep(0.05)
            assert os.listdir(mnt) == []
            body = os.urandom(500000)
            ch.basic_publish("", q, body)
            with direct() as d:
                assert d.channel().queue_declare(q, passive=True).method.message_count == 1
            assert get_one(ch, q)[2] == body
            ch.queue_delete(q)
    finally:
        p.stop()
        subprocess.run(["umount", mnt])


def test_channel_reopened_right_after_a_proxy_close(proxy):
    """A channel the proxy closes (here: an ack of an unknown tag, 406) and
    the client reopens at once, before the broker's close-ok is in: the
    channel.open waits for it instead of being lost."""
    import amqp_wire as wire
    c = wire.RawClient(proxy.port).handshake()
    try:
        for _ in range(20):
            c.channel_open(1)
            c.send(wire.method_frame(1, wire.BASIC_ACK, b"\x00\x00\x00\x00\x00\x00\x03\xe7\x00"))
            f = c.expect(wire.CHANNEL_CLOSE, 1)
            assert f.args[:2] == b"\x01\x96"  # 406
            c.send(wire.method_frame(1, wire.CHANNEL_CLOSE_OK, b"")
                   + wire.method_frame(1, wire.CHANNEL_OPEN, wire.shortstr("")))
            c.expect(wire.CHANNEL_OPEN_OK, 1)
            c.send(wire.method_frame(1, wire.CHANNEL_CLOSE, b"\x00\xc8" + wire.shortstr("bye")
                                     + b"\x00\x00\x00\x00"))
            c.expect(wire.CHANNEL_CLOSE_OK, 1)
        c.close()
    finally:
        c.close_socket()


def test_client_vanishing_mid_rehydration(proxy):
    """Consumers that read the start of a 12 MiB rehydrated body and then
    vanish: the body's pieces in the proxy's output (the store's buffers,
    lent without a copy) are let go with the connection, the broker
    requeues the message, and a later consumer gets it whole. Five such
    vanishings leave the proxy's heap where it was."""
    import socket
    import struct as st
    import amqp_wire as wire
    body = os.urandom(12 << 20)
    q = qname()
    with proxy.connect() as c:
        ch = declare(c, q)
        ch.confirm_delivery()
        ch.basic_publish("", q, body)
    base = proxy.status("RssAnon")
    for _ in range(5):
        r = wire.RawClient(proxy.port).handshake()
        r.channel_open(1)
        r.send(wire.method_frame(1, wire.BASIC_GET, st.pack(">H", 0) + wire.shortstr(q)
                                 + st.pack(">B", 0)))
        assert r.read_frame().method == wire.BASIC_GET_OK
        assert r.read_frame().type == wire.FRAME_HEADER
        got = 0
        while got < (1 << 20):
            f = r.read_frame()
            assert f.type == wire.FRAME_BODY
            got += len(f.payload)
        time.sleep(0.3)  # the proxy's output to it fills
        r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, st.pack("ii", 1, 0))
        r.close_socket()
    with proxy.connect() as c:
        ch = c.channel()
        m = get_one(ch, q)
        assert m is not None and m[0].redelivered
        assert hashlib.sha256(m[2]).digest() == hashlib.sha256(body).digest()
        ch.queue_delete(q)
    grown = proxy.status("RssAnon") - base
    print("proxy anonymous RSS grew %d kB over five vanished consumers" % grown)
    if not SANITIZED:
        assert grown < 24 * 1024


def test_bytes_counted_as_written_to_each_side(vhosts, dirs):
    """acemq_proxy_bytes_total counts what the proxy writes to each side,
    not only the frames it relays unchanged: a 4 MiB body offloaded on the
    way in reaches the broker as a key (bytes_to_broker grows by far less
    than the body) and is rehydrated on the way out (bytes_to_client grows
    by at least the body)."""
    import json
    import urllib.request
    admin = __import__("conftest").free_port()
    p = Proxy(dirs["rules"], os.path.join(dirs["top"], "data-bytes"),
              ["--admin", "127.0.0.1:%d" % admin])

    def stats():
        with urllib.request.urlopen("http://127.0.0.1:%d/stats" % admin, timeout=5) as r:
            s = json.loads(r.read())
        return s["bytes_to_broker"], s["bytes_to_client"]

    body = os.urandom(4 << 20)
    q = qname()
    try:
        with p.connect() as c:
            ch = declare(c, q)
            ch.confirm_delivery()
            b0, c0 = stats()
            ch.basic_publish("", q, body)
            b1, c1 = stats()
            assert 0 < b1 - b0 < 64 * 1024, (b0, b1)
            assert get_one(ch, q)[2] == body
            ch.queue_delete(q)
        time.sleep(0.2)
        b2, c2 = stats()
        assert c2 - c1 >= len(body), (c1, c2)
    finally:
        assert p.stop() == 0, p.stderr()[-3000:]
