"""Rules reload: refusals keep the old rules; a reload under load loses and
duplicates nothing."""
import os
import subprocess
import threading
import time
import uuid

import pika

from conftest import PROXY, Proxy, write_rules

HEADER = "acemq-reply-to"
ON = '{"vhost": "/", "reply_to": {"enabled": true}}'
OFF = '{"vhost": "/"}'


def test_check_config_reports_rules_errors(rules_dir):
    write_rules(rules_dir, "a.json", '{"vhost": "a", "reply_to": {"enabled": 1}, "extra": 2}')
    write_rules(rules_dir, "b.json", '{"vhost": "a"}')
    r = subprocess.run([PROXY, "--check-config", "--rules", rules_dir], capture_output=True,
                       text=True, timeout=20)
    assert r.returncode == 1
    assert f"{rules_dir}/a.json: extra: unknown key" in r.stderr
    assert f"{rules_dir}/a.json: reply_to.enabled: must be true or false" in r.stderr


def test_bad_rules_stop_the_start(rules_dir):
    write_rules(rules_dir, "a.json", "{not json")
    r = subprocess.run([PROXY, "--rules", rules_dir, "--listen", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 1
    assert "a.json: (file): not valid JSON" in r.stderr


def publish_get(port, props):
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x", props)
    m, p, b = ch.basic_get(q, auto_ack=True)
    c.close()
    return p


def test_reload_switches_and_bad_file_keeps_old(rules_dir):
    write_rules(rules_dir, "default.json", OFF)
    p = Proxy(rules_dir)
    try:
        assert publish_get(p.port, pika.BasicProperties(reply_to="r")).headers is None
        write_rules(rules_dir, "default.json", ON)
        p.hup()
        deadline = time.time() + 5
        while publish_get(p.port, pika.BasicProperties(reply_to="r")).headers is None:
            assert time.time() < deadline, "SIGHUP reload never applied"
            time.sleep(0.1)
        # A bad file: refused with file, key and reason; the old rules serve.
        write_rules(rules_dir, "default.json", '{"vhost": "/", "reply_to": {"enabled": "on"}}')
        status, text = p.reload_http()
        assert status == 400
        assert "default.json: reply_to.enabled: must be true or false" in text
        assert publish_get(p.port, pika.BasicProperties(reply_to="r")).headers == {HEADER: "r"}
        assert "the rules in force are kept" in p.stderr()
        write_rules(rules_dir, "default.json", OFF)
        assert p.reload_http()[0] == 200
        assert publish_get(p.port, pika.BasicProperties(reply_to="r")).headers is None
    finally:
        p.stop()


def test_reload_under_load_loses_and_duplicates_nothing(rules_dir):
    write_rules(rules_dir, "default.json", ON)
    p = Proxy(rules_dir)
    n = 3000
    q = f"acemq-reload-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    reloads = [0]

    def flip():
        on = True
        while not stop.is_set():
            on = not on
            write_rules(rules_dir, "default.json", ON if on else OFF)
            if reloads[0] % 2:
                p.hup()
            else:
                p.reload_http()
            reloads[0] += 1
            time.sleep(0.02)

    try:
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", p.port))
        ch = c.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        t = threading.Thread(target=flip)
        t.start()
        try:
            for i in range(n):
                ch.basic_publish("", q, str(i).encode(),
                                 pika.BasicProperties(reply_to="r", message_id=str(i)))
        finally:
            stop.set()
            t.join()
        assert reloads[0] >= 5
        seen = []
        consumer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", p.port))
        cch = consumer.channel()
        cch.basic_qos(prefetch_count=500)
        for m, props, body in cch.consume(q, inactivity_timeout=2):
            if m is None:
                break
            seen.append(int(body))
            assert props.reply_to == "r"
            cch.basic_ack(m.delivery_tag)
        cch.cancel()
        consumer.close()
        assert sorted(seen) == list(range(n)), (len(seen), len(set(seen)))
        ch.queue_delete(q)
        c.close()
    finally:
        p.stop()


def test_shipped_examples_are_valid():
    top = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
    r = subprocess.run([PROXY, "--check-config", "--rules", os.path.join(top, "rules")],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
