"""amqplib (from npm) refreshing its secret with connection.update-secret,
directly and through the proxy: the same outcome (the broker answers it;
the proxy passes a method it has no reason to read)."""

import json
import os
import shutil
import subprocess

import pytest

NODE_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node"))


def run_node(port):
    node = shutil.which("node")
    if node is None or not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "amqplib")):
        pytest.fail("node and amqplib are needed: docker/setup-debian installs them "
                    "(npm ci in tests/integration/node)", pytrace=False)
    out = subprocess.run([node, os.path.join(NODE_DIR, "update_secret.js"), str(port)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_update_secret_same_outcome(direct_port, proxy_port):
    direct = run_node(direct_port)
    proxy = run_node(proxy_port)
    print("direct:", direct, "proxy:", proxy)
    assert direct == {"callback": "ok", "promise": "after refresh"}
    assert proxy == direct
