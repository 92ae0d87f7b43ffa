"""Broker channels kept open from one pooled client to the next: the next
client's channel.open and confirm.select are answered at once, its confirms
are numbered from 1 however many publishes the channel carried before; a
client that never selects confirms gets a plain channel (transactions
work); a channel whose client consumed, or whose last method the broker
refused, is not handed on. VHOST_ONE has one broker connection, so each
client here lands on the channels the one before it left."""
import struct
import uuid

import amqp_wire as w
import support
from conftest import VHOST_ONE, metric
from test_pool import connect, drain, fresh_queue

KEPT_USED = 'acemq_proxy_pool_channels_kept_total{event="used"}'
KEPT = 'acemq_proxy_pool_channels_kept_total{event="kept"}'
UNPROBED = 'acemq_proxy_pool_channels_kept_total{event="kept_unprobed"}'


def raw(pooled):
    return w.RawClient(pooled.port).handshake(vhost=VHOST_ONE)


def confirms(c, channel, n):
    """The tags of the confirms for n publishes, as the client saw them."""
    acked, nacked, _ = w.collect_confirms(c, channel, n)
    assert not nacked
    return acked


def publish_confirmed(pooled, q, bodies):
    """A raw client publishes bodies with confirms (numbered from 1 for it),
    then leaves without closing its channel."""
    c = raw(pooled)
    c.channel_open(1)
    c.confirm_select(1)
    for b in bodies:
        c.publish(1, q, b)
    assert confirms(c, 1, len(bodies)) == set(range(1, len(bodies) + 1))
    c.close()


def publish_refused_then_close(pooled, confirm):
    """A raw client publishes to an exchange that does not exist and closes
    the channel at once: the broker's 404 must reach it, as directly."""
    c = raw(pooled)
    c.channel_open(1)
    if confirm:
        c.confirm_select(1)
    c.publish(1, "k", b"lost", exchange="acemq-none-" + uuid.uuid4().hex[:8])
    c.send(w.method_frame(1, w.CHANNEL_CLOSE, struct.pack(">H", 200) + w.shortstr("bye") +
                          struct.pack(">HH", 0, 0)))
    f = c.read_frame()
    assert f.method == w.CHANNEL_CLOSE, f
    assert struct.unpack_from(">H", f.args, 0)[0] == 404
    c.send(w.method_frame(1, w.CHANNEL_CLOSE_OK))
    c.close()


def test_confirms_numbered_from_one_on_a_kept_channel(pooled):
    q = fresh_queue(VHOST_ONE)
    used0 = metric(pooled, KEPT_USED)
    for round_ in range(4):
        kept0 = metric(pooled, KEPT)
        c = raw(pooled)
        c.channel_open(1)
        c.confirm_select(1)
        for i in range(3 + round_):
            c.publish(1, q, b"r%d-%d" % (round_, i))
        # Tags 1..n for this client, whatever the channel carried before.
        assert confirms(c, 1, 3 + round_) == set(range(1, 4 + round_))
        if round_ % 2:
            c.send(w.method_frame(1, w.CHANNEL_CLOSE, struct.pack(">H", 200) +
                                  w.shortstr("bye") + struct.pack(">HH", 0, 0)))
            c.expect(w.CHANNEL_CLOSE_OK, 1)
        c.close()
        # Kept (once the broker answered the proxy's qos) for the next round.
        assert support.wait_until(lambda: metric(pooled, KEPT) > kept0, 10)
    assert metric(pooled, KEPT_USED) - used0 >= 3
    assert sorted(drain(q, VHOST_ONE)) == sorted(
        b"r%d-%d" % (r, i) for r in range(4) for i in range(3 + r))


def test_kept_without_asking_only_once_every_publish_is_confirmed(pooled):
    """A client on a kept channel in confirm mode that only published and
    had every publish confirmed leaves it kept without the qos(0); one whose
    publish is not confirmed when it closes (here: to an exchange that does
    not exist) has the broker asked, and the broker's 404 reaches it."""
    q = fresh_queue(VHOST_ONE)
    publish_confirmed(pooled, q, [b"a"])  # a channel in confirm mode kept
    unprobed0 = metric(pooled, UNPROBED)
    publish_confirmed(pooled, q, [b"b", b"c"])
    assert support.wait_until(lambda: metric(pooled, UNPROBED) > unprobed0, 10)
    unprobed1 = metric(pooled, UNPROBED)
    publish_refused_then_close(pooled, confirm=True)
    assert metric(pooled, UNPROBED) == unprobed1
    assert sorted(drain(q, VHOST_ONE)) == [b"a", b"b", b"c"]


def test_client_without_confirms_gets_a_plain_channel(pooled):
    """After channels in confirm mode were kept, a client that publishes
    without selecting confirms sees no basic.ack, and one that selects
    transactions (refused by the broker on a channel in confirm mode) has
    them."""
    q = fresh_queue(VHOST_ONE)
    publish_confirmed(pooled, q, [b"confirmed"])
    c = raw(pooled)
    c.channel_open(1)
    c.publish(1, q, b"plain")
    # A synchronous method after it: anything the broker sent for the
    # publish came before its answer.
    name, count, _ = c.queue_declare(1, q, passive=True)
    assert name == q
    c.close()
    p = connect(pooled.port, VHOST_ONE)
    ch = p.channel()
    ch.tx_select()
    ch.basic_publish("", q, b"in a transaction")
    ch.tx_commit()
    p.close()
    assert sorted(drain(q, VHOST_ONE)) == [b"confirmed", b"in a transaction", b"plain"]


def test_no_ack_reaches_a_client_that_did_not_select(pooled):
    q = fresh_queue(VHOST_ONE)
    for _ in range(2):
        publish_confirmed(pooled, q, [b"x"])
    c = raw(pooled)
    c.channel_open(1)
    for _ in range(5):
        c.publish(1, q, b"y")
    c.queue_declare(1, q, passive=True)
    c.send(w.method_frame(1, w.CHANNEL_CLOSE, struct.pack(">H", 200) + w.shortstr("bye") +
                          struct.pack(">HH", 0, 0)))
    f = c.read_frame()
    assert f.method == w.CHANNEL_CLOSE_OK, f
    c.close()
    assert len(drain(q, VHOST_ONE)) == 7


def test_error_before_the_close_reaches_the_client(pooled):
    """A publish to an exchange that does not exist, then channel.close at
    once: the broker's 404 reaches the client (as it would directly), and
    the channel is not handed on."""
    publish_refused_then_close(pooled, confirm=False)
    # The next clients work on channels of their own.
    q = fresh_queue(VHOST_ONE)
    for i in range(3):
        p = connect(pooled.port, VHOST_ONE)
        ch = p.channel()
        ch.confirm_delivery()
        ch.basic_publish("", q, b"after-%d" % i)
        p.close()
    assert sorted(drain(q, VHOST_ONE)) == [b"after-0", b"after-1", b"after-2"]


def test_consumer_channel_not_handed_on(pooled):
    """A channel that consumed is closed at the broker (its unacknowledged
    delivery requeued), not kept: the next client's consumer gets the
    message again, redelivered."""
    q = fresh_queue(VHOST_ONE)
    p = connect(pooled.port, VHOST_ONE)
    ch = p.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"once")
    m, _, body = ch.basic_get(q, auto_ack=False)
    assert body == b"once" and not m.redelivered
    ch.close()
    p.close()
    p = connect(pooled.port, VHOST_ONE)
    ch = p.channel()
    assert support.wait_until(lambda: ch.queue_declare(q, passive=True).method.message_count == 1,
                              10)
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"once" and m.redelivered
    p.close()
    drain(q, VHOST_ONE)


def test_pika_churn_rides_on_kept_channels(pooled):
    q = fresh_queue(VHOST_ONE)
    used0 = metric(pooled, KEPT_USED)
    for i in range(50):
        p = connect(pooled.port, VHOST_ONE)
        ch = p.channel()
        ch.confirm_delivery()
        ch.basic_publish("", q, b"%d" % i)
        ch.basic_publish("", q, b"%d+" % i)
        p.close()
    assert metric(pooled, KEPT_USED) - used0 >= 45
    bodies = drain(q, VHOST_ONE)
    # pika raises on a publish not confirmed: each of them was.
    assert len(bodies) == 100 and len(set(bodies)) == 100
