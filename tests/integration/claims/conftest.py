"""Proxies with claim_check rules, their data directories and vhosts."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pika
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
import support  # noqa: E402

PROXY = os.environ.get("ACEMQ_PROXY", os.path.join(HERE, "..", "..", "..", "build", "src", "acemq-proxy"))
SANITIZED = os.environ.get("ACEMQ_IT_SANITIZED") == "1"

VHOST_PASS = "acemq-cc-pass"
VHOST_FS = "acemq-cc-fs"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    """acemq-proxy on a free port with a rules directory and a data dir."""

    def __init__(self, rules, data, extra=()):
        self.rules, self.data, self.extra = rules, data, list(extra)
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="acemq-cc-", suffix=".log", delete=False)
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [PROXY, "--listen", "127.0.0.1:%d" % self.port, "--upstream", "127.0.0.1:5672",
             "--rules", self.rules, "--data-dir", self.data, "--log-level", "info"] + self.extra,
            stderr=self.log)
        deadline = time.time() + 10
        while True:
            try:
                if support.port_accepts(self.port):
                    return
                raise OSError("not listening yet")
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise AssertionError("proxy did not start:\n" + self.stderr())
                time.sleep(0.05)

    def stderr(self):
        with open(self.log.name) as f:
            return f.read()

    def status(self, field):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.returncode

    def connect(self, vhost="/"):
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.port, vhost, socket_timeout=30, stack_timeout=60,
            blocked_connection_timeout=120))


def direct(vhost="/"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", 5672, vhost, socket_timeout=30, stack_timeout=60))


def write_rules(d, fs_dir):
    rules = {
        "root.json": '{"vhost": "/", "claim_check": {"match": [{"exchange": ""},'
                     ' {"exchange": "amq.topic", "routing_key": "document.#"}]}}',
        "pass.json": '{"vhost": "%s", "claim_check": {"match": [{"exchange": "*"}], '
                     '"on_missing": "pass"}}' % VHOST_PASS,
        "fs.json": '{"vhost": "%s", "claim_check": {"match": [{"exchange": ""}], '
                   '"store": {"type": "filesystem", "path": "%s"}}}' % (VHOST_FS, fs_dir),
    }
    for name, text in rules.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


@pytest.fixture(scope="session")
def vhosts():
    support.ensure_rabbitmq(60)
    for v in (VHOST_PASS, VHOST_FS):
        support.rabbitmqctl("add_vhost", v, check=False)
        support.rabbitmqctl("set_permissions", "-p", v, "guest", ".*", ".*", ".*")
    return True


@pytest.fixture(scope="session")
def dirs():
    top = tempfile.mkdtemp(prefix="acemq-cc-")
    d = {"rules": os.path.join(top, "rules"), "data": os.path.join(top, "data"),
         "fs": os.path.join(top, "fs"), "top": top}
    for k in ("rules", "data", "fs"):
        os.makedirs(d[k])
    write_rules(d["rules"], d["fs"])
    yield d
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="session")
def proxy(vhosts, dirs):
    p = Proxy(dirs["rules"], dirs["data"])
    yield p
    rc = p.stop()
    text = p.stderr()
    assert rc == 0, "proxy exited with %s:\n%s" % (rc, text[-3000:])
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]
