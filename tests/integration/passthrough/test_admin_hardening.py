"""What an unauthenticated or careless peer can make the proxy hold, and
what it cannot take from the AMQP clients: the admin endpoint reads no body
before the token is checked, bounds a request's head, closes silent and
slow connections after admin_timeout_s and more than admin_max_connections
at once; a proxy out of file descriptors closes new clients at once (a
spare descriptor) instead of leaving them hanging; max_connections holds
exactly under a burst; the bearer scheme is case-insensitive and a token of
another length is refused."""

import http.client
import json
import os
import resource
import selectors
import socket
import threading
import time
import urllib.error
import urllib.request

import amqp_wire as wire
import support
from conftest import PROXY_BIN, ProxyProcess

MIB = 1 << 20


def rss(pid):
    """Resident set size of a process, in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


class PeakRss(object):
    """Samples a process's RSS in a thread until stopped; keeps the largest."""

    def __init__(self, pid):
        self.pid = pid
        self.peak = rss(pid)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss(self.pid))
            except (OSError, AssertionError):
                return
            time.sleep(0.01)

    def stop(self):
        self._stop.set()
        self._t.join()
        return self.peak


def get(port, path, token=None, scheme="Bearer"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path))
    if token is not None:
        req.add_header("Authorization", "%s %s" % (scheme, token))
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def admin_proxy(name, *args, token=None, **kw):
    admin = support.free_port()
    extra = ["--admin", "127.0.0.1:%d" % admin] + list(args)
    if token:
        extra += ["--admin-token", token]
    p = ProxyProcess(name, PROXY_BIN, support.BROKER_PORT, extra_args=extra, **kw)
    p.start()
    wait_admin(admin)
    p.admin = admin
    return p


def small_quarantine():
    """The environment for a proxy whose RSS a test bounds: under ASan, freed
    memory waits in a quarantine (256 MiB by default) before it is reused,
    which would count every buffer the proxy read and dropped."""
    opts = [o for o in os.environ.get("ASAN_OPTIONS", "").split(":") if o]
    return {"ASAN_OPTIONS": ":".join(opts + ["quarantine_size_mb=4"])}


def wait_admin(port, timeout=10):
    assert support.wait_until(lambda: support.port_accepts(port), timeout), \
        "admin port %d never accepted" % port


def send_and_read(port, head, filler, total, deadline_s=30):
    """Send head, then total bytes of filler in 1 MiB writes; stop at the
    first error. Returns (bytes sent, what came back, how it ended)."""
    s = socket.create_connection((support.HOST, port), timeout=10)
    sent, ended = 0, "sent all"
    chunk = filler * (MIB // len(filler))
    deadline = time.monotonic() + deadline_s
    try:
        s.sendall(head)
        while sent < total:
            if time.monotonic() > deadline:
                ended = "still sending at the deadline"
                break
            s.sendall(chunk)
            sent += len(chunk)
    except socket.timeout:
        ended = "the proxy stopped reading"
    except OSError as e:
        ended = "closed by the proxy (%s)" % e.__class__.__name__
    got = b""
    s.settimeout(5)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except socket.timeout:
        ended += ", no end of reply within 5 s"
    except OSError:
        pass
    s.close()
    return sent, got, ended


def test_unauthenticated_body_is_never_read(rabbitmq):
    """64 MiB posted without a token under a Content-Length of a terabyte:
    the answer is a 401 (or a close) and the proxy's memory stays put."""
    token = "t-" + os.urandom(8).hex()
    p = admin_proxy("acemq-proxy-bigbody", token=token, env=small_quarantine())
    try:
        assert get(p.admin, "/healthz")[0] == 200
        before = rss(p.proc.pid)
        peak = PeakRss(p.proc.pid)
        sent, got, ended = send_and_read(
            p.admin, b"POST /reload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n",
            b"x", 64 * MIB)
        grown = peak.stop() - before
        print("sent %d MiB (%s); RSS grew by %.1f MiB; reply %r"
              % (sent // MIB, ended, grown / MIB, got[:40]))
        assert got.startswith(b"HTTP/1.1 401 ") or "closed by the proxy" in ended, (ended, got)
        assert "stopped reading" not in ended and "deadline" not in ended, ended
        assert grown < 16 * MIB, "RSS grew by %.1f MiB" % (grown / MIB)
        assert p.alive()
        # A body announced and not sent: the 401 comes at once all the same.
        s = socket.create_connection((support.HOST, p.admin), timeout=5)
        s.sendall(b"POST /reload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 401 ")
        s.close()
        # With the token, a body a route does not take is refused unread.
        s = socket.create_connection((support.HOST, p.admin), timeout=5)
        s.sendall(("POST /reload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                   "Content-Length: 100000\r\n\r\n" % token).encode())
        assert s.recv(100).startswith(b"HTTP/1.1 413 ")
        s.close()
        assert get(p.admin, "/rules", token)[0] == 200
    finally:
        p.stop()


def test_endless_header_line_is_cut_off(rabbitmq):
    """A header line that never ends: answered 431 and closed once the head
    passes its bound; the proxy's memory stays put."""
    p = admin_proxy("acemq-proxy-endless-header", env=small_quarantine())
    try:
        assert get(p.admin, "/healthz")[0] == 200
        before = rss(p.proc.pid)
        peak = PeakRss(p.proc.pid)
        sent, got, ended = send_and_read(
            p.admin, b"GET /stats HTTP/1.1\r\nHost: x\r\nX-Endless: ", b"a", 16 * MIB)
        grown = peak.stop() - before
        print("sent %d MiB (%s); RSS grew by %.1f MiB; reply %r"
              % (sent // MIB, ended, grown / MIB, got[:40]))
        assert got.startswith(b"HTTP/1.1 431 ") or "closed by the proxy" in ended, (ended, got)
        assert "stopped reading" not in ended and "deadline" not in ended, ended
        assert grown < 8 * MIB, "RSS grew by %.1f MiB" % (grown / MIB)
        assert get(p.admin, "/healthz")[0] == 200
    finally:
        p.stop()


def wait_eof(socks, timeout):
    """Wait until the proxy has closed each socket; returns those still open."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    open_ = set(socks)
    deadline = time.monotonic() + timeout
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(0.2):
            try:
                data = key.fileobj.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                open_.discard(key.fileobj)
    sel.close()
    return open_


def test_silent_and_slow_admin_sockets_are_closed(rabbitmq):
    """100 sockets that connect to the admin endpoint and say nothing, and
    10 that send a request a byte at a time, are closed after
    admin_timeout_s (the slow ones although bytes keep coming)."""
    p = admin_proxy("acemq-proxy-admin-idle", "--admin-timeout-s", "1",
                    "--admin-max-connections", "200")
    silent = [socket.create_connection((support.HOST, p.admin), timeout=5) for _ in range(100)]
    slow = [socket.create_connection((support.HOST, p.admin), timeout=5) for _ in range(10)]
    stop = threading.Event()

    def trickle():
        text = b"GET /stats HTTP/1.1\r\nX-Slow: " + b"a" * 1000
        for i in range(len(text)):
            for s in slow:
                try:
                    s.send(text[i:i + 1])
                except OSError:
                    pass
            if stop.wait(0.2):
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        left = wait_eof(silent, 15)
        assert not left, "%d of 100 silent admin sockets still open" % len(left)
        left = wait_eof(slow, 15)
        assert not left, "%d of 10 slow admin sockets still open" % len(left)
        assert get(p.admin, "/healthz")[0] == 200
    finally:
        stop.set()
        t.join()
        for s in silent + slow:
            s.close()
        p.stop()


def still_open(s):
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_admin_connection_cap_leaves_amqp_alone(rabbitmq):
    """admin_max_connections sockets held open: more admin connections are
    closed at once (logged once), AMQP clients are served all the while,
    and the endpoint answers again when one goes."""
    p = admin_proxy("acemq-proxy-admin-cap", "--admin-timeout-s", "60",
                    "--admin-max-connections", "8")
    held = []
    try:
        # Eight held open (a socket that met the cap while the start's
        # readiness probe was still counted is replaced).
        for _ in range(3):
            while len(held) < 8:
                held.append(socket.create_connection((support.HOST, p.admin), timeout=5))
            time.sleep(0.5)
            held = [s for s in held if still_open(s)]
        assert len(held) == 8
        mark = p.log_size()
        excess = [socket.create_connection((support.HOST, p.admin), timeout=5)
                  for _ in range(20)]
        left = wait_eof(excess, 5)
        assert not left, "%d excess admin sockets were not closed at once" % len(left)
        for s in excess:
            s.close()
        assert all(still_open(s) for s in held)
        conn = support.connect(p.listen_port)
        ch = conn.channel()
        ch.queue_declare("", exclusive=True)
        conn.close()
        # One episode, logged once.
        assert p.log_text(mark).count("connections open, the most allowed") == 1, p.log_tail()
        held.pop().close()
        assert support.wait_until(lambda: get(p.admin, "/healthz")[0] == 200, 5)
    finally:
        for s in held:
            s.close()
        p.stop()


def closed_at_once(s, timeout=5):
    """Whether the proxy closes a socket (EOF or reset) within timeout."""
    s.settimeout(timeout)
    try:
        return s.recv(7) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def test_out_of_descriptors_closes_new_clients_at_once(rabbitmq):
    """A proxy at its file limit: new clients are accepted and closed at
    once with the spare descriptor (not left hanging in the backlog while
    the loop spins), "out of file descriptors" is logged once, and the
    proxy serves again once descriptors are free."""
    limit = 64

    def low_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    p = admin_proxy("acemq-proxy-nofile", "--workers", "1", "--admin-timeout-s", "60",
                    preexec_fn=low_nofile)
    held, hung = [], []
    try:
        # AMQP clients until one is turned away: each one served holds two
        # descriptors (the client's and the broker's).
        for _ in range(limit):
            s = socket.create_connection((support.HOST, p.listen_port), timeout=5)
            s.settimeout(3)
            try:
                s.sendall(wire.PROTOCOL_HEADER)
                data = s.recv(7)
            except socket.timeout:
                hung.append(s)
                break
            except OSError:
                data = b""
            if not data:
                s.close()
                break
            held.append(s)
        assert not hung, "a client was left hanging\n" + p.log_tail()
        # The last free descriptor, if one is left, to an idle admin socket.
        for _ in range(3):
            s = socket.create_connection((support.HOST, p.admin), timeout=5)
            if closed_at_once(s, 1):
                s.close()
                break
            held.append(s)
        print("%d sockets held" % len(held))
        # Out of descriptors: each new client is closed at once.
        for i in range(10):
            s = socket.create_connection((support.HOST, p.listen_port), timeout=5)
            try:
                s.sendall(wire.PROTOCOL_HEADER)
            except OSError:
                pass
            assert closed_at_once(s), "client %d was left hanging\n%s" % (i, p.log_tail())
            s.close()
        s = socket.create_connection((support.HOST, p.admin), timeout=5)
        assert closed_at_once(s)
        s.close()
        log = p.log_text()
        assert log.count("out of file descriptors") == 1, p.log_tail()
        assert log.count("accept failed") == 0, p.log_tail()
        for s in held:
            s.close()
        held = []
        assert support.wait_until(lambda: _amqp_works(p.listen_port), 15)
        code, text = get(p.admin, "/stats")
        assert code == 200 and json.loads(text)["refused_no_descriptors"] >= 10, text
        assert "file descriptors are free again" in p.log_text()
    finally:
        for s in held + hung:
            s.close()
        p.stop()


def _amqp_works(port):
    try:
        c = support.connect(port, socket_timeout=3, stack_timeout=5)
    except Exception:
        return False
    support.safe_close(c)
    return True


def burst(port, n, timeout=15):
    """n clients connect at once and send the protocol header; returns
    (sockets that got connection.start, how many were closed without)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((support.HOST, port))
        socks.append(s)
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_WRITE)
    admitted, closed, pending = [], 0, set(socks)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for key, ev in sel.select(0.2):
            s = key.fileobj
            if ev & selectors.EVENT_WRITE:
                try:
                    s.send(wire.PROTOCOL_HEADER)
                    sel.modify(s, selectors.EVENT_READ)
                except BlockingIOError:
                    pass
                except OSError:
                    sel.unregister(s)
                    pending.discard(s)
                    closed += 1
                    s.close()
                continue
            try:
                data = s.recv(7)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            sel.unregister(s)
            pending.discard(s)
            if data:
                admitted.append(s)
            else:
                closed += 1
                s.close()
    sel.close()
    for s in pending:
        s.close()
    assert not pending, "%d clients heard nothing within %d s" % (len(pending), timeout)
    return admitted, closed


def test_max_connections_is_exact_under_a_burst(rabbitmq):
    """200 clients at once against max_connections 50, three times: exactly
    50 are served, the other 150 are closed before a word of AMQP."""
    p = admin_proxy("acemq-proxy-burst", "--max-connections", "50", "--workers", "2")
    try:
        for round_ in range(3):
            # None open or counted before (the start's readiness probe,
            # the last round's clients, are gone: a socket is counted
            # from its accept, before it is a session).
            assert support.wait_until(
                lambda: json.loads(get(p.admin, "/stats")[1])["connections_counted"] == 0, 15)
            admitted, closed = burst(p.listen_port, 200)
            code, text = get(p.admin, "/stats")
            open_now = json.loads(text)["connections_open"]
            print("round %d: %d admitted, %d closed, %d open" % (round_, len(admitted), closed,
                                                                 open_now))
            for s in admitted:
                s.close()
            assert len(admitted) <= 50 and open_now <= 50, (len(admitted), open_now)
            assert len(admitted) == 50 and closed == 150, (len(admitted), closed)
        # And the count comes back: a client is served after the bursts.
        assert support.wait_until(
            lambda: json.loads(get(p.admin, "/stats")[1])["connections_open"] == 0, 15)
        conn = support.connect(p.listen_port)
        conn.close()
    finally:
        p.stop()


def test_bearer_scheme_any_case_and_token_length(rabbitmq):
    """The scheme's name is case-insensitive (RFC 7235); a token that is a
    prefix of the right one, or longer, or empty, is refused."""
    token = "Tok-" + os.urandom(8).hex()
    p = admin_proxy("acemq-proxy-bearer", token=token)
    try:
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            assert get(p.admin, "/stats", token, scheme)[0] == 200, scheme
        for wrong in (token[:-1], token + "x", token[:1], "", token.lower(), " " + token + "x"):
            assert get(p.admin, "/stats", wrong)[0] == 401, wrong
        assert get(p.admin, "/stats", token, "Basic")[0] == 401
        assert get(p.admin, "/stats", token, "Bearerx")[0] == 401
        # Keep-alive: several requests on one connection.
        c = http.client.HTTPConnection(support.HOST, p.admin, timeout=5)
        for path in ("/stats", "/rules", "/metrics", "/healthz"):
            c.request("GET", path, headers={"Authorization": "bearer " + token})
            r = c.getresponse()
            assert r.status == 200, path
            r.read()
        c.close()
    finally:
        p.stop()
