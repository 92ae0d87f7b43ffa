"""The real client address at the broker: a second RabbitMQ node of the
test's own with proxy_protocol = true (the setting applies to a whole
broker), the proxy sending it a PROXY v2 header, and the proxy reading v1
and v2 headers from a load balancer in front of it."""
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time

import pytest

import support
from amqp_wire import RawClient
from conftest import PROXY_BIN as PROXY

NODE = "acemq-pp@localhost"
PORT = int(os.environ.get("ACEMQ_PP_BROKER_PORT", "5682"))
DIST = int(os.environ.get("ACEMQ_PP_DIST_PORT", "25682"))


def ctl(*args, check=True):
    return support.rabbitmqctl("-n", NODE, *args, check=check)


@pytest.fixture(scope="module")
def pp_broker():
    """A RabbitMQ node that expects the PROXY protocol on every connection."""
    top = support.start_node(NODE, "listeners.tcp.default = %d\nproxy_protocol = true\n"
                             "loopback_users = none\n" % PORT, PORT, DIST)
    yield PORT
    support.stop_node(NODE, top)


def start_proxy(*extra):
    port = support.free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="acemq-pp-", suffix=".log", delete=False)
    proc = subprocess.Popen([PROXY, "--listen", "127.0.0.1:%d" % port, "--upstream",
                             "127.0.0.1:%d" % PORT, "--log-level", "debug"] + list(extra),
                            stderr=log)
    deadline = time.time() + 10
    while not support.port_accepts(port):
        assert proc.poll() is None and time.time() < deadline, open(log.name).read()
        time.sleep(0.05)
    return proc, port, log.name


def stop_proxy(proc, log):
    proc.terminate()
    assert proc.wait(20) == 0, open(log).read()[-3000:]
    text = open(log).read()
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]


def peers():
    out = ctl("list_connections", "peer_host", "peer_port").stdout
    return [tuple(line.split("\t")) for line in out.strip().splitlines() if "\t" in line]


def raw_from(source, port):
    """A raw AMQP client whose socket comes from the given local address."""
    c = RawClient.__new__(RawClient)
    RawClient.__init__(c, port)
    c.sock.close()
    c.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.sock.settimeout(10)
    c.sock.bind((source, 0))
    c.sock.connect(("127.0.0.1", port))
    return c


def test_broker_sees_the_clients_address(pp_broker):
    proc, port, log = start_proxy("--upstream-proxy-protocol", "1")
    try:
        c = raw_from("127.0.0.2", port)
        c.handshake()
        local_port = c.sock.getsockname()[1]
        assert support.wait_until(lambda: ("127.0.0.2", str(local_port)) in peers(), 10), peers()
        c.close_socket()
    finally:
        stop_proxy(proc, log)


def test_without_the_header_the_broker_refuses(pp_broker):
    """The check that the test can fail: without upstream_proxy_protocol the
    broker configured for it does not let the client in."""
    proc, port, log = start_proxy()
    try:
        c = RawClient(port)
        with pytest.raises(Exception):
            c.handshake()
        c.close_socket()
    finally:
        stop_proxy(proc, log)


def test_load_balancer_header_v1_and_v2_reaches_the_broker(pp_broker):
    proc, port, log = start_proxy("--proxy-protocol", "1", "--upstream-proxy-protocol", "1")
    try:
        a = RawClient(port)
        a.send(b"PROXY TCP4 203.0.113.9 127.0.0.1 40001 5673\r\n")
        a.handshake()
        b = RawClient(port)
        v2 = (b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x11]) + struct.pack(">H", 12)
              + socket.inet_aton("198.51.100.20") + socket.inet_aton("127.0.0.1")
              + struct.pack(">HH", 40002, 5673))
        # Cut in two, as a slow load balancer may send it.
        b.send(v2[:7])
        time.sleep(0.1)
        b.send(v2[7:])
        b.handshake()
        assert support.wait_until(
            lambda: {("203.0.113.9", "40001"), ("198.51.100.20", "40002")} <= set(peers()), 10), \
            peers()
        a.close_socket()
        b.close_socket()
        # A client without the header is refused, and counted.
        c = RawClient(port)
        c.send(b"AMQP\x00\x00\x09\x01")
        frames, closed = c.read_until_eof(5)
        assert closed and frames == []
        c.close_socket()
        assert "no PROXY protocol header" in open(log).read()
    finally:
        stop_proxy(proc, log)


def test_the_proxys_own_connections_carry_a_header_too(pp_broker):
    """The engine (scheduler, ladder) connects to a PROXY protocol broker."""
    rules = tempfile.mkdtemp(prefix="acemq-pp-rules-")
    data = tempfile.mkdtemp(prefix="acemq-pp-data-")
    with open(os.path.join(rules, "root.json"), "w") as f:
        f.write('{"vhost": "/", "schedule": {"match": [{"exchange": "x"}]}}')
    admin = support.free_port()
    proc, port, log = start_proxy("--upstream-proxy-protocol", "1", "--rules", rules,
                                  "--data-dir", data, "--admin", "127.0.0.1:%d" % admin,
                                  "--engine-user", "guest", "--engine-password", "guest")

    try:
        assert support.wait_until(lambda: support.engine_ladder_ready(admin), 15), \
            open(log).read()[-2000:]
    finally:
        stop_proxy(proc, log)
        shutil.rmtree(rules, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def test_the_greetings_probe_carries_a_header_too(pp_broker):
    """The proxy greets clients (a vhost has brokers of its own): the
    connection that asks the broker for its server properties carries a
    PROXY header naming its own ends (RabbitMQ 3.10 fails one that says
    LOCAL), so the very first client sees the broker's properties."""
    rules = tempfile.mkdtemp(prefix="acemq-pp-rules-")
    with open(os.path.join(rules, "v.json"), "w") as f:
        f.write('{"vhost": "acemq-pp-elsewhere", "upstream": ["127.0.0.1:%d"]}' % PORT)
    direct = RawClient(PORT)
    direct.send(b"PROXY TCP4 127.0.0.1 127.0.0.1 40003 %d\r\n" % PORT)
    direct.handshake()
    direct.close()
    proc, port, log = start_proxy("--upstream-proxy-protocol", "1", "--rules", rules)
    try:
        c = RawClient(port)
        c.handshake()
        c.close()
        assert c.start["server_properties"] == direct.start["server_properties"]
        assert "announced its server properties" in open(log).read()
    finally:
        stop_proxy(proc, log)
        shutil.rmtree(rules, ignore_errors=True)
