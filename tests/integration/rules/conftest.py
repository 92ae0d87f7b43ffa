"""A proxy started with a rules directory and an admin endpoint."""
import os
import shutil
import signal
import tempfile
import urllib.request

import pytest

import rulesproxy  # noqa: E402
from rulesproxy import PROXY  # noqa: E402,F401 (the suite's tests import it from here)


class Proxy(rulesproxy.Proxy):
    """rulesproxy's proxy with an admin endpoint and a data dir of its own."""

    def __init__(self, rules):
        self.admin = rulesproxy.free_port()
        self.top = tempfile.mkdtemp(prefix="acemq-rules-data-")
        super().__init__(rules, os.path.join(self.top, "data"),
                         ["--admin", f"127.0.0.1:{self.admin}"])

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
        super().stop()
        os.unlink(self.log.name)
        shutil.rmtree(self.top, ignore_errors=True)


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
