"""The surplus: for a consumer of an idempotency queue the proxy asks the
broker for more than the client's prefetch (the rule's prefetch_ahead, or
1000 from a prefetch of 100 on) and keeps what is past
the client's prefetch, so claims run ahead of the client. Through the real proxy with
pika and a real broker: the client never has more unacked than it asked
for, gets everything once and in order, and what was kept is neither
acknowledged for it nor lost (cancel, recover, a multiple ack, a close)."""
import os
import re
import shutil
import signal
import tempfile
import time
import urllib.request
import uuid

import pika
from rulesproxy import Proxy, free_port

Q = "acemq-idem-ahead"  # prefetch_ahead 5
AUTO = "acemq-idem-id"  # prefetch_ahead not set
PLAIN = "acemq-surplus-plain"


def publish(queue, n, keyed=True, tag="m"):
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    ch = c.channel()
    ch.confirm_delivery()
    run = uuid.uuid4().hex
    for i in range(n):
        props = pika.BasicProperties(message_id="%s-%d" % (run, i)) if keyed else None
        ch.basic_publish("", queue, b"%s%d" % (tag.encode(), i), props)
    c.close()


def surplus_total(admin, event):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=5).read().decode()
    m = re.search(r'^acemq_proxy_surplus_total\{event="%s"\} (\d+)$' % event, text, re.M)
    return int(m.group(1)) if m else None


def own_proxy(rules_text):
    """A proxy of the test's own (rules it may change), with its admin port."""
    top = tempfile.mkdtemp(prefix="acemq-surplus-")
    rules = os.path.join(top, "rules")
    os.makedirs(rules)
    with open(os.path.join(rules, "root.json"), "w") as f:
        f.write(rules_text)
    admin = free_port()
    p = Proxy(rules, os.path.join(top, "data"), extra=["--admin", "127.0.0.1:%d" % admin])
    p.top, p.admin, p.rules_file = top, admin, os.path.join(rules, "root.json")
    return p


def ready(queue):
    """Messages the broker has not sent to any consumer."""
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    n = c.channel().queue_declare(queue, passive=True).method.message_count
    c.close()
    return n


def wait_ready(queue, n, timeout=5.0):
    end = time.monotonic() + timeout
    while ready(queue) != n and time.monotonic() < end:
        time.sleep(0.1)
    return ready(queue)


class Consumer:
    """A pika consumer that records deliveries and acks only when told."""

    def __init__(self, port, prefetch):
        self.c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        self.ch = self.c.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got = []  # (consumer tag, delivery tag, body)

    def consume(self, queue):
        return self.ch.basic_consume(
            queue, lambda ch, m, p, b: self.got.append((m.consumer_tag, m.delivery_tag, b)))

    def pump(self, seconds=0.5):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.c.process_data_events(time_limit=0.05)

    def pump_until(self, n, timeout=5.0):
        end = time.monotonic() + timeout
        while len(self.got) < n and time.monotonic() < end:
            self.c.process_data_events(time_limit=0.05)
        return len(self.got)

    def ack_until(self, n, timeout=10.0, start=0):
        """Ack each delivery (from the start'th) as it comes until n have
        come; then the rest."""
        seen = start
        end = time.monotonic() + timeout
        while len(self.got) < n and time.monotonic() < end:
            for g in self.got[seen:]:
                self.ch.basic_ack(g[1])
            seen = len(self.got)
            self.c.process_data_events(time_limit=0.05)
        for g in self.got[seen:]:
            self.ch.basic_ack(g[1])
        self.pump(0.5)

    def close(self):
        self.c.close()


def left_for_another(port, bodies):
    """A new consumer gets exactly these (any order) and empties the queue."""
    d = Consumer(port, 100)
    d.consume(Q)
    d.pump_until(len(bodies))
    assert sorted(g[2] for g in d.got) == sorted(bodies)
    d.ch.basic_ack(0, multiple=True)
    d.pump(0.3)
    d.close()
    assert wait_ready(Q, 0) == 0


def test_client_never_has_more_than_its_prefetch(proxy, fresh):
    publish(Q, 50)
    c = Consumer(proxy.port, 5)
    c.consume(Q)
    c.pump(1.5)
    # The client has its prefetch; the broker sent five more.
    assert len(c.got) == 5
    assert wait_ready(Q, 40) == 40
    # Each ack makes room for one more, at once.
    for i in range(3):
        c.ch.basic_ack(c.got[i][1])
    assert c.pump_until(8) == 8
    c.pump(0.5)
    assert len(c.got) == 8
    assert wait_ready(Q, 37) == 37
    # Acked in batches (multiple), everything comes, once, in order.
    while len(c.got) < 50:
        c.ch.basic_ack(c.got[-1][1], multiple=True)
        c.pump_until(len(c.got) + 5)
    c.ch.basic_ack(c.got[-1][1], multiple=True)
    c.pump(0.5)
    assert [g[2] for g in c.got] == [b"m%d" % i for i in range(50)]
    assert [g[1] for g in c.got] == list(range(1, 51))
    c.close()
    assert wait_ready(Q, 0) == 0


def test_ahead_by_default_only_from_a_prefetch_of_100(proxy, fresh):
    publish(AUTO, 1200)
    c = Consumer(proxy.port, 99)
    c.consume(AUTO)
    c.pump(1.0)
    assert len(c.got) == 99
    assert wait_ready(AUTO, 1101) == 1101  # a work queue's prefetch: as asked
    c.close()
    assert wait_ready(AUTO, 1200) == 1200
    c = Consumer(proxy.port, 100)
    c.consume(AUTO)
    c.pump(1.5)
    assert len(c.got) == 100
    assert wait_ready(AUTO, 100) == 100  # 100 and 1000 kept by the proxy
    c.close()
    assert wait_ready(AUTO, 1200) == 1200


def test_closing_gives_back_what_was_kept(proxy, fresh):
    publish(Q, 30)
    c = Consumer(proxy.port, 5)
    c.consume(Q)
    c.pump(1.0)
    assert len(c.got) == 5
    assert wait_ready(Q, 20) == 20
    c.ch.basic_ack(c.got[1][1], multiple=True)  # two of them
    c.pump_until(7)
    c.close()
    # Everything not acked is back, and its claims were given up: a new
    # consumer gets all of it.
    assert wait_ready(Q, 28) == 28
    left_for_another(proxy.port, [b"m%d" % i for i in range(2, 30)])


def test_cancel_delivers_what_was_kept_first(proxy, fresh):
    publish(Q, 30)
    c = Consumer(proxy.port, 5)
    tag = c.consume(Q)
    c.pump(1.0)
    assert len(c.got) == 5
    assert wait_ready(Q, 20) == 20
    # The five kept reach the client before its cancel-ok (pika gives back
    # what arrives for a cancelled consumer: basic.nack with requeue).
    c.ch.basic_cancel(tag)
    for g in c.got:
        c.ch.basic_ack(g[1])
    c.pump(0.3)
    assert len(c.got) == 5
    # Nothing is held for the cancelled consumer while the connection lives.
    assert wait_ready(Q, 25) == 25
    c.close()
    left_for_another(proxy.port, [b"m%d" % i for i in range(5, 30)])


def test_recover_redelivers_what_was_kept_once(proxy, fresh):
    publish(Q, 20)
    c = Consumer(proxy.port, 5)
    c.consume(Q)
    c.pump(1.0)
    assert len(c.got) == 5
    c.ch.basic_recover(requeue=True)
    c.got = []
    # Acked as they come: each message once, whatever was kept before.
    c.ack_until(20)
    assert sorted(g[2] for g in c.got) == sorted(b"m%d" % i for i in range(20))
    c.close()
    assert wait_ready(Q, 0) == 0


def test_a_multiple_ack_never_covers_what_was_kept(proxy, fresh):
    """Two consumers on one channel: one with a surplus (kept deliveries
    come out of broker order), one without. A multiple ack covers exactly
    what the client had."""
    c0 = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    c0.channel().queue_declare(PLAIN)
    c0.channel().queue_purge(PLAIN)
    c0.close()
    publish(Q, 20)
    c = Consumer(proxy.port, 5)
    ka = c.consume(Q)
    c.pump(1.0)
    assert len(c.got) == 5
    publish(PLAIN, 20, keyed=False, tag="p")
    c.consume(PLAIN)
    c.pump_until(10)
    c.pump(0.5)
    assert len(c.got) == 10
    # One of Q's is acked: a kept one goes out, after PLAIN's.
    first = [g for g in c.got if g[0] == ka][0]
    c.ch.basic_ack(first[1])
    c.pump_until(11)
    assert len(c.got) == 11 and c.got[-1][0] == ka
    # Everything up to the last PLAIN delivery, not the one just sent.
    last_plain = [g for g in c.got if g[0] != ka][-1]
    c.ch.basic_ack(last_plain[1], multiple=True)
    c.pump(0.5)
    c.close()
    # Acked at the broker: Q's first five, PLAIN's five; not the sixth of Q.
    assert wait_ready(Q, 15) == 15
    assert wait_ready(PLAIN, 15) == 15


def test_a_reload_that_drops_the_rule_lets_what_was_kept_go_first(fresh):
    """The rules change under a consumer with deliveries kept: they reach
    the client before the deliveries that follow, in order, and all of it
    is acknowledged at the broker."""
    p = own_proxy('{"vhost": "/", "idempotency": [{"queue": "%s", "key": "message-id", '
                  '"prefetch_ahead": 5}]}' % Q)
    try:
        publish(Q, 30)
        c = Consumer(p.port, 5)
        c.consume(Q)
        c.pump(1.0)
        assert len(c.got) == 5
        assert wait_ready(Q, 20) == 20  # five kept
        assert surplus_total(p.admin, "kept") == 5
        assert surplus_total(p.admin, "past_prefetch") == 0
        with open(p.rules_file, "w") as f:
            f.write('{"vhost": "/"}')
        p.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        # One ack: a kept one goes, and the broker sends one more, which no
        # hook wants now: the four still kept go before it.
        c.ch.basic_ack(c.got[0][1])
        c.pump(1.0)
        assert [g[2] for g in c.got] == [b"m%d" % i for i in range(11)]
        # Acked one by one from here: the rest as the broker sends them.
        c.ack_until(30, start=1)
        assert [g[2] for g in c.got] == [b"m%d" % i for i in range(30)]
        assert [g[1] for g in c.got] == list(range(1, 31))
        c.close()
        assert wait_ready(Q, 0) == 0
    finally:
        assert p.stop() == 0
        shutil.rmtree(p.top, ignore_errors=True)


def test_at_most_16_mib_kept_on_a_channel(fresh):
    """Large messages: past 16 MiB kept on a channel, what was kept goes to
    the client (past its prefetch) rather than the proxy holding more;
    every message arrives once, in order."""
    p = own_proxy('{"vhost": "/", "idempotency": [{"queue": "%s", "key": "message-id", '
                  '"prefetch_ahead": 10}]}' % Q)
    try:
        big = b"x" * (5 << 20)
        c0 = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
        ch0 = c0.channel()
        ch0.confirm_delivery()
        for i in range(8):
            ch0.basic_publish("", Q, big + b"%d" % i,
                              pika.BasicProperties(message_id=uuid.uuid4().hex))
        c0.close()
        c = Consumer(p.port, 1)
        c.consume(Q)
        c.pump(2.0)
        # One at the client, three kept (15 MiB); the fourth would pass
        # 16 MiB: all four go to the client, past its prefetch; the last
        # three are kept again.
        assert len(c.got) == 5
        assert surplus_total(p.admin, "kept") == 6
        assert surplus_total(p.admin, "past_prefetch") == 1
        c.ack_until(8, timeout=20)
        assert [g[2][-1:] for g in c.got] == [b"%d" % i for i in range(8)]
        c.close()
        assert wait_ready(Q, 0) == 0
    finally:
        assert p.stop() == 0
        shutil.rmtree(p.top, ignore_errors=True)


def idem_total(admin, name, label=None):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=5).read().decode()
    pat = r'^%s%s (\d+)$' % (re.escape(name), re.escape("{%s}" % label) if label else "")
    m = re.search(pat, text, re.M)
    return int(m.group(1)) if m else None


class KeptUnderAShortLease:
    """A proxy whose rule gives claims a 2 s lease and asks 5 ahead; three
    keyed messages, a consumer with a prefetch of 1: m0 at the client, m1
    and m2 kept (claimed). A context: the proxy goes at the end."""

    def __enter__(self):
        self.p = own_proxy('{"vhost": "/", "idempotency": [{"queue": "%s", "key": '
                           '"message-id", "prefetch_ahead": 5, "lease_s": 2, '
                           '"in_progress_delay_s": 1}]}' % Q)
        self.run = uuid.uuid4().hex
        self.c0 = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
        self.ch0 = self.c0.channel()
        self.ch0.confirm_delivery()
        for i in range(3):
            self.again(i, b"m%d" % i)
        self.c = Consumer(self.p.port, 1)
        self.c.consume(Q)
        self.c.pump(1.0)
        assert [g[2] for g in self.c.got] == [b"m0"]
        return self

    def again(self, i, body=b"again"):
        """A message with the key of the i'th."""
        self.ch0.basic_publish("", Q, body,
                               pika.BasicProperties(message_id="%s-%d" % (self.run, i)))

    def total(self, name, label=None):
        return idem_total(self.p.admin, name, label)

    def __exit__(self, *exc):
        try:
            self.c0.close()
            self.c.close()
        finally:
            assert self.p.stop() == 0
            shutil.rmtree(self.p.top, ignore_errors=True)


def test_a_kept_delivery_that_waited_has_its_lease_renewed(fresh):
    """Kept past a 2 s lease, a delivery goes to the client with its claim
    renewed: a second message with its key, arriving then, is in progress,
    not claimed again."""
    with KeptUnderAShortLease() as k:
        c = k.c
        time.sleep(2.0)  # their leases would have run out while they waited
        c.ch.basic_ack(c.got[0][1])
        assert c.pump_until(2) == 2
        assert c.got[1][2] == b"m1"
        c.pump(0.5)
        claimed = k.total("acemq_proxy_idempotency_total", 'answer="claimed"')
        # Another message with m1's key: m1's claim is live.
        k.again(1)
        c.pump(1.0)
        assert k.total("acemq_proxy_idempotency_total", 'answer="claimed"') == claimed
        assert k.total("acemq_proxy_idempotency_total", 'answer="in_progress"') >= 1
        # Renewed while kept, and as it went out.
        assert k.total("acemq_proxy_idempotency_leases_renewed_total") >= 1


def test_a_delivery_kept_longer_than_its_lease_keeps_its_claim(fresh):
    """Deliveries kept 3.5 s under a 2 s lease have their claims renewed
    while they wait: a second message with the key of one still kept is in
    progress, not claimed again (without the renewal its lease ran out and
    the second message was claimed: two handlers for one key)."""
    with KeptUnderAShortLease() as k:
        c = k.c
        claimed = k.total("acemq_proxy_idempotency_total", 'answer="claimed"')
        assert claimed == 3
        c.pump(2.5)  # past the lease, m2 still kept
        assert [g[2] for g in c.got] == [b"m0"]
        k.again(2)
        c.pump(1.0)
        assert k.total("acemq_proxy_idempotency_total", 'answer="claimed"') == claimed
        assert k.total("acemq_proxy_idempotency_total", 'answer="in_progress"') >= 1
        # m1 and m2, each a few times (every 2/3 s or so over 3.5 s).
        assert k.total("acemq_proxy_idempotency_leases_renewed_total") >= 4
        c.ack_until(3)
        assert [g[2] for g in c.got[:3]] == [b"m0", b"m1", b"m2"]
