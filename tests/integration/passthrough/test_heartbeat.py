"""Heartbeats, a frozen broker and an unreachable upstream."""

import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pika
import pika.exceptions
import pytest

import amqp_wire as wire
import support


def idle_then_use(port, result, seconds=10.0):
    try:
        conn = support.connect(port, heartbeat=2)
        try:
            result["heartbeat"] = conn._impl.params.heartbeat
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.5)
            result["open_after_idle"] = conn.is_open
            ch = conn.channel()
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.confirm_delivery()
            ch.basic_publish("", q, b"still alive")
            result["get"] = ch.basic_get(q, auto_ack=True)[2]
        finally:
            support.safe_close(conn)
    except Exception as e:  # reported by the test
        result["error"] = repr(e)


def test_idle_client_with_heartbeat_stays_up(direct_port, proxy_port):
    """heartbeat=2, idle for 10 s (both sides run concurrently)."""
    results = {"direct": {}, "proxy": {}}
    threads = [threading.Thread(target=idle_then_use, args=(port, results[name]))
               for name, port in (("direct", direct_port), ("proxy", proxy_port))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for name, r in results.items():
        assert "error" not in r, (name, r)
        assert r == {"heartbeat": 2, "open_after_idle": True, "get": b"still alive"}, (name, r)


def heartbeat_frames_seen(port, seconds=7.0):
    """Raw client with heartbeat=2 that sends its own heartbeats every second;
    returns the arrival times of heartbeat frames from the server."""
    c = wire.RawClient(port).handshake(heartbeat=2)
    seen = []
    try:
        start = time.monotonic()
        next_beat = start
        while time.monotonic() - start < seconds:
            now = time.monotonic()
            if now >= next_beat:
                c.send(wire.frame(wire.FRAME_HEARTBEAT, 0, b""))
                next_beat = now + 1.0
            try:
                f = c.read_frame(timeout=max(next_beat - time.monotonic(), 0.01), skip_heartbeats=False)
            except socket.timeout:
                continue
            assert f.type == wire.FRAME_HEARTBEAT and f.channel == 0, f
            seen.append(time.monotonic() - start)
        c.close()
    finally:
        c.close_socket()
    return seen


def test_server_heartbeats_reach_raw_client(direct_port, proxy_port):
    """Both sides run concurrently; each sends its own heartbeats."""
    with ThreadPoolExecutor(2) as ex:
        direct, proxy = ex.map(heartbeat_frames_seen, (direct_port, proxy_port))
    for name, seen in (("direct", direct), ("proxy", proxy)):
        # RabbitMQ sends a heartbeat every heartbeat/2 seconds when otherwise idle
        assert len(seen) >= 3, (name, seen)
        gaps = [b - a for a, b in zip(seen, seen[1:])]
        # well inside the 2 x heartbeat a client may wait before giving up
        assert max(gaps) <= 3.0, (name, seen)


def test_broker_frozen_mid_stream(proxy_port, proxy_is_broker, new_queue, direct_port, record_property):
    """SIGSTOP the broker under a heartbeat=2 client: the proxy must close the
    client within ~the heartbeat timeout instead of leaving it hanging."""
    queue = new_queue("acemq-it-freeze")
    conn = support.connect(proxy_port, heartbeat=2)
    pids = []
    reason = None
    elapsed = None
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"before freeze")
        assert ch.basic_get(queue, auto_ack=True)[2] == b"before freeze"
        ch2 = conn.channel()  # unconfirmed channel for the traffic during the freeze
        pids = support.broker_pids()
        assert pids, "no beam.smp process found"
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        deadline = t0 + 30
        try:
            while time.monotonic() < deadline:
                ch2.basic_publish("", queue, b"while frozen")
                conn.process_data_events(time_limit=0.2)
        except Exception as e:
            reason = e
            elapsed = time.monotonic() - t0
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        support.safe_close(conn)
        assert support.wait_broker(60), "broker did not answer within 60 s after SIGCONT"

    desc = "%s %s after %s s" % (type(reason).__name__, reason, None if elapsed is None else round(elapsed, 2))
    record_property("close_reason", desc)
    print("client connection ended by:", desc)
    assert reason is not None, "client connection still open 30 s after the broker froze"
    if proxy_is_broker:
        # Direct to the frozen broker only pika's own heartbeat checker
        # (timeout + 5 s, checked every timeout + 5 s) can notice.
        assert isinstance(reason, pika.exceptions.AMQPHeartbeatTimeout), desc
        assert elapsed <= 20, desc
        return
    assert elapsed <= 10, desc
    # The proxy noticed before pika's checker could (it fires after >= 7 s)
    assert not isinstance(reason, pika.exceptions.AMQPHeartbeatTimeout), desc
    if isinstance(reason, pika.exceptions.ConnectionClosedByBroker):
        assert reason.reply_code == 320, desc
    else:
        assert isinstance(reason, (pika.exceptions.StreamLostError, pika.exceptions.ConnectionClosed)), desc

    # the proxy itself recovers once the broker is back
    assert support.wait_until(lambda: support.broker_answers(proxy_port), 30, interval=0.5), \
        "proxy does not serve new clients after the broker came back"


def test_upstream_unreachable_fails_fast(spawn_proxy):
    dead_port = support.free_port()
    p = spawn_proxy(upstream_port=dead_port, name="acemq-proxy-dead-upstream")
    for attempt in range(2):
        t0 = time.monotonic()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            support.connect(p.listen_port, socket_timeout=10, stack_timeout=30)
        elapsed = time.monotonic() - t0
        assert elapsed < 5, "connection attempt %d took %.1f s to fail" % (attempt, elapsed)

    # raw client: the proxy closes the socket or answers something, promptly
    t0 = time.monotonic()
    s = socket.create_connection((support.HOST, p.listen_port), timeout=10)
    try:
        s.sendall(wire.PROTOCOL_HEADER)
        try:
            first = s.recv(65536)
        except ConnectionResetError:
            first = b""
        except socket.timeout:
            pytest.fail("proxy sent nothing and kept the client socket open for 10 s with no upstream")
        assert time.monotonic() - t0 < 5, "took %.1f s (got %r)" % (time.monotonic() - t0, first)
    finally:
        s.close()
    assert p.alive(), "proxy exited after a failed upstream connect:\n" + p.log_tail()
