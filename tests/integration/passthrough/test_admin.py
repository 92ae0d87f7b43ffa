"""The admin endpoint: /readyz follows the brokers, /rules shows the rules
in force, a token guards everything but the health checks, a token is
never shown, and an endpoint off loopback without a token does not start."""

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import support
from conftest import PROXY_BIN, ProxyProcess


def get(port, path, token=None):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path))
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_readyz_follows_the_brokers(rabbitmq):
    admin = support.free_port()
    good = ProxyProcess("acemq-proxy-ready", PROXY_BIN, support.BROKER_PORT,
                        extra_args=["--admin", "127.0.0.1:%d" % admin])
    good.start()
    try:
        assert get(admin, "/readyz") == (200, "ready\n")
        assert get(admin, "/healthz")[0] == 200
    finally:
        good.stop()
    admin = support.free_port()
    bad = ProxyProcess("acemq-proxy-unready", PROXY_BIN, support.free_port(),
                       extra_args=["--admin", "127.0.0.1:%d" % admin])
    bad.start()
    try:
        s = socket.create_connection((support.HOST, bad.listen_port), timeout=5)
        s.sendall(b"AMQP\x00\x00\x09\x01")
        s.recv(10)
        s.close()
        time.sleep(0.2)
        assert get(admin, "/readyz")[0] == 503
        assert get(admin, "/healthz")[0] == 200  # alive all the same
    finally:
        bad.stop()


def test_rules_view_and_token(rabbitmq):
    rules = tempfile.mkdtemp(prefix="acemq-admin-rules-")
    with open(os.path.join(rules, "docs.json"), "w") as f:
        f.write('{"vhost": "docs", "reply_to": {"enabled": true}, "claim_check": '
                '{"match": [{"exchange": "documents"}], "threshold": 1000, "on_missing": "pass"}}')
    admin = support.free_port()
    token = "s3cret-" + os.urandom(6).hex()
    p = ProxyProcess("acemq-proxy-admin", PROXY_BIN, support.BROKER_PORT,
                     extra_args=["--admin", "127.0.0.1:%d" % admin, "--admin-token", token,
                                 "--rules", rules, "--data-dir", os.path.join(rules, "data")])
    p.start()
    try:
        for path in ("/stats", "/metrics", "/rules", "/config", "/claims/docs/" + "0" * 32):
            assert get(admin, path)[0] == 401, path
            assert get(admin, path, "wrong")[0] == 401, path
        assert get(admin, "/healthz")[0] == 200
        code, text = get(admin, "/rules", token)
        assert code == 200
        view = json.loads(text)
        assert [v["vhost"] for v in view["vhosts"]] == ["docs"]
        docs = view["vhosts"][0]
        assert docs["reply_to"] is True
        assert docs["claim_check"] == {"threshold": 1000, "store": "lmdb",
                                       "retention_s": 2592000, "on_missing": "pass"}
        code, text = get(admin, "/config", token)
        assert code == 200 and token not in text
        assert "admin_token = (set, not shown)" in text
        assert token not in p.log_text()
    finally:
        p.stop()


def test_admin_off_loopback_needs_a_token(rabbitmq):
    port = support.free_port()
    out = subprocess.run([PROXY_BIN, "--listen", "127.0.0.1:%d" % support.free_port(),
                          "--admin", "0.0.0.0:%d" % port], capture_output=True, text=True,
                         timeout=20)
    assert out.returncode != 0
    assert "no admin_token is set" in out.stderr


def test_connections_lists_every_client(rabbitmq):
    """GET /connections: one row per client with its address, vhost, user,
    channels, bytes each way and age (pgbouncer's SHOW CLIENTS)."""
    import pika

    admin = support.free_port()
    p = ProxyProcess("acemq-proxy-conns", PROXY_BIN, support.BROKER_PORT,
                     extra_args=["--admin", "127.0.0.1:%d" % admin, "--workers", "2"])
    p.start()
    conns = []
    try:
        for _ in range(3):
            c = pika.BlockingConnection(pika.ConnectionParameters(support.HOST, p.listen_port))
            conns.append(c)
        ch = conns[0].channel()
        conns[0].channel()
        q = support.unique_name("acemq-conns")
        ch.queue_declare(q, auto_delete=True)
        ch.basic_publish("", q, b"x" * 10000)
        silent = socket.create_connection((support.HOST, p.listen_port), timeout=5)
        time.sleep(0.3)
        code, text = get(admin, "/connections")
        assert code == 200, text
        doc = json.loads(text)
        assert doc["workers_not_answering"] == 0
        assert len({r["id"] for r in doc["rows"]}) == 4
        assert doc["connections"] == len(doc["rows"]) == 4
        opened = [r for r in doc["rows"] if r["state"] == "open"]
        assert len(opened) == 3
        for r in opened:
            assert r["vhost"] == "/" and r["user"] == "guest"
            assert r["bytes_from_client"] > 0 and r["bytes_to_client"] > 0
            assert r["bytes_to_broker"] > 0 and r["bytes_from_broker"] > 0
            assert r["age_s"] >= 0 and r["broker"]
        busiest = max(opened, key=lambda r: r["bytes_from_client"])
        assert busiest["channels"] == 2
        assert busiest["bytes_from_client"] > 10000
        assert [r["state"] for r in doc["rows"]].count("header") == 1
        silent.close()
    finally:
        for c in conns:
            support.safe_close(c)
        p.stop()
