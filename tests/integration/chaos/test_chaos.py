"""Chaos against the real binary: for a bounded time (ACEMQ_CHAOS_SECONDS,
60 by default) many concurrent raw clients misbehave at every stage of a
connection while well-behaved pika clients publish with confirms and
consume. Every message must arrive exactly once and intact, the good
clients must see no error, and afterwards the proxy must be alive, serve a
new client, and be back near its starting file descriptors and RSS.

The run is driven by one seed (ACEMQ_CHAOS_SEED, else the time), printed
first, so a failure reproduces."""

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
import amqp_wire as wire  # noqa: E402
import support  # noqa: E402

PROXY = os.environ.get("ACEMQ_PROXY", os.path.join(HERE, "..", "..", "..", "build", "src", "acemq-proxy"))
SECONDS = float(os.environ.get("ACEMQ_CHAOS_SECONDS", "60"))
SEED = int(os.environ.get("ACEMQ_CHAOS_SEED", str(int(time.time()))))
SANITIZED = os.environ.get("ACEMQ_IT_SANITIZED") == "1"
CHAOS_THREADS = 12
CHAOS_QUEUE = "acemq-chaos-%d-%d" % (SEED, os.getpid())
PUBLISHERS = 3
CONSUMERS = 2
# A pooled vhost: chaos clients on it share broker connections with the
# last publisher and consumer, who must see no error either.
POOL_VHOST = "acemq-chaos-pool"
# Where an operator closes, drains, pauses and disconnects chaos clients
# through the admin endpoint (pooled too, on a pool of its own): only
# chaos clients go there.
OP_VHOST = "acemq-chaos-op"
VHOSTS = ["/", POOL_VHOST, OP_VHOST]

START_OK = wire.method_frame(0, wire.CONNECTION_START_OK, wire.table({}) + wire.shortstr("PLAIN")
                             + wire.longstr(b"\x00guest\x00guest") + wire.shortstr("en_US"))
TUNE_OK = wire.method_frame(0, wire.CONNECTION_TUNE_OK, struct.pack(">HIH", 2047, 131072, 0))


def open_frame(vhost):
    return wire.method_frame(0, wire.CONNECTION_OPEN, wire.shortstr(vhost) + wire.shortstr("") + b"\x00")
CLOSE = wire.method_frame(0, wire.CONNECTION_CLOSE, struct.pack(">H", 200) + wire.shortstr("bye")
                          + struct.pack(">HH", 0, 0))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def proc_rss_kb(pid, field="RssAnon"):
    """The proxy's heap (RssAnon): the claim store's pages that LMDB maps
    from its file (RssFile) are the page cache's, not the proxy's."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def session_script(rng):
    """The bytes of a whole, valid client session, pipelined."""
    ch = 1 + rng.randrange(3)
    out = wire.PROTOCOL_HEADER + START_OK + TUNE_OK + open_frame(rng.choice(VHOSTS))
    out += wire.method_frame(ch, wire.CHANNEL_OPEN, wire.shortstr(""))
    if rng.random() < 0.5:
        out += wire.method_frame(ch, wire.CONFIRM_SELECT, b"\x00")
    for _ in range(rng.randrange(4)):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
        props = {"reply_to": "chaos-replies"} if rng.random() < 0.5 else {}
        # the schedule rule's delay, and the publish-dedup header, at times
        headers = {}
        if rng.random() < 0.3:
            headers["x-delay"] = rng.choice([1, 700, "soon", -5])
        if rng.random() < 0.3:
            headers["x-deduplication-header"] = "d%d" % rng.randrange(4)
        if headers:
            props["headers"] = headers
        out += wire.publish_frames(ch, "acemq-chaos-nowhere", body, 131072, props or None)
    return out + CLOSE


BAD_FRAMES = [
    wire.frame(wire.FRAME_METHOD, 1, b"\x00\x3c\x00\x28", end=0x00),
    wire.frame(9, 1, b"abc"),
    wire.frame(wire.FRAME_BODY, 1, b"body without header"),
    wire.content_header_frame(1, 5),
    wire.frame(wire.FRAME_HEADER, 0, b"\x00\x3c"),
    struct.pack(">BHI", wire.FRAME_BODY, 1, 1 << 30),
    wire.method_frame(1, (60, 40), b"\xff\xff"),  # publish whose arguments do not decode
    wire.method_frame(0, (10, 70), wire.longstr(b"x") + wire.shortstr("r")),  # update-secret
]


class Chaos(object):
    """One misbehaving client at a time, chosen by the rng."""

    def __init__(self, port, rng, deadline):
        self.port = port
        self.rng = rng
        self.deadline = deadline
        self.counts = {}

    def sock(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=3)
        s.settimeout(3)
        return s

    def finish(self, s, how):
        """End a connection: close, reset, or half-close and read to the end."""
        try:
            if how == "rst":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif how == "half":
                s.shutdown(socket.SHUT_WR)
                end = time.monotonic() + 3
                while time.monotonic() < end and s.recv(65536):
                    pass
            elif how == "read":
                end = time.monotonic() + 1
                while time.monotonic() < end and s.recv(65536):
                    pass
        except OSError:
            pass
        s.close()

    def garbage_after_header(self):
        s = self.sock()
        s.sendall(wire.PROTOCOL_HEADER + bytes(self.rng.randrange(256) for _ in range(1 + self.rng.randrange(200))))
        self.finish(s, self.rng.choice(["close", "rst", "read", "half"]))

    def cut_session(self):
        data = session_script(self.rng)
        cut = self.rng.randrange(len(data) + 1)
        s = self.sock()
        pos = 0
        while pos < cut:  # in a few writes, so cuts land at every stage
            step = min(cut - pos, 1 + self.rng.randrange(200))
            s.sendall(data[pos:pos + step])
            pos += step
            if self.rng.random() < 0.2:
                time.sleep(0.005)
        self.finish(s, self.rng.choice(["close", "rst", "half", "read"]))

    def bad_frame_after_tune(self):
        c = wire.RawClient(self.port, timeout=5)
        try:
            c.handshake(vhost=self.rng.choice(VHOSTS))
            if self.rng.random() < 0.7:
                c.channel_open(1)
            c.send(self.rng.choice(BAD_FRAMES))
            self.finish(c.sock, self.rng.choice(["read", "rst", "close"]))
        except (OSError, AssertionError, wire.ConnectionClosedError):
            c.close_socket()

    def silent(self):
        s = self.sock()
        if self.rng.random() < 0.5:
            s.sendall(wire.PROTOCOL_HEADER[: self.rng.randrange(8)])
        time.sleep(self.rng.random() * 0.3)
        self.finish(s, self.rng.choice(["close", "rst"]))

    def run(self):
        actions = [self.garbage_after_header, self.cut_session, self.cut_session,
                   self.bad_frame_after_tune, self.silent]
        while time.monotonic() < self.deadline:
            a = self.rng.choice(actions)
            try:
                a()
            except OSError:
                pass
            self.counts[a.__name__] = self.counts.get(a.__name__, 0) + 1


def make_body(rng, i):
    size = rng.choice([0, 1, 100, 4000, 70000, 131072 * 2 + 17])
    seed = ("%d-%d" % (SEED, i)).encode()
    out = b""
    while len(out) < size:
        seed = hashlib.sha256(seed).digest()
        out += seed
    return out[:size]


def test_chaos():
    print("chaos seed: %d (ACEMQ_CHAOS_SEED=%d reproduces), %.0f s" % (SEED, SEED, SECONDS))
    rules = tempfile.mkdtemp(prefix="acemq-chaos-rules-")
    for v in (POOL_VHOST, OP_VHOST):
        support.rabbitmqctl("add_vhost", v, check=False)
        support.rabbitmqctl("set_permissions", "-p", v, "guest", ".*", ".*", ".*")
    with open(os.path.join(rules, "pool.json"), "w") as f:
        f.write('{"vhost": "%s", "pool": {"max_connections": 2}}' % POOL_VHOST)
    with open(os.path.join(rules, "op.json"), "w") as f:
        f.write('{"vhost": "%s", "pool": {"max_connections": 1}}' % OP_VHOST)
    with open(os.path.join(rules, "root.json"), "w") as f:
        # reply_to rewrites, and the claim check sends the good clients'
        # larger bodies through the store and back: the asynchronous
        # pipeline under fire.
        # and every delivery to the good consumers is claimed and every ack
        # confirmed (their message-ids are unique: all must arrive once).
        # The misbehaving clients' publishes may carry x-delay (the schedule
        # rule, with the engine running) and a publish-dedup header.
        f.write('{"vhost": "/", "reply_to": {"enabled": true}, "claim_check": '
                '{"match": [{"exchange": ""}], "threshold": 60000}, "idempotency": '
                '[{"queue": "%s", "key": "message-id"}], '
                '"schedule": {"match": [{"exchange": "", "routing_key": "acemq-chaos-nowhere"}]}, '
                '"dedup_publish": {"match": [{"exchange": "", "routing_key": '
                '"acemq-chaos-nowhere"}], "window_s": 5}}' % CHAOS_QUEUE)
    log = tempfile.NamedTemporaryFile("w+", prefix="acemq-chaos-", suffix=".log", delete=False)
    port, admin = free_port(), free_port()
    proc = subprocess.Popen([PROXY, "--listen", "127.0.0.1:%d" % port, "--upstream", "127.0.0.1:5672",
                             "--admin", "127.0.0.1:%d" % admin,
                             "--rules", rules, "--data-dir", os.path.join(rules, "data"),
                             "--log-level", "warning", "--handshake-timeout-ms", "3000",
                             "--engine-user", "guest", "--engine-password", "guest"],
                            stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if support.port_accepts(port):
                    break
                raise OSError("not listening yet")
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "proxy did not start"
                time.sleep(0.05)
        _run(proc, port, admin, rules)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.seek(0)
        text = log.read()
        lines = text.splitlines()
        print("proxy log: %d lines; last ones:\n%s" % (len(lines), "\n".join(lines[-30:])))
        shutil.rmtree(rules, ignore_errors=True)
    assert proc.returncode == 0, "proxy exit code %s" % proc.returncode
    assert "AddressSanitizer" not in text and "runtime error" not in text


def _run(proc, port, admin, rules):
    root = pika.ConnectionParameters("127.0.0.1", port, heartbeat=30, blocked_connection_timeout=60)
    pooled = pika.ConnectionParameters("127.0.0.1", port, POOL_VHOST, heartbeat=30,
                                       blocked_connection_timeout=60)
    queue = CHAOS_QUEUE

    # Warm up (one full client each), then take the baseline.
    for params in (root, pooled):
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare(queue, auto_delete=False)
        ch.queue_purge(queue)
        conn.close()
    # The operator's vhost: its pool's broker connection open from here on.
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, OP_VHOST))
    conn.channel()
    conn.close()
    time.sleep(0.5)
    fds0, rss0 = proc_fds(proc.pid), proc_rss_kb(proc.pid)

    stop_at = time.monotonic() + SECONDS
    errors = []
    sent = {}
    received = {}
    lock = threading.Lock()
    publishers_done = threading.Event()

    def publisher(idx):
        rng = random.Random(SEED * 1000 + idx)
        params = pooled if idx == PUBLISHERS - 1 else root
        try:
            c = pika.BlockingConnection(params)
            pch = c.channel()
            pch.confirm_delivery()
            i = 0
            while time.monotonic() < stop_at:
                mid = "%sp%d-%d" % ("pool-" if params is pooled else "", idx, i)
                body = make_body(rng, idx * 1000000 + i)
                pch.basic_publish("", queue, body, pika.BasicProperties(
                    message_id=mid, headers={"sha256": hashlib.sha256(body).hexdigest()}),
                    mandatory=True)
                with lock:
                    sent[mid] = hashlib.sha256(body).hexdigest()
                i += 1
            c.close()
        except Exception as e:  # noqa: BLE001 - any error is the finding
            errors.append("publisher %d: %r" % (idx, e))

    def consumer(idx):
        params = pooled if idx == CONSUMERS - 1 else root
        try:
            c = pika.BlockingConnection(params)
            cch = c.channel()
            # 100: idempotency asks the broker for 1000 more and keeps
            # them (claims ahead of the client)
            cch.basic_qos(prefetch_count=100)
            idle_since = None
            for method, props, body in cch.consume(queue, inactivity_timeout=0.5):
                if method is None:
                    if publishers_done.is_set():
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > 3:
                            break
                    continue
                idle_since = None
                digest = hashlib.sha256(body).hexdigest()
                with lock:
                    received.setdefault(props.message_id, []).append(
                        (digest, (props.headers or {}).get("sha256")))
                cch.basic_ack(method.delivery_tag)
            cch.cancel()
            c.close()
        except Exception as e:  # noqa: BLE001
            errors.append("consumer %d: %r" % (idx, e))

    reloads = [0]

    def reloader():
        # Every two seconds a rules reload gives another vhost brokers of
        # its own, or takes them away: the chaos clients meet the proxy
        # passing the handshake through and greeting them itself, and
        # sessions opened in one mode live on in the other.
        other = os.path.join(rules, "other.json")
        while time.monotonic() < stop_at:
            time.sleep(2)
            if os.path.exists(other):
                os.unlink(other)
            else:
                with open(other, "w") as f:
                    f.write('{"vhost": "acemq-chaos-other", "upstream": ["127.0.0.1:5672"]}')
            proc.send_signal(signal.SIGHUP)
            reloads[0] += 1

    actions = {}

    def operator():
        # An operator at the admin endpoint, acting on the chaos clients
        # of OP_VHOST while they come and go: a connection closed or
        # drained (404 once it has gone), the vhost paused and resumed,
        # or disconnected. A pause is always resumed.
        rng = random.Random(SEED + 31)
        quoted = OP_VHOST.replace("/", "%2F")
        while time.monotonic() < stop_at:
            time.sleep(0.2 + rng.random())
            what = rng.choice(["close", "drain", "pause", "disconnect"])
            if what in ("close", "drain"):
                status, rows = support.admin_request(admin, "GET", "/connections")
                ids = [r["id"] for r in rows["rows"] if r.get("vhost") == OP_VHOST] \
                    if status == 200 else []
                if not ids:
                    continue
                status, _ = support.admin_request(
                    admin, "POST", "/connections/%d/%s" % (rng.choice(ids), what),
                    body=json.dumps({"reason": "chaos"}) if what == "close" else None)
                assert status in (200, 404), (what, status)
            elif what == "pause":
                assert support.admin_request(admin, "POST", "/vhosts/%s/pause" % quoted)[0] == 200
                time.sleep(rng.random())
                what = "pause and resume"
                assert support.admin_request(admin, "POST", "/vhosts/%s/resume" % quoted)[0] == 200
            else:
                assert support.admin_request(admin, "POST",
                                             "/vhosts/%s/disconnect" % quoted)[0] == 200
            actions[what] = actions.get(what, 0) + 1

    op_errors = []

    def operator_run():
        try:
            operator()
        except Exception as e:  # noqa: BLE001 - any error is the finding
            op_errors.append(repr(e))

    chaos = [Chaos(port, random.Random(SEED + 7919 * i), stop_at) for i in range(CHAOS_THREADS)]
    threads = [threading.Thread(target=c.run) for c in chaos] + [
        threading.Thread(target=reloader), threading.Thread(target=operator_run)]
    pubs = [threading.Thread(target=publisher, args=(i,)) for i in range(PUBLISHERS)]
    cons = [threading.Thread(target=consumer, args=(i,)) for i in range(CONSUMERS)]
    for t in threads + pubs + cons:
        t.start()
    for t in threads + pubs:
        t.join()
    publishers_done.set()
    for t in cons:
        t.join(120)
    assert proc.poll() is None, "the proxy died during the chaos"

    counts = {}
    for c in chaos:
        for k, v in c.counts.items():
            counts[k] = counts.get(k, 0) + v
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % admin, timeout=5) as r:
        st = json.loads(r.read())
    print("chaos clients:", counts, "messages sent:", len(sent), "received:", len(received),
          "offloaded:", st["claims_offloaded"], "rehydrated:", st["claims_rehydrated"],
          "claimed:", st["idem_claimed"], "rules reloads (greeting on, off):", reloads[0],
          "operator's actions:", actions)
    assert not op_errors, op_errors
    assert sum(actions.values()) >= 3, actions
    assert st["claims_offloaded"] > 0 and st["claims_rehydrated"] > 0
    assert reloads[0] >= 2 and st["rules_reloads"] >= reloads[0] - 1, (reloads, st["rules_reloads"])
    root_sent = [k for k in sent if not k.startswith("pool-")]
    assert len(root_sent) > 0 and len(sent) > len(root_sent), "both vhosts carried messages"
    assert st["idem_claimed"] >= len(root_sent) and st["idem_duplicate"] == 0
    assert st["pool_connections"] <= 3  # 2 for POOL_VHOST, 1 for OP_VHOST
    assert not errors, "well-behaved clients saw errors: %s" % errors
    assert sum(counts.values()) > 100
    assert len(sent) > 0
    missing = sorted(set(sent) - set(received))
    extra = sorted(set(received) - set(sent))
    dup = sorted(k for k, v in received.items() if len(v) > 1)
    bad = sorted(k for k, v in received.items() if k in sent and any(d != sent[k] or h != sent[k] for d, h in v))
    assert not missing, "%d messages lost, e.g. %s" % (len(missing), missing[:5])
    assert not extra and not dup, "unexpected or duplicate deliveries: %s %s" % (extra[:5], dup[:5])
    assert not bad, "%d bodies corrupted, e.g. %s" % (len(bad), bad[:5])

    # A new client is served.
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_delete(queue)
    conn.close()

    # Back near the start: every connection the chaos opened is gone (the
    # broker closes a broken handshake after about 3 s).
    end = time.monotonic() + 20
    while time.monotonic() < end and proc_fds(proc.pid) > fds0 + 2:
        time.sleep(0.25)
    fds1, rss1 = proc_fds(proc.pid), proc_rss_kb(proc.pid)
    print("proxy fds %d -> %d, anonymous RSS %d kB -> %d kB (file-mapped now %d kB)"
          % (fds0, fds1, rss0, rss1, proc_rss_kb(proc.pid, "RssFile")))
    assert fds1 <= fds0 + 2, "file descriptors leaked: %d -> %d" % (fds0, fds1)
    slack = 512 * 1024 if SANITIZED else 48 * 1024
    assert rss1 <= rss0 + slack, "RSS grew from %d kB to %d kB" % (rss0, rss1)
