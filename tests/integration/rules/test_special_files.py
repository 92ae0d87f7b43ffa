"""Rules directories holding what is not a regular file: a FIFO named
*.json used to freeze the main thread on a reload (waiting for a writer),
so that new clients were not accepted and /healthz hung; a directory named
x.json was "not valid JSON". Both are refused at once by name, the rules in
force are kept, and the proxy goes on serving."""
import os
import time
import urllib.request

import pika

from conftest import Proxy, write_rules

ON = '{"vhost": "/", "reply_to": {"enabled": true}}'


def reply_header(port):
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10))
    try:
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to="r"))
        return ch.basic_get(q, auto_ack=True)[1].headers
    finally:
        c.close()


def healthz(p):
    with urllib.request.urlopen(f"http://127.0.0.1:{p.admin}/healthz", timeout=10) as r:
        return r.status


def test_fifo_and_directory_refused_at_once_and_rules_kept(rules_dir):
    write_rules(rules_dir, "default.json", ON)
    p = Proxy(rules_dir)
    try:
        assert reply_header(p.port) == {"acemq-reply-to": "r"}
        os.mkfifo(os.path.join(rules_dir, "fifo.json"))
        os.mkdir(os.path.join(rules_dir, "x.json"))
        # POST /reload answers (no writer ever opens the FIFO): 400 with
        # each file named. urllib's timeout bounds a hang.
        status, text = p.reload_http()
        assert status == 400, text
        assert f"{rules_dir}/fifo.json: (file): not a regular file (a FIFO)" in text
        assert f"{rules_dir}/x.json: (file): not a regular file (a directory)" in text
        assert "not valid JSON" not in text
        # SIGHUP: the same refusal is logged, and the main thread goes on.
        logged = p.stderr().count("fifo.json: (file): not a regular file")
        p.hup()
        deadline = time.monotonic() + 10
        while p.stderr().count("fifo.json: (file): not a regular file") == logged:
            assert time.monotonic() < deadline, "SIGHUP reload never finished:\n" + p.stderr()
            time.sleep(0.05)
        assert healthz(p) == 200
        # The rules in force are kept, and new clients are accepted.
        assert reply_header(p.port) == {"acemq-reply-to": "r"}
        assert "the rules in force are kept" in p.stderr()
    finally:
        p.stop()
