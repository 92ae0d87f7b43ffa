"""The claim check's S3 store through real proxies, a real broker and pika,
against npm's s3rver (behind a front that checks every signature with
botocore): what a consumer gets, what the bucket holds, the failures, the
memory, the janitor."""
import hashlib
import os
import threading
import time
import uuid

import pika
import pytest

from conftest import BUCKET, SANITIZED, s3_rule


def qname():
    return "acemq-s3-" + uuid.uuid4().hex[:12]


def prefix():
    return "claims-%s/" % uuid.uuid4().hex[:8]


def get_one(ch, q, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = ch.basic_get(q, auto_ack=True)
        if m[0] is not None:
            return m
        time.sleep(0.05)
    return None


def framed_key(body):
    assert body[:3] == b"\xac\x01\x01", body[:16]
    return body[3:].decode()


def peek_reference(q):
    """The body the broker holds (read straight from it, then requeued)."""
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    try:
        ch = c.channel()
        m = get_one(ch, q, 10)
        assert m is not None
        ch.basic_publish("", q, m[2], m[1])
        return m[2]
    finally:
        c.close()


def test_twenty_mib_through_the_verifying_front(broker, s3, front, proxies):
    """A 20 MiB payload (a multipart upload of three parts) and a small one
    (one PUT), published and consumed through a front that recomputes every
    signature with botocore: nothing refused, identical bytes, the object is
    the payload with the message's content type."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % front.port, s3_rule(pfx))
    rejected0 = len(front.rejected)
    big, small = os.urandom(20 << 20), os.urandom(100000)
    q = qname()
    with p.connect() as c:
        ch = c.channel()
        ch.queue_declare(q, auto_delete=False)
        ch.confirm_delivery()
        ch.basic_publish("", q, big, pika.BasicProperties(content_type="application/pdf"))
        ch.basic_publish("", q, small, pika.BasicProperties(content_type="text/plain"))
        ref = peek_reference(q)
        key = framed_key(ref)
        m1 = get_one(ch, q)
        m2 = get_one(ch, q)
        ch.queue_delete(q)
    assert front.rejected[rejected0:] == []
    bodies = {hashlib.sha256(m[2]).hexdigest() for m in (m1, m2)}
    assert bodies == {hashlib.sha256(big).hexdigest(), hashlib.sha256(small).hexdigest()}
    assert len(s3.objects(pfx)) == 2
    with open(s3.object_path(pfx + key), "rb") as f:
        stored = f.read()
    assert stored in (big, small)
    status, doc = p.get("/claims/%2F/" + key)
    assert status == 200 and doc["store"] == "s3" and doc["present"] is True
    assert doc["size"] == len(stored)
    for s in ("PUT", "POST?uploads", "PUT?partNumber&uploadId", "POST?uploadId", "HEAD",
              "GET +range"):
        assert s in front.shapes, (s, front.shapes)
