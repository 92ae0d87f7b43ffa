"""A proxy with an admin token, the engine's credentials and a claim_check
rule (a filesystem store, so that a test can delete a payload) on a vhost
of its own, and dead letters made on the broker: messages published
through the proxy to an exchange, rejected from their queue into its
dead-letter queue."""
import json
import os
import shutil
import tempfile

import pika
import pytest

import rulesproxy
import support

VHOST = "acemq-replay"
TOKEN = "replay-token-1"
EXCHANGE = "replay-x"    # direct: each original queue bound by its name
DLX = "replay-dlx"       # direct: each dead-letter queue bound by its queue's name
THRESHOLD = 1000         # bodies from here on are claim-checked


class Proxy(rulesproxy.Proxy):
    def __init__(self, rules, data, fs):
        self.admin_port = rulesproxy.free_port()
        self.fs = fs
        super().__init__(rules, data, ["--admin", "127.0.0.1:%d" % self.admin_port,
                                       "--admin-token", TOKEN, "--engine-user", "guest",
                                       "--engine-password", "guest"])
        assert support.wait_until(lambda: support.port_accepts(self.admin_port), 10), \
            self.stderr()

    def request(self, method, path, body=None, token=TOKEN, raw=None):
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        return support.admin_request(self.admin_port, method, path, token, data, timeout=60)

    def replay(self, **spec):
        spec.setdefault("vhost", VHOST)
        return self.request("POST", "/replay", spec)

    def wait_replay(self, rid, timeout=120):
        """The replay's answer once it has ended."""
        last = {}

        def ended():
            status, last["r"] = self.request("GET", "/replay/%d" % rid)
            assert status == 200, last["r"]
            return last["r"]["state"] not in ("starting", "running")
        assert support.wait_until(ended, timeout, interval=0.2), last.get("r")
        return last["r"]


def direct():
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", support.BROKER_PORT, VHOST, socket_timeout=30))


def check_stopped(p):
    rc = p.stop()
    text = p.stderr()
    assert rc == 0, "proxy exited with %s:\n%s" % (rc, text[-3000:])
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]


@pytest.fixture(scope="session")
def dirs():
    support.ensure_rabbitmq(60)
    support.fresh_vhost(VHOST)
    top = tempfile.mkdtemp(prefix="acemq-replay-")
    d = {"rules": os.path.join(top, "rules"), "data": os.path.join(top, "data"),
         "fs": os.path.join(top, "claims")}
    os.makedirs(d["rules"])
    os.makedirs(d["fs"])
    with open(os.path.join(d["rules"], "replay.json"), "w") as f:
        f.write('{"vhost": "%s", "claim_check": {"match": [{"exchange": "%s"}], '
                '"threshold": %d, "store": {"type": "filesystem", "path": "%s"}}}'
                % (VHOST, EXCHANGE, THRESHOLD, d["fs"]))
    c = direct()
    ch = c.channel()
    ch.exchange_declare(EXCHANGE, "direct", durable=True)
    ch.exchange_declare(DLX, "direct", durable=True)
    c.close()
    yield d
    support.rabbitmqctl("delete_vhost", VHOST, check=False)
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def proxy(dirs):
    p = Proxy(dirs["rules"], dirs["data"], dirs["fs"])
    yield p
    check_stopped(p)


@pytest.fixture
def queues():
    """An original queue (bound to EXCHANGE by its name, dead-lettering to
    DLX) and its dead-letter queue (bound to DLX by the original's name)."""
    orig = support.unique_name("replay-orig")
    dlq = orig + ".dlq"
    c = direct()
    ch = c.channel()
    ch.queue_declare(orig, durable=True, arguments={"x-dead-letter-exchange": DLX})
    ch.queue_bind(orig, EXCHANGE, orig)
    ch.queue_declare(dlq, durable=True)
    ch.queue_bind(dlq, DLX, orig)
    c.close()
    yield orig, dlq
    c = direct()
    ch = c.channel()
    ch.queue_delete(orig)
    ch.queue_delete(dlq)
    c.close()


def body_of(i, claimed):
    """Message i's body: over the threshold (claim-checked) when claimed."""
    head = ("m%05d:" % i).encode()
    if not claimed:
        return head + b"small"
    return head + bytes((i + k) % 251 for k in range(THRESHOLD + 500))


def depth(queue):
    c = direct()
    n = c.channel().queue_declare(queue, passive=True).method.message_count
    c.close()
    return n


def dead_letters(proxy, orig, dlq, n, claimed=lambda i: i % 10 == 0):
    """n messages published through the proxy (confirmed) to EXCHANGE with
    routing key orig, message-id m%05d, then rejected from orig on the
    broker into dlq. Returns {message_id: body}."""
    sent = {}
    c = proxy.connect(VHOST)
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(n):
        mid = "m%05d" % i
        sent[mid] = body_of(i, claimed(i))
        ch.basic_publish(EXCHANGE, orig, sent[mid],
                         pika.BasicProperties(message_id=mid, delivery_mode=2))
    c.close()
    c = direct()
    ch = c.channel()
    ch.basic_qos(prefetch_count=200)
    got = 0
    for method, _props, _body in ch.consume(orig, inactivity_timeout=5):
        if method is None:
            break
        got += 1
        if got % 100 == 0 or got == n:
            ch.basic_nack(method.delivery_tag, multiple=True, requeue=False)
        if got == n:
            break
    ch.cancel()
    c.close()
    assert got == n
    assert support.wait_until(lambda: depth(dlq) == n, 20), depth(dlq)
    return sent


def take_all(conn, queue, timeout=3):
    """Every message of queue as (message_id, body, headers), acknowledged."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    out = []
    for method, props, body in ch.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        out.append((props.message_id, body, props.headers or {}))
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    return out
