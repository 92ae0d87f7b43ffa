"""Names a client sends before it has authenticated: a PLAIN user name (and
in greeting mode a vhost name) reaches the proxy's log before the broker
has checked the password, and in greeting mode a vhost name joins the
per-vhost connection counts. None may forge a log line, reach the
operator's terminal as an escape sequence, or take memory that does not
come back."""
import json
import os
import re
import shutil
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import amqp_wire as w
import support
from conftest import PROXY_BIN, ProxyProcess

FORGED = "2024-01-01T00:00:00.000Z error c=999 forged"
# A newline and a timestamp (a line of its own), ANSI escapes (clear the
# screen, set the window title), C1 CSI, a line separator, a byte that is
# not UTF-8: within the 127 bytes the proxy keeps of a name.
HOSTILE = "x\n" + FORGED + "\r\n\x1b[2J\x1b]0;pwned\x07\u009b31m\u2028"
HOSTILE_BYTES = HOSTILE.encode("utf-8") + b"\xff"
# The sanitizers' allocator keeps freed memory in a quarantine of its own
SANITIZED = os.environ.get("ACEMQ_IT_SANITIZED") == "1"
LINE_START = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (error|warning|info|debug) ")


def start_ok(c, user, password=b"wrong"):
    c.send(w.PROTOCOL_HEADER)
    c.expect(w.CONNECTION_START, 0)
    c.send(w.method_frame(0, w.CONNECTION_START_OK,
                          w.table({"product": "acemq-it-hostile"}) + w.shortstr("PLAIN")
                          + w.longstr(b"\x00" + user + b"\x00" + password) + w.shortstr("en_US")))


def finish(c):
    """Read until the proxy closes, answering a connection.close."""
    try:
        while True:
            f = c.read_frame(10)
            if f.method == w.CONNECTION_CLOSE:
                c.send(w.method_frame(0, w.CONNECTION_CLOSE_OK))
    except (w.ConnectionClosedError, ConnectionResetError, BrokenPipeError):
        pass
    finally:
        c.close_socket()


def log_bytes(p):
    with open(p.log_path, "rb") as f:
        return f.read()


def assert_no_forgery(log, must_hold):
    assert b"\x1b" not in log and b"\x07" not in log and b"\r" not in log
    assert b"\xc2\x9b" not in log and "\u2028".encode() not in log and b"\xff" not in log
    for line in log.splitlines():
        assert LINE_START.match(line), "a line the proxy did not write: %r" % line
        assert not line.startswith(FORGED.encode()[:24])
    # The name was logged, escaped (so this test can fail).
    assert must_hold in log, log.decode("utf-8", "replace")[-3000:]


def wait_log(p, needle, timeout=10):
    deadline = time.monotonic() + timeout
    while needle not in log_bytes(p):
        assert time.monotonic() < deadline, "never logged %r:\n%s" % (needle, p.log_tail())
        time.sleep(0.05)


ESCAPED_USER = b"user=x\\x0a2024-01-01T00:00:00.000Z error c=999"


def test_user_name_cannot_forge_log_lines(rabbitmq):
    p = ProxyProcess("acemq-proxy-hostile", PROXY_BIN, support.BROKER_PORT, log_level="debug")
    p.start()
    try:
        c = w.RawClient(p.listen_port)
        start_ok(c, HOSTILE_BYTES)
        finish(c)  # the broker refuses the password
        wait_log(p, b" closed")
        assert_no_forgery(log_bytes(p), ESCAPED_USER)
        assert b"forged\\x0d\\x0a\\x1b[2J\\x1b]0;pwned\\x07\\xc2\\x9b31m\\xe2\\x80\\xa8\\xff" in log_bytes(p)
    finally:
        p.stop()


@pytest.fixture
def greeting_rules():
    """A rules file that gives a vhost brokers of its own: the proxy greets
    every client itself, and learns the vhost before any broker has seen
    the credentials."""
    d = tempfile.mkdtemp(prefix="acemq-hostile-")
    with open(os.path.join(d, "routed.json"), "w") as f:
        json.dump({"vhost": "acemq-routed", "upstream": ["127.0.0.1:%d" % support.BROKER_PORT]}, f)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_vhost_name_cannot_forge_log_lines_in_greeting_mode(rabbitmq, greeting_rules):
    p = ProxyProcess("acemq-proxy-hostile-greet", PROXY_BIN, support.BROKER_PORT,
                     log_level="debug", extra_args=["--rules", greeting_rules])
    p.start()
    try:
        c = w.RawClient(p.listen_port)
        start_ok(c, HOSTILE_BYTES)
        c.expect(w.CONNECTION_TUNE, 0)  # the proxy's own greeting
        c.send(w.method_frame(0, w.CONNECTION_TUNE_OK, struct.pack(">HIH", 2047, 131072, 0)))
        c.send(w.method_frame(0, w.CONNECTION_OPEN,
                              w.shortstr(HOSTILE_BYTES[:120]) + w.shortstr("") + b"\x00"))
        finish(c)  # the broker knows no such vhost, nor the password
        wait_log(p, b" closed")
        log = log_bytes(p)
        assert_no_forgery(log, b"vhost=x\\x0a2024-01-01T00:00:00.000Z error c=999")
        assert ESCAPED_USER in log
    finally:
        p.stop()


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def bogus_open(port, name):
    c = w.RawClient(port)
    try:
        start_ok(c, b"guest", b"guest")
        c.expect(w.CONNECTION_TUNE, 0)
        c.send(w.method_frame(0, w.CONNECTION_TUNE_OK, struct.pack(">HIH", 2047, 131072, 0)))
        c.send(w.method_frame(0, w.CONNECTION_OPEN, w.shortstr(name) + w.shortstr("") + b"\x00"))
        f = c.read_frame(10)
        assert f.method == w.CONNECTION_CLOSE, f
        c.send(w.method_frame(0, w.CONNECTION_CLOSE_OK))
    finally:
        c.close_socket()


def test_bogus_vhost_names_do_not_pile_up(rabbitmq, greeting_rules):
    """Greeting mode with max_connections_per_vhost: each made-up name is
    counted until its connection goes, then forgotten. The names go to a
    global broker address where nothing listens, so each open is refused at
    once (no broker is asked); 5000 names of 120 bytes took 0.9 MB that
    never came back before entries were freed."""
    dead = support.free_port()
    p = ProxyProcess("acemq-proxy-vhost-churn", PROXY_BIN, dead, log_level="error",
                     extra_args=["--rules", greeting_rules, "--max-connections-per-vhost", "5"])
    p.start()
    try:
        def batch(first, n):
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: bogus_open(p.listen_port, ("bogus-%06d-" % i).ljust(120, "x")),
                            range(first, first + n)))

        batch(0, 1000)  # the allocator's working set for a session
        before = rss_kb(p.proc.pid)
        batch(1000, 5000)
        after = rss_kb(p.proc.pid)
        print("proxy RSS %d kB, then %d kB after 5000 made-up vhost names" % (before, after))
        if not SANITIZED:  # there, LeakSanitizer at exit checks the entries went
            assert after - before < 400, \
                "RSS grew %d kB over 5000 made-up vhost names" % (after - before)
        assert p.alive()
        assert p.stop() == 0, p.log_tail()
    finally:
        p.stop()
