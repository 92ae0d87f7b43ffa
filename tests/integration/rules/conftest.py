"""A proxy started with a rules directory and an admin endpoint."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
import support  # noqa: E402
PROXY = os.environ.get("ACEMQ_PROXY", os.path.join(HERE, "..", "..", "..", "build", "src", "acemq-proxy"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    def __init__(self, rules):
        self.rules = rules
        self.port = free_port()
        self.admin = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [PROXY, "--listen", f"127.0.0.1:{self.port}", "--rules", rules,
             "--admin", f"127.0.0.1:{self.admin}", "--log-level", "info"],
            stderr=self.log)
        deadline = time.time() + 10
        while True:
            try:
                if support.port_accepts(self.port):
                    break
                raise OSError("not listening yet")
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise AssertionError("proxy did not start:\n" + self.stderr())
                time.sleep(0.05)

    def stderr(self):
        with open(self.log.name) as f:
            return f.read()

    def stats(self):
        import json
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/stats", timeout=5) as r:
            return json.loads(r.read())

    def reload_http(self):
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin}/reload", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def hup(self):
        self.proc.send_signal(signal.SIGHUP)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.unlink(self.log.name)


def write_rules(d, name, text):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(text)
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))


@pytest.fixture
def rules_dir():
    d = tempfile.mkdtemp(prefix="acemq-rules-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def reply_proxy(rules_dir):
    write_rules(rules_dir, "default.json", '{"vhost": "/", "reply_to": {"enabled": true}}')
    p = Proxy(rules_dir)
    yield p
    p.stop()
