"""Limits and protection: max_connections, max_connections_per_vhost,
max_channels, handshake_timeout_ms and connect_timeout_ms do what they say;
each refusal is clear, counted by reason and logged once per episode."""

import json
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pika
import pytest

import amqp_wire as wire
import support
from conftest import PROXY_BIN, ProxyProcess

VHOST = "acemq-limits"


@pytest.fixture(scope="module")
def limited(rabbitmq):
    support.rabbitmqctl("add_vhost", VHOST, check=False)
    support.rabbitmqctl("set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*")
    admin = support.free_port()
    p = ProxyProcess("acemq-proxy-limits", PROXY_BIN, support.BROKER_PORT,
                     extra_args=["--max-connections-per-vhost", "3", "--max-channels", "5",
                                 "--handshake-timeout-ms", "1500", "--admin",
                                 "127.0.0.1:%d" % admin])
    p.start()
    p.admin = admin
    yield p
    p.stop()


def stats(p):
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % p.admin, timeout=5) as r:
        return json.loads(r.read())


def test_max_connections_per_vhost(limited):
    before = stats(limited)["refused_max_connections_per_vhost"]
    conns = [support.connect(limited.listen_port) for _ in range(3)]
    try:
        for _ in range(3):
            with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
                support.connect(limited.listen_port)
            assert "max_connections_per_vhost" in str(e.value)
        # Another vhost has its own count.
        other = support.connect(limited.listen_port, virtual_host=VHOST)
        other.channel().queue_declare("", exclusive=True)
        other.close()
        # One goes, one comes.
        conns.pop().close()
        time.sleep(0.2)
        conns.append(support.connect(limited.listen_port))
    finally:
        for c in conns:
            support.safe_close(c)
    assert stats(limited)["refused_max_connections_per_vhost"] - before == 3
    log = limited.log_text()
    assert log.count("max_connections_per_vhost reached") == 1, log[-2000:]


def test_max_channels(limited):
    before = stats(limited)["refused_max_channels"]
    c = wire.RawClient(limited.listen_port).handshake(vhost=VHOST)
    try:
        for ch in range(1, 6):
            c.channel_open(ch)
        # Closing one frees its place.
        c.send(wire.method_frame(3, wire.CHANNEL_CLOSE, b"\x00\xc8" + wire.shortstr("bye")
                                 + b"\x00\x00\x00\x00"))
        c.expect(wire.CHANNEL_CLOSE_OK, 3)
        c.channel_open(6)
        c.send(wire.method_frame(7, wire.CHANNEL_OPEN, wire.shortstr("")))
        frames, _ = c.read_until_eof(5)
        reply = wire.find_connection_close(frames)
        assert reply is not None, frames
        assert reply["reply_code"] == 530
        assert "max_channels (5)" in reply["reply_text"]
    finally:
        c.close_socket()
    assert stats(limited)["refused_max_channels"] - before == 1


def test_silent_sockets_dropped_within_handshake_timeout(limited):
    """200 sockets that connect and say nothing (or stop half way) are
    dropped within handshake_timeout_ms, while a normal client is served."""
    socks = []
    for i in range(200):
        s = socket.create_connection((support.HOST, limited.listen_port))
        if i % 2:
            s.sendall(wire.PROTOCOL_HEADER)  # and then nothing
        socks.append(s)
    t0 = time.monotonic()
    conn = support.connect(limited.listen_port, virtual_host=VHOST)
    conn.channel().queue_declare("", exclusive=True)

    def wait_closed(s):
        s.settimeout(10)
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
        return time.monotonic() - t0

    with ThreadPoolExecutor(32) as ex:
        times = list(ex.map(wait_closed, socks))
    for s in socks:
        s.close()
    conn.close()
    print("slowest silent socket dropped after %.2f s" % max(times))
    assert max(times) < 1.5 + 2.0


def test_max_connections(rabbitmq):
    p = ProxyProcess("acemq-proxy-maxconn", PROXY_BIN, support.BROKER_PORT,
                     extra_args=["--max-connections", "3"])
    p.start()
    try:
        conns = [support.connect(p.listen_port) for _ in range(3)]
        time.sleep(0.2)
        for _ in range(2):
            s = socket.create_connection((support.HOST, p.listen_port), timeout=5)
            try:
                s.sendall(wire.PROTOCOL_HEADER)
                got = s.recv(100)
            except ConnectionResetError:
                got = b""
            assert got == b""  # closed before a word of AMQP
            s.close()
        for c in conns:
            c.close()
        time.sleep(0.2)
        support.connect(p.listen_port).close()
        assert p.log_text().count("max_connections reached") == 1
    finally:
        p.stop()


def test_connect_timeout(rabbitmq):
    """A broker address that never answers (a listening socket whose accept
    queue is full): the client is closed within connect_timeout_ms."""
    lst = socket.socket()
    lst.bind((support.HOST, 0))
    lst.listen(0)
    port = lst.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue: later SYNs are dropped
        f = socket.socket()
        f.setblocking(False)
        try:
            f.connect((support.HOST, port))
        except BlockingIOError:
            pass
        fillers.append(f)
    time.sleep(0.2)
    p = ProxyProcess("acemq-proxy-connect-timeout", PROXY_BIN, port,
                     extra_args=["--connect-timeout-ms", "1000"])
    p.start()
    try:
        s = socket.create_connection((support.HOST, p.listen_port), timeout=10)
        t0 = time.monotonic()
        s.sendall(wire.PROTOCOL_HEADER)
        assert s.recv(100) == b""
        took = time.monotonic() - t0
        s.close()
        print("client closed after %.2f s" % took)
        assert 0.9 <= took < 3.0
        assert "not reached within 1000 ms" in p.log_text()
    finally:
        p.stop()
        for f in fillers:
            f.close()
        lst.close()


def test_metrics_parse_and_count(limited):
    """GET /metrics parses with python3-prometheus-client's parser and its
    values follow the traffic sent."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape():
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % limited.admin, timeout=5) as r:
            text = r.read().decode()
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    before = scrape()
    body = b"m" * 1000
    conn = support.connect(limited.listen_port, virtual_host=VHOST)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for _ in range(10):
        ch.basic_publish("", q, body)
    conn.close()
    time.sleep(0.3)
    after = scrape()

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0)

    assert delta("acemq_proxy_connections_accepted_total") == 1
    assert delta("acemq_proxy_connections_closed_total") == 1
    assert delta("acemq_proxy_bytes_total", direction="to_broker") >= 10 * len(body)
    assert delta("acemq_proxy_frames_total", direction="to_broker") >= 30
    assert ("acemq_proxy_connections_refused_total", (("reason", "max_channels"),)) in after
    assert after[("acemq_proxy_connections_open", ())] >= 0
