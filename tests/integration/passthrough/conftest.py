"""Session fixtures for the acemq-proxy integration tests.

Environment:
  ACEMQ_PROXY              proxy binary (default: <repo>/src/acemq-proxy)
  ACEMQ_PROXY_TEST         test-hook build (default: <repo>/src/acemq-proxy-test)
  ACEMQ_IT_PROXY_PORT      use an already running proxy on this port instead of
                           starting one (5672 points the "proxy" side at the
                           broker itself, for checking the tests)
  ACEMQ_IT_HOOK_PROXY_PORT same for the test-hook proxy
  ACEMQ_IT_BROKER_PORT     broker port (default 5672)
"""

import os
import resource
import signal
import subprocess
import tempfile
import time

import pytest

import support

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))

PROXY_BIN = os.environ.get("ACEMQ_PROXY") or os.path.join(REPO, "src", "acemq-proxy")
PROXY_TEST_BIN = os.environ.get("ACEMQ_PROXY_TEST") or os.path.join(REPO, "src", "acemq-proxy-test")
OVERRIDE_PORT = os.environ.get("ACEMQ_IT_PROXY_PORT")
OVERRIDE_HOOK_PORT = os.environ.get("ACEMQ_IT_HOOK_PROXY_PORT")

LOG_TAIL_LINES = 200

# hundreds of concurrent client connections need more descriptors than the
# usual soft limit of 1024; child processes (the proxies) inherit this
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _hard == resource.RLIM_INFINITY or _hard > _soft:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_hard if _hard != resource.RLIM_INFINITY else 65536, _hard))

# Every proxy process started in this session, for log reporting.
_ALL_PROXIES = []


class ProxyProcess(object):
    """One acemq-proxy subprocess with its stderr kept in a file."""

    def __init__(self, name, binary, upstream_port, listen_port=None, env=None, log_level="info",
                 extra_args=(), upstreams=None, preexec_fn=None):
        self.name = name
        # several broker addresses (HOST:PORT), tried in order; default the one port
        self.upstreams = upstreams or ["%s:%d" % (support.HOST, upstream_port)]
        self.binary = binary
        self.upstream_port = upstream_port
        self.listen_port = listen_port or support.free_port()
        # settings can also come from ACEMQ_PROXY_<NAME> variables: start from
        # an environment without any, so only the arguments given here apply
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ACEMQ_PROXY_")}
        self.env.update(env or {})
        self.log_level = log_level
        self.extra_args = list(extra_args)
        # run in the child before the exec (e.g. a lower RLIMIT_NOFILE)
        self.preexec_fn = preexec_fn
        self.proc = None
        self.log_path = None
        self._log = None

    @property
    def argv(self):
        argv = [self.binary, "--listen", "%s:%d" % (support.HOST, self.listen_port)]
        for u in self.upstreams:
            argv += ["--upstream", u]
        return argv + ["--log-level", self.log_level] + self.extra_args

    def start(self, wait=True, timeout=10.0):
        if not os.path.isfile(self.binary) or not os.access(self.binary, os.X_OK):
            pytest.fail("proxy binary %s does not exist or is not executable "
                        "(build it first, or set ACEMQ_PROXY / ACEMQ_PROXY_TEST)" % self.binary,
                        pytrace=False)
        fd, self.log_path = tempfile.mkstemp(prefix="acemq-it-%s-" % self.name, suffix=".log")
        os.close(fd)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log, env=self.env,
                                     preexec_fn=self.preexec_fn)
        if self not in _ALL_PROXIES:
            _ALL_PROXIES.append(self)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("%s exited with %s before accepting connections\n$ %s\n%s"
                            % (self.name, self.proc.returncode, " ".join(self.argv), self.log_tail()),
                            pytrace=False)
            if support.port_accepts(self.listen_port):
                return
            time.sleep(0.05)
        self.stop()
        pytest.fail("%s did not accept connections on port %d within %.0f s\n%s"
                    % (self.name, self.listen_port, timeout, self.log_tail()), pytrace=False)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum):
        self.proc.send_signal(signum)

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def log_size(self):
        try:
            return os.path.getsize(self.log_path)
        except (OSError, TypeError):
            return 0

    def log_text(self, offset=0):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def log_tail(self, offset=0, lines=LOG_TAIL_LINES):
        text = self.log_text(offset).splitlines()
        if len(text) > lines:
            text = ["... (%d earlier lines)" % (len(text) - lines)] + text[-lines:]
        return "\n".join(text)


class Endpoint(object):
    def __init__(self, name, port):
        self.name = name
        self.port = port

    def __repr__(self):
        return "%s:%d" % (self.name, self.port)


# --------------------------------------------------------------------------
# reporting


def pytest_report_header(config):
    lines = ["acemq proxy: %s" % ("port %s (not started here)" % OVERRIDE_PORT if OVERRIDE_PORT else PROXY_BIN),
             "acemq test-hook proxy: %s" % ("port %s (not started here)" % OVERRIDE_HOOK_PORT
                                           if OVERRIDE_HOOK_PORT else PROXY_TEST_BIN)]
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    marks = getattr(item, "_acemq_log_marks", {})
    for p in _ALL_PROXIES:
        offset = marks.get(id(p), 0)
        if p.log_size() <= offset:
            continue
        state = "running" if p.alive() else "exited with %s" % (p.proc.returncode if p.proc else None)
        rep.sections.append(("%s stderr (%s, port %d -> %d)" % (p.name, state, p.listen_port, p.upstream_port),
                             p.log_tail(offset)))


# --------------------------------------------------------------------------
# session fixtures


@pytest.fixture(scope="session", autouse=True)
def rabbitmq():
    support.ensure_rabbitmq(60)
    # a previous aborted run may have left the memory alarm on
    support.rabbitmqctl("set_vm_memory_high_watermark", "0.4", check=False)
    return support.BROKER_PORT


def _session_proxy(name, binary, override, env=None):
    if override:
        return None, int(override)
    p = ProxyProcess(name, binary, support.BROKER_PORT, env=env)
    p.start()
    return p, p.listen_port


@pytest.fixture(scope="session")
def _proxy_proc(rabbitmq):
    p, port = _session_proxy("acemq-proxy", PROXY_BIN, OVERRIDE_PORT)
    yield p, port
    if p is not None:
        p.stop()


@pytest.fixture(scope="session")
def _hook_proxy_proc(rabbitmq):
    p, port = _session_proxy("acemq-proxy-test", PROXY_TEST_BIN, OVERRIDE_HOOK_PORT,
                             env={"ACEMQ_PROXY_TEST_HOOK": "1"})
    yield p, port
    if p is not None:
        p.stop()


def _check_alive(p):
    """Fail the current test if a session proxy died; restart it for the rest."""
    if p is None or p.alive():
        return None
    msg = "%s died (exit %s) during this test\n%s" % (p.name, p.proc.returncode, p.log_tail())
    p.stop()
    p.start()
    return msg


@pytest.fixture(autouse=True)
def _proxy_watch(request):
    procs = []
    for fx in ("_proxy_proc", "_hook_proxy_proc"):
        if fx in request.fixturenames:
            procs.append(request.getfixturevalue(fx)[0])
    request.node._acemq_log_marks = {id(p): p.log_size() for p in _ALL_PROXIES}
    yield
    problems = [m for m in (_check_alive(p) for p in procs) if m]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def direct_port(rabbitmq):
    return support.BROKER_PORT


@pytest.fixture(scope="session")
def proxy_port(_proxy_proc):
    return _proxy_proc[1]


@pytest.fixture(scope="session")
def hook_port(_hook_proxy_proc):
    return _hook_proxy_proc[1]


@pytest.fixture(scope="session")
def proxy_is_broker(proxy_port):
    """True when the "proxy" side is really the broker (ACEMQ_IT_PROXY_PORT=5672)."""
    return proxy_port == support.BROKER_PORT


@pytest.fixture(scope="session")
def proxy_process(_proxy_proc):
    """The session ProxyProcess, or None when an external port is used."""
    return _proxy_proc[0]


@pytest.fixture(params=["direct", "proxy"])
def endpoint(request, direct_port, proxy_port):
    return Endpoint(request.param, direct_port if request.param == "direct" else proxy_port)


@pytest.fixture
def endpoints(direct_port, proxy_port):
    """Both sides, for tests that run the same scenario twice and compare."""
    return [Endpoint("direct", direct_port), Endpoint("proxy", proxy_port)]


# --------------------------------------------------------------------------
# per-test helpers


@pytest.fixture
def spawn_proxy(rabbitmq):
    """Factory for extra proxy processes owned by one test."""
    started = []

    def spawn(upstream_port=None, binary=None, env=None, name="acemq-proxy-extra", wait=True, extra_args=()):
        binary = binary or PROXY_BIN
        if OVERRIDE_PORT and not os.path.isfile(binary):
            pytest.skip("needs the proxy binary %s (ACEMQ_IT_PROXY_PORT override in effect)" % binary)
        p = ProxyProcess(name, binary, upstream_port or support.BROKER_PORT, env=env, extra_args=extra_args)
        started.append(p)
        p.start(wait=wait)
        return p

    yield spawn
    for p in started:
        p.stop()


@pytest.fixture
def new_queue(direct_port):
    """Declare a uniquely named queue on the broker; deleted after the test."""
    names = []

    def declare(prefix="acemq-it", arguments=None, durable=False):
        name = support.unique_name(prefix)
        conn = support.connect(direct_port)
        try:
            conn.channel().queue_declare(name, durable=durable, arguments=arguments)
        finally:
            support.safe_close(conn)
        names.append(name)
        return name

    yield declare
    if not names:
        return
    try:
        conn = support.connect(direct_port)
    except Exception:
        return
    try:
        for name in names:
            try:
                ch = conn.channel()
                ch.queue_delete(name)
            except Exception:
                pass
    finally:
        support.safe_close(conn)


@pytest.fixture
def connections():
    """Factory for pika BlockingConnections that are closed after the test."""
    opened = []

    def open_(port, **kw):
        conn = support.connect(port, **kw)
        opened.append(conn)
        return conn

    yield open_
    for conn in opened:
        support.safe_close(conn)
