"""Backpressure: when one side stops reading, the proxy stops reading the
other side instead of buffering without limit; nothing is lost."""
import os
import re
import signal
import subprocess
import threading
import time
import uuid

import pika

import proxyproc

HERE = os.path.dirname(os.path.abspath(__file__))
PROXY = os.environ.get("ACEMQ_PROXY", os.path.join(HERE, "..", "..", "..", "build", "src", "acemq-proxy"))
LIMIT = 256 * 1024
# What the proxy may hold beyond its buffers: ASan's quarantine keeps freed
# chains resident, so a sanitized build gets more room (still well under
# the tens of MiB an unbounded proxy would hold).
SLACK = (16 << 20) if os.environ.get("ACEMQ_IT_SANITIZED") == "1" else (4 << 20)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def start_proxy():
    return proxyproc.start([PROXY, "--workers", "1", "--buffer-limit", str(LIMIT)])


stop = proxyproc.stop


def broker_pid():
    """The process listening on the broker's port."""
    out = subprocess.run(["ss", "-ltnpH", "sport = :5672"], capture_output=True,
                         text=True).stdout
    pids = {int(x.split("=")[1]) for x in re.findall(r"pid=\d+", out)}
    assert len(pids) == 1, out
    return pids.pop()


def test_slow_consumer_pauses_the_broker_leg():
    n, size = 600, 64 * 1024
    q = f"acemq-bp-{uuid.uuid4().hex[:8]}"
    d = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    dch = d.channel()
    dch.queue_declare(q)
    for i in range(n):
        dch.basic_publish("", q, i.to_bytes(4, "big") * (size // 4))
    proc, port = start_proxy()
    try:
        base = rss(proc.pid)
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
        ch = c.channel()
        got = []
        ch.basic_consume(q, lambda ch_, m, p, b: got.append(b), auto_ack=True)
        # The client reads nothing now: the broker pushes ~37 MiB at it.
        time.sleep(3)
        grew = rss(proc.pid) - base
        assert grew < 12 * LIMIT + SLACK, f"proxy buffered {grew} bytes for a stalled client"
        deadline = time.time() + 60
        while len(got) < n and time.time() < deadline:
            c.process_data_events(time_limit=0.2)
        assert len(got) == n
        for i, b in enumerate(got):
            assert b == i.to_bytes(4, "big") * (size // 4)
        c.close()
    finally:
        stop(proc)
        dch.queue_delete(q)
        d.close()


def test_fast_publisher_is_slowed_not_buffered():
    n, size = 64, 1 << 20
    q = f"acemq-bp-{uuid.uuid4().hex[:8]}"
    proc, port = start_proxy()
    pid = broker_pid()
    d = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    dch = d.channel()
    dch.queue_declare(q)
    done = threading.Event()
    errors = []

    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    ch = c.channel()

    def publish():
        try:
            for i in range(n):
                ch.basic_publish("", q, bytes([i]) * size)
            c.close()
        except Exception as e:  # reported below
            errors.append(e)
        finally:
            done.set()

    try:
        base = rss(proc.pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            t = threading.Thread(target=publish)
            t.start()
            time.sleep(3)
            grew = rss(proc.pid) - base
            assert not done.is_set(), f"64 MiB went through to a frozen broker {errors}"
            assert grew < 12 * LIMIT + SLACK, f"proxy buffered {grew} bytes"
        finally:
            os.kill(pid, signal.SIGCONT)
        t.join(timeout=60)
        assert done.is_set() and not errors, errors
        deadline = time.time() + 20
        while dch.queue_declare(q, passive=True).method.message_count < n:
            assert time.time() < deadline
            time.sleep(0.2)
        for i in range(n):
            m, p, b = dch.basic_get(q, auto_ack=True)
            assert b == bytes([i]) * size
    finally:
        stop(proc)
        dch.queue_delete(q)
        d.close()
