"""Proxies with claim_check rules, their data directories and vhosts."""
import os
import shutil
import tempfile

import pytest

import support
# The suite's tests import the runner from here.
from rulesproxy import PROXY, SANITIZED, Proxy, direct, free_port  # noqa: F401

VHOST_PASS = "acemq-cc-pass"
VHOST_FS = "acemq-cc-fs"


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
