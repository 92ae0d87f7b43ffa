"""Several broker addresses: each client gets the first that answers within
the connect timeout; a node that just failed is tried last for a while; the
failover is invisible to the client."""

import socket
import time

import support
from conftest import PROXY_BIN, ProxyProcess


def closed_port():
    return support.free_port()  # nothing listens there: refused


def served(port, vhost="/"):
    t0 = time.monotonic()
    conn = support.connect(port, virtual_host=vhost)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"through the second broker address")
    m = ch.basic_get(q, auto_ack=True)
    conn.close()
    assert m[2] == b"through the second broker address"
    return time.monotonic() - t0


def start(upstreams, extra=()):
    p = ProxyProcess("acemq-proxy-upstreams", PROXY_BIN, support.BROKER_PORT,
                     extra_args=list(extra), upstreams=upstreams)
    p.start()
    return p


def test_refusing_first_address(rabbitmq):
    bad = "127.0.0.1:%d" % closed_port()
    p = start([bad, "127.0.0.1:%d" % support.BROKER_PORT])
    try:
        for _ in range(3):
            served(p.listen_port)
        log = p.log_text()
        assert "cannot connect to broker %s" % bad in log
        # Tried once, then skipped for upstream_retry_ms.
        assert log.count("cannot connect to broker %s" % bad) == 1, log
        assert "skipped for" in log
    finally:
        p.stop()


def test_silent_first_address(rabbitmq):
    lst, fillers = support.silent_listener()
    bad = "%s:%d" % lst.getsockname()
    p = start([bad, "127.0.0.1:%d" % support.BROKER_PORT], ["--connect-timeout-ms", "800"])
    try:
        first = served(p.listen_port)
        second = served(p.listen_port)
        print("first client %.2f s (waited for the silent address), second %.2f s" % (first, second))
        assert 0.8 <= first < 5
        assert second < 0.8
        assert "broker %s not reached within 800 ms" % bad in p.log_text()
    finally:
        p.stop()
        for f in fillers:
            f.close()
        lst.close()


def test_first_address_closes_before_start(rabbitmq):
    """An address that accepts and closes before connection.start: the
    client has seen nothing of it and is served by the next one."""
    lst = support.closing_listener()
    bad = "%s:%d" % lst.getsockname()
    p = start([bad, "127.0.0.1:%d" % support.BROKER_PORT])
    try:
        served(p.listen_port)
        assert "broker %s closed before connection.start" % bad in p.log_text()
    finally:
        p.stop()
        lst.close()


def test_all_addresses_down(rabbitmq):
    p = start(["127.0.0.1:%d" % closed_port(), "127.0.0.1:%d" % closed_port()])
    try:
        s = socket.create_connection((support.HOST, p.listen_port), timeout=5)
        s.sendall(b"AMQP\x00\x00\x09\x01")
        assert s.recv(100) == b""
        s.close()
        assert p.alive()
    finally:
        p.stop()
