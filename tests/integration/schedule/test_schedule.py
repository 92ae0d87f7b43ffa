"""Scheduled delivery through the real proxy and a real RabbitMQ: x-delay
rewritten onto the ladder, the engine's hops and deliveries, its refusals,
and what survives a proxy killed with SIGKILL and a broker restart."""
import os
import random
import tempfile
import time
import uuid

import pika
import pytest

import rulesproxy
from conftest import (LADDER, QUEUE_PREFIX, TARGET_EXCHANGE, Proxy, check_stopped,
                      delete_ladder, support, write_rules)

from prometheus_client.parser import text_string_to_metric_families


def direct():
    return rulesproxy.direct()


def publish(conn, routing_key, body, delay, exchange="", props=None, mandatory=False):
    ch = conn.channel()
    ch.confirm_delivery()
    p = props or pika.BasicProperties()
    headers = dict(p.headers or {})
    if delay is not None:
        headers["x-delay"] = delay
    p.headers = headers
    ch.basic_publish(exchange, routing_key, body, p, mandatory=mandatory)
    return ch


def collect(queue, count, timeout):
    """Messages from queue with their arrival times, until count or timeout."""
    got = []
    c = direct()
    ch = c.channel()
    deadline = time.time() + timeout
    while len(got) < count and time.time() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            c.process_data_events(0.02)
            continue
        got.append((time.time(), props, body))
    c.close()
    return got


def depth(queue):
    c = direct()
    n = c.channel().queue_declare(queue, passive=True).method.message_count
    c.close()
    return n


def test_delay_arrives_on_time_with_everything_intact(proxy, target):
    before = proxy.engine()
    props = pika.BasicProperties(content_type="application/json", content_encoding="utf-8",
                                 message_id="m-1", correlation_id="c-1", priority=3,
                                 delivery_mode=2, type="invoice", app_id="billing",
                                 timestamp=1700000000,
                                 headers={"other": "kept", "n": 5, "nested": {"a": 1}})
    c = proxy.connect()
    t0 = time.time()
    publish(c, target, b'{"total": 12}', 3000, props=props, mandatory=True)
    c.close()
    got = collect(target, 1, 10)
    assert len(got) == 1
    at, p, body = got[0]
    assert at - t0 >= 3.0, "delivered early: %.3f s" % (at - t0)
    assert at - t0 <= 4.5, "delivered late: %.3f s" % (at - t0)
    assert body == b'{"total": 12}'
    assert p.content_type == "application/json"
    assert (p.content_encoding, p.message_id, p.correlation_id, p.priority, p.delivery_mode,
            p.type, p.app_id, p.timestamp) == ("utf-8", "m-1", "c-1", 3, 2, "invoice",
                                                "billing", 1700000000)
    assert p.headers == {"other": "kept", "n": 5, "nested": {"a": 1}}
    # a delivery is counted when the broker confirms it, which may come
    # after the target's consumer has it
    assert support.wait_until(lambda: proxy.engine()["delivered"] >= before["delivered"] + 1, 10)
    after = proxy.engine()
    assert after["scheduled"] == before["scheduled"] + 1
    assert after["hops"] >= before["hops"] + 2  # 3 s: three 1 s rungs


def test_published_to_an_exchange_and_without_content_type(proxy, target):
    c = proxy.connect()
    publish(c, target, b"plain", 1200, exchange=TARGET_EXCHANGE)
    c.close()
    got = collect(target, 1, 8)
    assert len(got) == 1
    assert got[0][1].content_type is None
    assert not got[0][1].headers
    assert got[0][2] == b"plain"


def test_long_delay_does_not_hold_back_a_short_one(proxy, target):
    c = proxy.connect()
    t0 = time.time()
    publish(c, target, b"eight", 8000)
    publish(c, target, b"two", 2000)
    c.close()
    first = collect(target, 1, 8)
    assert [b for _, _, b in first] == [b"two"]
    assert 2.0 <= first[0][0] - t0 <= 3.5
    second = collect(target, 1, 12)
    assert [b for _, _, b in second] == [b"eight"]
    assert 8.0 <= second[0][0] - t0 <= 9.5


def test_zero_negative_and_bad_delays_deliver_at_once(proxy, target):
    before = proxy.engine()
    c = proxy.connect()
    for delay in (0, -5, "soon", "12abc"):
        publish(c, target, str(delay).encode(), delay,
                props=pika.BasicProperties(headers={"k": "v"}))
    publish(c, target, b"none", None)
    c.close()
    got = collect(target, 5, 5)
    assert sorted(b for _, _, b in got) == sorted([b"0", b"-5", b"soon", b"12abc", b"none"])
    for _, p, b in got:
        assert "x-delay" not in (p.headers or {}), b
    after = proxy.engine()
    assert after["sched_now"] == before["sched_now"] + 4
    assert after["sched_bad"] == before["sched_bad"] + 2
    assert after["scheduled"] == before["scheduled"]


def test_string_delay_is_milliseconds(proxy, target):
    c = proxy.connect()
    t0 = time.time()
    publish(c, target, b"s", "1500")
    c.close()
    got = collect(target, 1, 6)
    assert len(got) == 1 and got[0][0] - t0 >= 1.5


def test_publish_outside_the_rules_is_untouched(proxy):
    q = support.unique_name("acemq-unscheduled")
    c = direct()
    c.channel().queue_declare(q, auto_delete=False)
    c.close()
    p = proxy.connect()
    publish(p, q, b"now", 60000)
    p.close()
    got = collect(q, 1, 3)
    assert len(got) == 1
    assert got[0][1].headers == {"x-delay": 60000}
    c = direct()
    c.channel().queue_delete(q)
    c.close()


def test_target_bound_after_due_time_gets_it_once_bound(proxy, target):
    rk = QUEUE_PREFIX + "late." + uuid.uuid4().hex[:8]
    before = proxy.engine()
    c = proxy.connect()
    publish(c, rk, b"late", 1000, exchange=TARGET_EXCHANGE)
    c.close()
    support.wait_until(lambda: proxy.engine()["unroutable"] > before["unroutable"], 10)
    assert depth(target) == 0
    d = direct()
    d.channel().queue_bind(target, TARGET_EXCHANGE, rk)
    d.close()
    got = collect(target, 2, 5)
    assert [b for _, _, b in got] == [b"late"]


def test_engine_refuses_an_exchange_the_rules_do_not_allow(proxy):
    before = proxy.engine()
    ex = support.unique_name("acemq-sched-forbidden")
    q = support.unique_name("acemq-sched-forbidden-q")
    d = direct()
    ch = d.channel()
    ch.exchange_declare(ex, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, ex)
    # Put into the ladder by hand, naming an exchange no rule allows.
    ch.basic_publish("acemq.schedule", "acemq.schedule.due", b"sneaky",
                     pika.BasicProperties(headers={
                         "x-schedule-exchange": ex, "x-schedule-routing-key": "",
                         "x-schedule-due-at": int(time.time() * 1000),
                         "x-schedule-content-type": ""}))
    support.wait_until(lambda: proxy.engine()["forbidden"] > before["forbidden"], 10)
    time.sleep(0.5)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.queue_delete(q)
    ch.exchange_delete(ex)
    d.close()
    assert "no schedule rule allows it" in proxy.stderr()


def test_exchange_that_refused_a_delivery_is_suspect_at_once():
    """The target exchange is internal: the broker refuses the engine's
    delivery with 403 and closes the publish channel, and from then on, for
    10 s, due messages for that exchange go back into the 1 s rung instead
    of being published again (each time closing the channel and the
    connection). A vhost of the test's own."""
    vhost = support.unique_name("acemq-sched-403")
    support.rabbitmqctl("add_vhost", vhost)
    support.rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    rules = tempfile.mkdtemp(prefix="acemq-sched-403-")
    with open(os.path.join(rules, "v.json"), "w") as f:
        f.write('{"vhost": "%s", "schedule": {"match": [{"exchange": "refused-x"}], '
                '"engine": true}}' % vhost)
    p = None
    try:
        d = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", support.BROKER_PORT, vhost))
        d.channel().exchange_declare("refused-x", "fanout", internal=True)
        d.close()
        p = Proxy(rules, tempfile.mkdtemp(prefix="acemq-sched-403-data-"))
        assert support.wait_until(lambda: p.engine(vhost).get("ladder_ready") == 1, 20), \
            p.stderr()
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", p.port, vhost))
        for _ in range(5):
            publish(c, "", b"x", 100, exchange="refused-x")
        c.close()
        # Due within about a second; after the one refusal each goes round
        # the 1 s rung (twice each here) while the exchange is suspect.
        assert support.wait_until(lambda: p.engine(vhost)["unroutable"] >= 10, 15), \
            p.engine(vhost)
        assert p.engine(vhost)["failures"] == 1, p.stderr()[-3000:]
        assert p.stderr().count("403 ACCESS_REFUSED") == 1, p.stderr()[-3000:]
    finally:
        if p:
            check_stopped(p)
        support.rabbitmqctl("delete_vhost", vhost, check=False)


def test_malformed_message_in_the_control_queue_is_dropped(proxy):
    before = proxy.engine()
    d = direct()
    ch = d.channel()
    ch.basic_publish("acemq.schedule", "acemq.schedule.due", b"junk",
                     pika.BasicProperties(headers={"x-schedule-exchange": "x"}))
    ch.basic_publish("acemq.schedule", "acemq.schedule.due", b"junk2")
    d.close()
    support.wait_until(lambda: proxy.engine()["malformed"] >= before["malformed"] + 2, 10)
    support.wait_until(lambda: depth("acemq.schedule.due") == 0, 5)


def test_ladder_declared_by_another_library_first_coexists(dirs):
    """pika declares the ladder with the contract's names and arguments, then
    a proxy starts: no PRECONDITION_FAILED, and the other way round."""
    def declare_with_pika():
        d = direct()
        ch = d.channel()
        ch.exchange_declare("acemq.schedule", "direct", durable=True)
        for q, ttl in (("acemq.schedule.1h", 3600000), ("acemq.schedule.10m", 600000),
                       ("acemq.schedule.1m", 60000), ("acemq.schedule.10s", 10000),
                       ("acemq.schedule.1s", 1000)):
            ch.queue_declare(q, durable=True, arguments={
                "x-message-ttl": ttl, "x-dead-letter-exchange": "acemq.schedule",
                "x-dead-letter-routing-key": "acemq.schedule.due"})
            ch.queue_bind(q, "acemq.schedule", q)
        ch.queue_declare("acemq.schedule.due", durable=True)
        ch.queue_bind("acemq.schedule.due", "acemq.schedule", "acemq.schedule.due")
        d.close()

    data = tempfile.mkdtemp(prefix="acemq-sched-own-")
    p = None
    try:
        delete_ladder()
        declare_with_pika()
        p = Proxy(dirs["rules"], data)
        support.wait_until(lambda: p.engine().get("ladder_ready") == 1, 20)
        assert "PRECONDITION_FAILED" not in p.stderr()
        declare_with_pika()  # the other way round: after the proxy's
        assert p.engine()["failures"] == 0
    finally:
        if p:
            check_stopped(p)


def test_ladder_declared_before_the_first_rewritten_publish(proxy, target):
    """With the ladder gone, a proxy whose rules only rewrite (no scheduler
    of its own) declares it before it forwards the first delayed publish:
    the publish is confirmed, not refused with 404, and is delivered."""
    data = tempfile.mkdtemp(prefix="acemq-sched-first-")
    rules = tempfile.mkdtemp(prefix="acemq-sched-rules-")
    write_rules(rules, engine=False)
    p = None
    try:
        delete_ladder()
        p = Proxy(rules, data)
        c = p.connect()
        publish(c, target, b"x", 1500)  # confirm_delivery: raises if refused
        c.close()
        got = collect(target, 1, 10)
        assert [b for _, _, b in got] == [b"x"]
        assert p.engine()["delivered"] == 0  # the other proxy's scheduler did it
    finally:
        if p:
            check_stopped(p)


def test_proxy_killed_with_sigkill_loses_nothing(dirs, target):
    data = tempfile.mkdtemp(prefix="acemq-sched-kill-")
    p = Proxy(dirs["rules"], data)
    try:
        support.wait_until(lambda: p.engine().get("ladder_ready") == 1, 20)
        sent = {}
        c = p.connect()
        ch = c.channel()
        ch.confirm_delivery()
        for i in range(40):
            delay = 1000 + (i % 8) * 500
            sent[str(i)] = time.time() + delay / 1000.0
            ch.basic_publish("", target, str(i).encode(),
                             pika.BasicProperties(message_id=str(i), delivery_mode=2,
                                                  headers={"x-delay": delay}))
        c.close()
        time.sleep(1.6)  # some hops and deliveries under way
        p.kill9()
        time.sleep(2.5)
        p.start()
        got = collect(target, len(sent), 15)
        got += collect(target, 1, 3)  # and no second copy of any
        ids = [pr.message_id for _, pr, _ in got]
        assert sorted(ids) == sorted(sent), "lost or doubled: %s" % sorted(ids)
        for at, pr, _ in got:
            assert at >= sent[pr.message_id] - 0.05, "early: %s" % pr.message_id
        check_stopped(p)
    finally:
        p.stop()  # one left running would go on consuming the control queue


def test_two_proxies_deliver_a_thousand_exactly_once(proxy, dirs, target):
    second = Proxy(dirs["rules"], tempfile.mkdtemp(prefix="acemq-sched-two-"))
    try:
        support.wait_until(lambda: second.engine().get("connects", 0) >= 1, 20)
        a0, b0 = proxy.engine()["delivered"], second.engine()["delivered"]
        c = proxy.connect()
        ch = c.channel()
        ch.confirm_delivery()
        for i in range(1000):
            ch.basic_publish("", target, b"m",
                             pika.BasicProperties(message_id=str(i),
                                                  headers={"x-delay": 1000 + i % 1000}))
        c.close()
        got = collect(target, 1000, 30)
        got += collect(target, 1, 3)  # and no second copy of any
        ids = [pr.message_id for _, pr, _ in got]
        assert len(ids) == 1000 and len(set(ids)) == 1000
        # counted when the broker confirms, which may follow the consumer
        assert support.wait_until(lambda: proxy.engine()["delivered"] - a0
                                  + second.engine()["delivered"] - b0 >= 1000, 10)
        a = proxy.engine()["delivered"] - a0
        b = second.engine()["delivered"] - b0
        assert a > 0 and b > 0, (a, b)
    finally:
        check_stopped(second)


def test_thousand_mixed_delays_none_early(proxy, target):
    rnd = random.Random(int(os.environ.get("ACEMQ_SCHED_SEED", "7")))
    due = {}
    c = proxy.connect()
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(1000):
        delay = rnd.randint(1000, 20000)
        t = time.time()
        ch.basic_publish("", target, b"m", pika.BasicProperties(
            message_id=str(i), headers={"x-delay": delay}))
        due[str(i)] = t + delay / 1000.0
    c.close()
    got = collect(target, 1000, 60)
    assert len(got) == 1000
    late = sorted(at - due[pr.message_id] for at, pr, _ in got)
    assert late[0] >= -0.05, "delivered early by %.3f s" % -late[0]
    p50, p99 = late[len(late) // 2], late[int(len(late) * 0.99)]
    print("\nschedule lateness over 1000 messages (1-20 s): p50 %.3f s, p99 %.3f s, max %.3f s"
          % (p50, p99, late[-1]))
    assert p99 < 3.0


def test_metrics_parse(proxy):
    fams = {f.name: f for f in text_string_to_metric_families(proxy.metrics())}
    sched = fams["acemq_proxy_schedule"]
    events = {s.labels["event"]: s.value for s in sched.samples
              if s.labels.get("vhost") == "/" and s.name.endswith("_total")}
    stats = proxy.engine()
    assert events["delivered"] == stats["delivered"] > 0
    assert events["scheduled"] == stats["scheduled"]
    late = fams["acemq_proxy_schedule_lateness_seconds"]
    count = [s.value for s in late.samples if s.name.endswith("_count")][0]
    assert count == stats["delivered"]
    # every rewritten publish was a message the proxy held: timed
    held = fams["acemq_proxy_message_seconds"]
    held_count = [s.value for s in held.samples if s.name.endswith("_count")][0]
    buckets = [s for s in held.samples if s.name.endswith("_bucket")]
    assert held_count >= stats["scheduled"] > 0
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == held_count
    assert fams["acemq_proxy_state_used_bytes"].samples[0].value > 0


def test_engine_survives_a_broker_restart(proxy, target):
    """Messages waiting in the ladder (persistent) are delivered after the
    broker restarts; the engine connects again by itself."""
    before = proxy.engine()["connects"]
    c = proxy.connect()
    t0 = time.time()
    publish(c, target, b"durable", 6000, props=pika.BasicProperties(delivery_mode=2))
    c.close()
    support.rabbitmqctl("stop_app")
    support.rabbitmqctl("start_app")
    assert support.wait_broker(60)
    got = collect(target, 1, 30)
    assert [b for _, _, b in got] == [b"durable"]
    assert got[0][0] - t0 >= 6.0
    # On a loaded machine the message may have been delivered before the
    # broker stopped, and the engine still be waiting out its backoff (at
    # most 10 s) when it arrives.
    assert support.wait_until(lambda: proxy.engine()["connects"] > before, 30), proxy.engine()


def test_reload_starts_and_stops_the_scheduler(proxy):
    """A rules reload that turns "engine" on makes the proxy consume the
    control queue; turning it off again stops it."""
    import signal

    def consumers():
        out = support.rabbitmqctl("list_queues", "name", "consumers").stdout
        for line in out.splitlines():
            parts = line.split("\t")
            if parts[0] == "acemq.schedule.due":
                return int(parts[1])
        return -1

    rules = tempfile.mkdtemp(prefix="acemq-sched-reload-")
    write_rules(rules, engine=False)
    p = Proxy(rules, tempfile.mkdtemp(prefix="acemq-sched-reload-data-"))
    try:
        support.wait_until(lambda: p.engine().get("ladder_ready") == 1, 20)
        base = consumers()
        write_rules(rules, engine=True)
        p.proc.send_signal(signal.SIGHUP)
        assert support.wait_until(lambda: consumers() == base + 1, 15), (base, consumers())
        write_rules(rules, engine=False)
        p.proc.send_signal(signal.SIGHUP)
        assert support.wait_until(lambda: consumers() == base, 15), (base, consumers())
        assert p.engine()["failures"] == 0
    finally:
        check_stopped(p)
