"""Proxies with schedule rules and engines of their own, and the ladder."""
import json
import os
import shutil
import tempfile
import urllib.request

import pika
import pytest

import rulesproxy
import support

TARGET_EXCHANGE = "acemq-sched-x"      # allowed by the rules (topic)
QUEUE_PREFIX = "acemq-sched."          # default exchange, routing key acemq-sched.#
LADDER = ["acemq.schedule.1h", "acemq.schedule.10m", "acemq.schedule.1m",
          "acemq.schedule.10s", "acemq.schedule.1s", "acemq.schedule.due"]
RULES = ('{"vhost": "/", "schedule": {"match": [{"exchange": "%s"}, '
         '{"exchange": "", "routing_key": "acemq-sched.#"}], "engine": %s}}')


class Proxy(rulesproxy.Proxy):
    """A proxy with the engine's credentials and an admin endpoint."""

    def __init__(self, rules, data, engine=True, extra=()):
        self.admin_port = rulesproxy.free_port()
        args = ["--admin", "127.0.0.1:%d" % self.admin_port]
        if engine:
            args += ["--engine-user", "guest", "--engine-password", "guest"]
        super().__init__(rules, data, args + list(extra))
        # The admin endpoint opens before the listener; waited for all the same.
        assert support.wait_until(lambda: support.port_accepts(self.admin_port), 10), self.stderr()

    def engines(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/stats" % self.admin_port, timeout=10) as r:
            return json.loads(r.read())["engines"]

    def engine(self, vhost="/"):
        return self.engines().get(vhost, {})

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.admin_port, timeout=10) as r:
            return r.read().decode()


def write_rules(d, engine=True):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "root.json"), "w") as f:
        f.write(RULES % (TARGET_EXCHANGE, "true" if engine else "false"))


def purge_ladder():
    """Empty the ladder's queues (what earlier runs left there)."""
    c = rulesproxy.direct()
    ch = c.channel()
    for q in LADDER:
        try:
            ch.queue_purge(q)
        except pika.exceptions.ChannelClosedByBroker:
            ch = c.channel()
    c.close()


def delete_ladder():
    c = rulesproxy.direct()
    ch = c.channel()
    for q in LADDER:
        ch.queue_delete(q)
    ch.exchange_delete("acemq.schedule")
    c.close()


@pytest.fixture(scope="session")
def dirs():
    top = tempfile.mkdtemp(prefix="acemq-sched-")
    d = {"top": top, "rules": os.path.join(top, "rules"), "data": os.path.join(top, "data")}
    write_rules(d["rules"])
    yield d
    shutil.rmtree(top, ignore_errors=True)


def check_stopped(p):
    rc = p.stop()
    text = p.stderr()
    assert rc == 0, "proxy exited with %s:\n%s" % (rc, text[-3000:])
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]


@pytest.fixture(scope="session")
def proxy(dirs):
    support.ensure_rabbitmq(60)
    purge_ladder_if_there()
    p = Proxy(dirs["rules"], dirs["data"])
    assert support.wait_until(lambda: p.engine().get("ladder_ready") == 1, 20), p.engine()
    yield p
    check_stopped(p)


def purge_ladder_if_there():
    try:
        purge_ladder()
    except Exception:
        pass


@pytest.fixture
def target():
    """A fresh queue the rules allow, reached through the default exchange
    and bound to the allowed topic exchange by its own name."""
    name = support.unique_name(QUEUE_PREFIX.rstrip("."))
    name = QUEUE_PREFIX + name.split("-")[-1]
    c = rulesproxy.direct()
    ch = c.channel()
    ch.exchange_declare(TARGET_EXCHANGE, "topic", durable=True)
    ch.queue_declare(name, durable=True)
    ch.queue_bind(name, TARGET_EXCHANGE, name)
    c.close()
    yield name
    c = rulesproxy.direct()
    c.channel().queue_delete(name)
    c.close()
