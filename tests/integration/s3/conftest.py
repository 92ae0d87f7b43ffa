"""s3rver (npm) on a loopback port with a temporary directory, the verifying
front before it, and proxies whose claim_check rules use an S3 store."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import pika
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
import support  # noqa: E402
from front import Front  # noqa: E402
# The suite's tests import these from here.
from s3rver import ACCESS, BUCKET, S3RVER, SECRET, S3rver  # noqa: E402,F401

PROXY = os.environ.get("ACEMQ_PROXY",
                       os.path.join(HERE, "..", "..", "..", "build", "src", "acemq-proxy"))
SANITIZED = os.environ.get("ACEMQ_IT_SANITIZED") == "1"


class Proxy:
    """acemq-proxy with an S3 store: settings in a config file, rules in a
    directory of their own, an admin port."""

    def __init__(self, endpoint, rules, settings=None, args=()):
        self.top = tempfile.mkdtemp(prefix="acemq-s3p-")
        self.rules = os.path.join(self.top, "rules")
        os.makedirs(self.rules)
        os.makedirs(os.path.join(self.top, "data"))
        for name, rule in rules.items():
            with open(os.path.join(self.rules, name + ".json"), "w") as f:
                json.dump(rule, f)
        self.port, self.admin = support.free_port(), support.free_port()
        conf = {"s3_endpoint": endpoint, "s3_access_key": ACCESS, "s3_secret_key": SECRET,
                "s3_region": "us-east-1", "s3_timeout_ms": "15000",
                "listen": "127.0.0.1:%d" % self.port, "upstream": "127.0.0.1:5672",
                "rules": self.rules, "data_dir": os.path.join(self.top, "data"),
                "admin": "127.0.0.1:%d" % self.admin, "log_level": "info"}
        conf.update(settings or {})
        self.conf = os.path.join(self.top, "proxy.conf")
        with open(self.conf, "w") as f:
            for k, v in conf.items():
                f.write("%s = %s\n" % (k, v))
        self.args = list(args)
        self.log = open(os.path.join(self.top, "proxy.log"), "w+")
        self.start()

    def start(self):
        self.proc = subprocess.Popen([PROXY, "-c", self.conf] + self.args, stderr=self.log)
        if not support.wait_until(lambda: support.port_accepts(self.port)
                                  or self.proc.poll() is not None, 10) \
                or self.proc.poll() is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            raise AssertionError("proxy did not start:\n" + self.stderr())

    def stderr(self):
        with open(self.log.name) as f:
            return f.read()

    def status(self, field):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def connect(self, vhost="/"):
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.port, vhost, socket_timeout=30, stack_timeout=60,
            blocked_connection_timeout=120))

    def get(self, path):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.admin, path),
                                        timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def get_text(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.admin, path),
                                    timeout=30) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        text = self.stderr()
        print("---- proxy %d log (tail) ----\n%s" % (self.port, text[-4000:]))
        rc = self.proc.returncode
        shutil.rmtree(self.top, ignore_errors=True)
        assert rc == 0, "proxy exited with %s:\n%s" % (rc, text[-3000:])
        assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]
        return text


def s3_rule(prefix, threshold=65536, **extra):
    rule = {"vhost": "/", "claim_check": {
        "match": [{"exchange": ""}], "threshold": threshold,
        "store": {"type": "s3", "bucket": BUCKET, "prefix": prefix}}}
    rule["claim_check"].update(extra)
    return {"root": rule}


@pytest.fixture(scope="session")
def broker():
    support.ensure_rabbitmq(60)
    return True


@pytest.fixture(scope="session")
def s3():
    if not os.path.exists(S3RVER):
        pytest.fail("s3rver is not installed: run docker/setup-debian "
                    "(npm ci in tests/integration/s3/node)")
    s = S3rver()
    yield s
    s.close()


@pytest.fixture(scope="session")
def front(s3):
    f = Front(s3.port, s3.dir, ACCESS, SECRET)
    yield f
    f.stop()


@pytest.fixture
def proxies():
    """Proxies a test starts: stopped (cleanly, or the test fails) after it."""
    started = []

    def make(*a, **kw):
        p = Proxy(*a, **kw)
        started.append(p)
        return p
    yield make
    for p in started:
        p.stop()
