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

from conftest import BUCKET, SANITIZED, S3rver, s3_rule


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
    rejected0, conns0, verified0 = len(front.rejected), front.connections, front.verified
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
    # Connections are kept alive and reused: far fewer than requests.
    requests, conns = front.verified - verified0, front.connections - conns0
    assert requests >= 15 and conns <= 4, (requests, conns)


def direct_conn():
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))


def depth(q):
    with direct_conn() as c:
        return c.channel().queue_declare(q, passive=True).method.message_count


def boto_client(port):
    import botocore.session
    from botocore.config import Config
    return botocore.session.get_session().create_client(
        "s3", endpoint_url="http://127.0.0.1:%d" % port, region_name="us-east-1",
        aws_access_key_id="S3RVER", aws_secret_access_key="S3RVER",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def test_two_proxies_one_bucket(broker, s3, proxies):
    """Published through proxy A, consumed through proxy B (s3rver checks
    the signatures itself here): the same bytes; the object in the bucket is
    exactly the payload; B's GET /claims finds it."""
    pfx = prefix()
    ep = "http://127.0.0.1:%d" % s3.port
    a, b = proxies(ep, s3_rule(pfx)), proxies(ep, s3_rule(pfx))
    body, q = os.urandom(20 << 20), qname()
    with a.connect() as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        ch.basic_publish("", q, body)
    key = framed_key(peek_reference(q))
    with open(s3.object_path(pfx + key), "rb") as f:
        assert f.read() == body
    status, doc = b.get("/claims/%2F/" + key)
    assert status == 200 and doc["present"] and doc["size"] == len(body), doc
    assert doc["age_s"] < 60
    with b.connect() as c:
        ch = c.channel()
        m = get_one(ch, q)
        ch.queue_delete(q)
    assert m is not None and m[2] == body
    status, doc = b.get("/claims/%2F/" + "0" * 32)
    assert status == 404 and doc["present"] is False


def publish_in_thread(p, q, body, result):
    def run():
        try:
            with p.connect() as c:
                ch = c.channel()
                ch.confirm_delivery()
                ch.basic_publish("", q, body)
                result.append("confirmed")
        except pika.exceptions.NackError:
            result.append("nacked")
        except Exception as e:  # noqa: BLE001
            result.append("error: %r" % e)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_store_stopped_mid_upload(broker, s3, proxies):
    """s3rver killed while the parts of a 40 MiB payload go up: the publish
    is nacked, nothing reaches the queue, no object is left."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % s3.port, s3_rule(pfx))
    q = qname()
    with direct_conn() as c:
        c.channel().queue_declare(q)
    uploads = os.path.join(s3.dir, BUCKET, "._S3rver_uploads")
    before = set(os.listdir(uploads)) if os.path.isdir(uploads) else set()
    result = []
    t = publish_in_thread(p, q, os.urandom(40 << 20), result)
    try:
        assert support_wait(lambda: os.path.isdir(uploads) and set(os.listdir(uploads)) - before,
                            30), "no multipart upload started"
        s3.stop()
        t.join(60)
        assert result == ["nacked"], result
        assert depth(q) == 0
    finally:
        s3.stop()
        s3.start()
    assert s3.objects(pfx) == []
    with direct_conn() as c:
        c.channel().queue_delete(q)
    assert "publish refused" in p.stderr() or "refused" in p.stderr()


def support_wait(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_store_stopped_before_a_delivery(broker, s3, proxies):
    """The store down when a claim check is delivered: the consumer's
    channel is closed with 541 and the broker requeues; once the store is
    back the payload is delivered."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % s3.port, s3_rule(pfx))
    body, q = os.urandom(3 << 20), qname()
    with p.connect() as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        ch.basic_publish("", q, body)
    s3.stop()
    try:
        with p.connect() as c:
            ch = c.channel()
            closed = []
            try:
                ch.basic_consume(q, lambda *a: None)
                support_wait(lambda: (c.process_data_events(0.1), not ch.is_open)[1], 30)
            except pika.exceptions.ChannelClosedByBroker as e:
                closed.append(e.reply_code)
            except pika.exceptions.ConnectionClosedByBroker as e:
                closed.append(e.reply_code)
            assert closed == [541] or not ch.is_open, closed
    finally:
        s3.start()
    assert support_wait(lambda: depth(q) == 1, 20), "not requeued"
    with p.connect() as c:
        ch = c.channel()
        m = get_one(ch, q)
        ch.queue_delete(q)
    assert m is not None and m[2] == body


def test_client_gone_mid_upload(broker, s3, front, proxies, tmp_path):
    """A publisher killed while its 60 MiB payload goes up: the multipart
    upload is aborted (ListMultipartUploads under the prefix is empty) and
    no object is left."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % front.port, s3_rule(pfx))
    q = qname()
    with direct_conn() as c:
        c.channel().queue_declare(q)
    script = tmp_path / "pub.py"
    script.write_text(
        "import os, pika\n"
        "c = pika.BlockingConnection(pika.ConnectionParameters('127.0.0.1', %d))\n"
        "ch = c.channel()\n"
        "ch.basic_publish('', %r, os.urandom(60 << 20))\n"
        "import time; time.sleep(60)\n" % (p.port, q))
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        assert support_wait(lambda: front.open_uploads(BUCKET, pfx), 30), "no upload started"
        proc.kill()
    finally:
        proc.wait()
    s3c = boto_client(front.port)
    assert support_wait(
        lambda: not s3c.list_multipart_uploads(Bucket=BUCKET, Prefix=pfx).get("Uploads"), 30)
    time.sleep(0.5)
    assert s3.objects(pfx) == []
    assert depth(q) == 0
    with direct_conn() as c:
        c.channel().queue_delete(q)
    assert "DELETE?uploadId" in front.shapes
    assert "GET?prefix&uploads" in front.shapes


@pytest.mark.skipif(SANITIZED, reason="sanitizers change the heap")
def test_memory_bounded_while_100_mib_pass_each_way(broker, s3, proxies):
    """RssAnon of the proxy stays within 16 MiB of where it started while a
    100 MiB payload is uploaded in 5 MiB parts and read back."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % s3.port, s3_rule(pfx),
                settings={"s3_part_size": str(5 << 20), "workers": "1"})
    q = qname()
    body = os.urandom(100 << 20)
    with p.connect() as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"warm-up" * 20000)
        get_one(ch, q)
    start = p.status("RssAnon")
    peak = [start]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], p.status("RssAnon"))
            time.sleep(0.01)
    t = threading.Thread(target=sample)
    t.start()
    try:
        with p.connect() as c:
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("", q, body)
            up = peak[0]
            m = get_one(ch, q, 120)
            ch.queue_delete(q)
    finally:
        stop.set()
        t.join()
    assert m is not None and hashlib.sha256(m[2]).digest() == hashlib.sha256(body).digest()
    print("RssAnon: start %d kB, peak %d kB on upload, %d kB overall" % (start, up, peak[0]))
    assert peak[0] - start <= 16 * 1024, (start, up, peak[0])


def test_retention_by_the_janitor(broker, s3, front, proxies):
    """Objects under the prefix older than retention_s are deleted by the
    janitor, listing in pages (a continuation token past 1000 keys); what
    is not a claim key is left alone."""
    pfx = prefix()
    s3c = boto_client(s3.port)
    keys = [pfx + uuid.uuid4().hex for _ in range(1010)]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda k: s3c.put_object(Bucket=BUCKET, Key=k, Body=b"x"), keys))
    s3c.put_object(Bucket=BUCKET, Key=pfx + "notes.txt", Body=b"not a claim")
    time.sleep(2.5)
    p = proxies("http://127.0.0.1:%d" % front.port, s3_rule(pfx, retention_s=2),
                settings={"purge_interval_s": "1"})
    assert support_wait(lambda: s3.objects(pfx) == [pfx + "notes.txt"], 90), \
        len(s3.objects(pfx))
    assert "GET?continuation-token&list-type&max-keys&prefix" in front.shapes, front.shapes
    assert "DELETE" in front.shapes
    # logged when the janitor's run ends, after its last delete
    assert support_wait(lambda: "claim payloads past 2 s removed" in p.stderr(), 10), \
        p.stderr()[-2000:]


def test_missing_object_is_on_missing(broker, s3, proxies):
    """A claim check whose object is gone (404) is handled as on_missing
    says: with pass, delivered as it is."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % s3.port, s3_rule(pfx, on_missing="pass"))
    q = qname()
    with p.connect() as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        ch.basic_publish("", q, os.urandom(200000))
        key = framed_key(peek_reference(q))
        boto_client(s3.port).delete_object(Bucket=BUCKET, Key=pfx + key)
        m = get_one(ch, q)
        ch.queue_delete(q)
    assert m is not None and framed_key(m[2]) == key
    assert "payload not in the store" in p.stderr()


def test_forbidden_store_refuses_the_publish(broker, s3, front, proxies):
    """A store that answers 403 (here: a wrong secret, refused by the
    verifying front): the publish is nacked and nothing is forwarded."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % front.port, s3_rule(pfx),
                settings={"s3_secret_key": "wrong"})
    q = qname()
    n0 = len(front.rejected)
    with p.connect() as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", q, os.urandom(100000))
        ch.basic_publish("", q, b"small: not offloaded")
        m = get_one(ch, q)
        ch.queue_delete(q)
    assert m is not None and m[2] == b"small: not offloaded"
    assert len(front.rejected) > n0
    assert s3.objects(pfx) == []
    # The secret is never shown nor logged.
    config = p.get_text("/config")
    assert "s3_secret_key = (set, not shown)" in config, config
    assert "wrong" not in config and "wrong" not in p.stderr()


def test_server_errors_are_retried(broker, s3, front, proxies):
    """Two 503 answers in a row are retried with backoff: the publish is
    confirmed and the payload delivered."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % front.port, s3_rule(pfx))
    q, body = qname(), os.urandom(300000)
    failed0 = front.failed
    front.fail_next = 2
    with p.connect() as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        ch.basic_publish("", q, body)
        m = get_one(ch, q)
        ch.queue_delete(q)
    assert front.failed - failed0 == 2
    assert m is not None and m[2] == body


def test_content_type_kept_and_never_a_header_injection(broker, s3, front, proxies):
    """The object carries the message's content type, for the single PUT
    and for a multipart upload; one with a CR LF in it is not sent as a
    header (the object gets the store's default)."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % front.port, s3_rule(pfx))
    q = qname()
    keys = []
    with p.connect() as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        for ctype, size in (("application/pdf", 100000), ("image/tiff", 9 << 20),
                            ("text/plain\r\nx-amz-meta-evil: 1", 100000)):
            ch.basic_publish("", q, os.urandom(size), pika.BasicProperties(content_type=ctype))
            m = get_one(direct_conn().channel(), q)
            keys.append(framed_key(m[2]))
        ch.queue_delete(q)
    s3c = boto_client(s3.port)
    heads = [s3c.head_object(Bucket=BUCKET, Key=pfx + k) for k in keys]
    assert heads[0]["ContentType"] == "application/pdf"
    assert heads[1]["ContentType"] == "image/tiff"
    assert heads[2]["ContentType"] != "text/plain" and "evil" not in heads[2]["Metadata"]


def test_tls_endpoint_verified_against_s3_ca(broker, proxies, tmp_path):
    """An https endpoint whose certificate is signed by a CA of our own:
    with s3_ca naming it the payload goes and comes back; without it the
    system's store does not know the CA and the publish is refused."""
    import subprocess
    key, cert = str(tmp_path / "key.pem"), str(tmp_path / "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    s3 = S3rver(tls=(key, cert))
    try:
        pfx = prefix()
        ep = "https://127.0.0.1:%d" % s3.port
        good = proxies(ep, s3_rule(pfx), settings={"s3_ca": cert})
        bad = proxies(ep, s3_rule(pfx))
        q, body = qname(), os.urandom(300000)
        with good.connect() as c:
            ch = c.channel()
            ch.queue_declare(q)
            ch.confirm_delivery()
            ch.basic_publish("", q, body)
            m = get_one(ch, q)
        assert m is not None and m[2] == body
        with bad.connect() as c:
            ch = c.channel()
            ch.confirm_delivery()
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("", q, body)
            ch.queue_delete(q)
        assert len(s3.objects(pfx)) == 1
    finally:
        s3.close()


def test_janitor_aborts_stale_multipart_uploads(broker, s3, front, proxies):
    """A multipart upload under the prefix started more than a day ago (what
    a crash mid-upload leaves) is aborted by the janitor; a recent one, and
    one whose key is not a claim key, are left alone."""
    pfx = prefix()
    s3c = boto_client(s3.port)
    stale = s3c.create_multipart_upload(Bucket=BUCKET, Key=pfx + uuid.uuid4().hex)["UploadId"]
    fresh = s3c.create_multipart_upload(Bucket=BUCKET, Key=pfx + uuid.uuid4().hex)["UploadId"]
    other = s3c.create_multipart_upload(Bucket=BUCKET, Key=pfx + "video.mp4")["UploadId"]
    old = time.time() - 2 * 86400
    for uid in (stale, other):
        os.utime(os.path.join(front.uploads_dir(BUCKET), uid), (old, old))
    proxies("http://127.0.0.1:%d" % front.port, s3_rule(pfx, retention_s=0),
            settings={"purge_interval_s": "1"})
    assert support_wait(lambda: stale not in [u for _, u, _ in front.open_uploads(BUCKET, pfx)],
                        30)
    time.sleep(1.5)  # another run: the others stay
    left = sorted(u for _, u, _ in front.open_uploads(BUCKET, pfx))
    assert left == sorted([fresh, other])


def test_refused_without_confirms_closes_the_channel_541(broker, s3, front, proxies):
    """Without publisher confirms a publish the store refuses closes the
    publisher's channel with 541; nothing reaches the queue."""
    pfx = prefix()
    p = proxies("http://127.0.0.1:%d" % front.port, s3_rule(pfx),
                settings={"s3_secret_key": "wrong"})
    q = qname()
    with p.connect() as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.basic_publish("", q, os.urandom(100000))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare(q, passive=True)
            time.sleep(1)
            ch.queue_declare(q, passive=True)
        assert e.value.reply_code == 541
        ch2 = c.channel()
        assert ch2.queue_declare(q, passive=True).method.message_count == 0
        ch2.queue_delete(q)
    # A 403 stored nothing: no DELETE is sent after it.
    assert "removing" not in p.stderr()
