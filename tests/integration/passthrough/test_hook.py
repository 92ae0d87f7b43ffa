"""Delivery-tag and confirm translation, exercised with the test-hook build.

With ACEMQ_PROXY_TEST_HOOK=1 the acemq-proxy-test binary, on every channel,
swallows every third delivery (basic.deliver / basic.get-ok 3, 6, 9, ...;
acked upstream by the proxy for manual-ack consumers; a swallowed get-ok
becomes get-empty) and answers every fifth basic.publish itself (5, 10, ...
never reach the broker; in confirm mode the proxy acks them).

The client must still see contiguous delivery tags and confirm sequence
numbers, and its acks/nacks must land on the right broker messages.
"""

import pika

import amqp_wire as wire
import support

N_PUBLISH = 20
# publish 5, 10, 15, 20 (message ids 4, 9, 14, 19) are answered by the proxy
STORED_IDS = [i for i in range(N_PUBLISH) if (i + 1) % 5 != 0]
# of those, deliveries 3, 6, 9, 12, 15 are swallowed on the consuming channel
SWALLOWED_IDS = [STORED_IDS[i] for i in range(len(STORED_IDS)) if (i + 1) % 3 == 0]
DELIVERED_IDS = [i for i in STORED_IDS if i not in SWALLOWED_IDS]


def test_expected_id_lists():
    assert STORED_IDS == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 15, 16, 17, 18]
    assert SWALLOWED_IDS == [2, 6, 10, 13, 17]
    assert DELIVERED_IDS == [0, 1, 3, 5, 7, 8, 11, 12, 15, 16, 18]


def publish_through_hook(hook_port, queue):
    """20 confirmed publishes on one channel through the hook proxy, checking
    every sequence number; then the queue holds exactly 16 (seen directly)."""
    c = wire.RawClient(hook_port).handshake()
    try:
        c.channel_open(1)
        c.confirm_select(1)
        for i in range(N_PUBLISH):
            c.publish(1, queue, b"body-%d" % i, {"message_id": str(i), "delivery_mode": 2})
        acked, nacked, frames = wire.collect_confirms(c, 1, N_PUBLISH)
        assert acked == set(range(1, N_PUBLISH + 1)), frames
        assert not nacked
        c.close()
    finally:
        c.close_socket()
    assert support.queue_depth(support.BROKER_PORT, queue) == (len(STORED_IDS), 0)


def test_publish_confirms_every_fifth_answered(hook_port, new_queue):
    queue = new_queue("acemq-it-hook-pub")
    publish_through_hook(hook_port, queue)
    got = support.drain(support.BROKER_PORT, queue)
    assert [int(p.message_id) for p, _ in got] == STORED_IDS
    assert [b for _, b in got] == [b"body-%d" % i for i in STORED_IDS]


def test_publish_confirms_with_pika(hook_port, new_queue, connections):
    queue = new_queue("acemq-it-hook-pub")
    ch = connections(hook_port).channel()
    ch.confirm_delivery()
    for i in range(N_PUBLISH):
        # raises if the confirm for this publish is a nack or never comes
        ch.basic_publish("", queue, b"body-%d" % i, pika.BasicProperties(message_id=str(i)))
    assert support.queue_depth(support.BROKER_PORT, queue) == (len(STORED_IDS), 0)
    assert [int(p.message_id) for p, _ in support.drain(support.BROKER_PORT, queue)] == STORED_IDS


def test_publish_counters_are_per_channel(hook_port, new_queue, connections):
    queue = new_queue("acemq-it-hook-pub")
    conn = connections(hook_port)
    ch1, ch2 = conn.channel(), conn.channel()
    for i in range(10):  # no confirms: the answered publishes just vanish
        ch1.basic_publish("", queue, b"", pika.BasicProperties(message_id="a%d" % i))
        ch2.basic_publish("", queue, b"", pika.BasicProperties(message_id="b%d" % i))
    ch1.basic_qos(prefetch_count=1)  # round trips: the publishes before are done
    ch2.basic_qos(prefetch_count=1)
    ids = [p.message_id for p, _ in support.drain(support.BROKER_PORT, queue)]
    kept = [i for i in range(10) if (i + 1) % 5]
    # per channel order is kept; how the two channels interleave is not fixed
    assert [m for m in ids if m[0] == "a"] == ["a%d" % i for i in kept]
    assert [m for m in ids if m[0] == "b"] == ["b%d" % i for i in kept]
    assert len(ids) == 16


def consume_all(conn, ch, queue, expected, auto_ack=False, prefetch=100):
    got = []
    ch.basic_qos(prefetch_count=prefetch)
    ch.basic_consume(queue, lambda c, m, p, b: got.append((m.delivery_tag, m.redelivered, p.message_id, b)),
                     auto_ack=auto_ack)
    assert support.wait_until(lambda: len(got) >= expected, 15, pump=lambda t: conn.process_data_events(t)), got
    # nothing beyond the expected deliveries shows up
    conn.process_data_events(time_limit=0.5)
    return got


def assert_expected_deliveries(got):
    assert [t for t, _, _, _ in got] == list(range(1, len(DELIVERED_IDS) + 1)), got
    assert [int(m) for _, _, m, _ in got] == DELIVERED_IDS
    assert [b for _, _, _, b in got] == [b"body-%d" % i for i in DELIVERED_IDS]
    assert not any(r for _, r, _, _ in got)


def settle(ch):
    """A synchronous round trip on the channel: everything sent before it
    (acks, nacks) has been processed by the broker."""
    ch.basic_qos(prefetch_count=100)


def assert_queue_empty_after_close(conn, queue):
    conn.close()
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)
    assert support.queue_stats(queue) == (0, 0, 0)


def test_consumer_acks_each(hook_port, new_queue):
    queue = new_queue("acemq-it-hook-con")
    publish_through_hook(hook_port, queue)
    conn = support.connect(hook_port)
    try:
        ch = conn.channel()
        got = consume_all(conn, ch, queue, len(DELIVERED_IDS))
        assert_expected_deliveries(got)
        # all 16 are out; the 5 swallowed are already acked by the proxy
        for tag, _, _, _ in got:
            ch.basic_ack(tag)
        settle(ch)
        assert support.queue_stats(queue) == (0, 0, 1)
        assert_queue_empty_after_close(conn, queue)
    finally:
        support.safe_close(conn)


def test_consumer_acks_multiple(hook_port, new_queue):
    queue = new_queue("acemq-it-hook-con")
    publish_through_hook(hook_port, queue)
    conn = support.connect(hook_port)
    try:
        ch = conn.channel()
        got = consume_all(conn, ch, queue, len(DELIVERED_IDS))
        assert_expected_deliveries(got)
        ch.basic_ack(5, multiple=True)
        settle(ch)
        # client tags 6..11 are still unacked on the broker, nothing else
        assert support.queue_stats(queue) == (0, 6, 1)
        ch.basic_ack(8, multiple=False)
        settle(ch)
        assert support.queue_stats(queue) == (0, 5, 1)
        ch.basic_ack(11, multiple=True)
        settle(ch)
        assert support.queue_stats(queue) == (0, 0, 1)
        assert_queue_empty_after_close(conn, queue)
    finally:
        support.safe_close(conn)


def test_consumer_nacks_land_on_the_right_messages(hook_port, new_queue):
    """nack(requeue=False) dead-letters exactly the messages the client nacked."""
    dlq = new_queue("acemq-it-hook-dlq")
    queue = new_queue("acemq-it-hook-con", arguments={"x-dead-letter-exchange": "",
                                                      "x-dead-letter-routing-key": dlq})
    publish_through_hook(hook_port, queue)
    conn = support.connect(hook_port)
    try:
        ch = conn.channel()
        got = consume_all(conn, ch, queue, len(DELIVERED_IDS))
        assert_expected_deliveries(got)
        ch.basic_nack(2, multiple=False, requeue=False)   # id 1
        ch.basic_nack(6, multiple=True, requeue=False)    # tags 1, 3..6: ids 0, 3, 5, 7, 8
        ch.basic_reject(9, requeue=False)                 # id 15
        for tag in (7, 8, 10, 11):
            ch.basic_ack(tag)
        settle(ch)
        assert support.queue_stats(queue) == (0, 0, 1)
        assert_queue_empty_after_close(conn, queue)
    finally:
        support.safe_close(conn)
    assert support.wait_until(lambda: support.queue_depth(support.BROKER_PORT, dlq)[0] >= 7, 10, interval=0.1)
    dead = sorted(int(p.message_id) for p, _ in support.drain(support.BROKER_PORT, dlq))
    assert dead == [0, 1, 3, 5, 7, 8, 15]


def test_consumer_nack_requeue_redelivers(hook_port, new_queue):
    """Requeued messages come back with fresh contiguous tags; with every
    third delivery still swallowed, everything ends acked and nothing stays."""
    queue = new_queue("acemq-it-hook-con")
    publish_through_hook(hook_port, queue)
    conn = support.connect(hook_port)
    try:
        ch = conn.channel()
        got = consume_all(conn, ch, queue, len(DELIVERED_IDS))
        assert_expected_deliveries(got)
        ch.basic_nack(len(got), multiple=True, requeue=True)
        # the 11 come back as deliveries 17..27 on this channel; 18, 21, 24
        # and 27 are swallowed, so 7 reach the client, tagged 12..18
        assert support.wait_until(lambda: len(got) >= 18, 15, pump=lambda t: conn.process_data_events(t))
        conn.process_data_events(time_limit=0.5)
        again = got[len(DELIVERED_IDS):]
        assert [t for t, _, _, _ in again] == list(range(12, 19)), again
        assert all(r for _, r, _, _ in again), again
        ids = [int(m) for _, _, m, _ in again]
        assert len(set(ids)) == 7 and set(ids) <= set(DELIVERED_IDS), ids
        assert all(b == b"body-%s" % m.encode() for _, _, m, b in again)
        ch.basic_ack(18, multiple=True)
        settle(ch)
        assert support.queue_stats(queue) == (0, 0, 1)
        assert_queue_empty_after_close(conn, queue)
    finally:
        support.safe_close(conn)


def test_auto_ack_consumer(hook_port, new_queue):
    queue = new_queue("acemq-it-hook-con")
    publish_through_hook(hook_port, queue)
    conn = support.connect(hook_port)
    try:
        ch = conn.channel()
        got = consume_all(conn, ch, queue, len(DELIVERED_IDS), auto_ack=True)
        assert_expected_deliveries(got)
        assert support.queue_stats(queue) == (0, 0, 1)
        assert_queue_empty_after_close(conn, queue)
    finally:
        support.safe_close(conn)


def test_basic_get_through_hook(hook_port, new_queue):
    """A swallowed get-ok is answered with get-empty; tags stay contiguous."""
    queue = new_queue("acemq-it-hook-get")
    publish_through_hook(hook_port, queue)
    conn = support.connect(hook_port)
    try:
        ch = conn.channel()
        got, empties = [], 0
        for _ in range(len(STORED_IDS) + 10):
            method, props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                empties += 1
                if support.queue_depth(support.BROKER_PORT, queue)[0] == 0:
                    break
                continue
            got.append((method.delivery_tag, method.redelivered, props.message_id, body))
        assert_expected_deliveries(got)
        assert empties == len(SWALLOWED_IDS) + 1
        ch.basic_ack(4, multiple=True)
        settle(ch)
        assert support.queue_stats(queue) == (0, len(DELIVERED_IDS) - 4, 0)
        for tag in range(5, len(DELIVERED_IDS) + 1):
            ch.basic_ack(tag)
        settle(ch)
        assert support.queue_stats(queue) == (0, 0, 0)
        assert_queue_empty_after_close(conn, queue)
    finally:
        support.safe_close(conn)


def test_separate_consumer_channels_count_separately(hook_port, new_queue):
    q1 = new_queue("acemq-it-hook-con")
    q2 = new_queue("acemq-it-hook-con")
    publish_through_hook(hook_port, q1)
    publish_through_hook(hook_port, q2)
    conn = support.connect(hook_port)
    try:
        ch1, ch2 = conn.channel(), conn.channel()
        got1 = consume_all(conn, ch1, q1, len(DELIVERED_IDS))
        got2 = consume_all(conn, ch2, q2, len(DELIVERED_IDS))
        assert_expected_deliveries(got1)
        assert_expected_deliveries(got2)
        ch1.basic_ack(len(got1), multiple=True)
        ch2.basic_ack(len(got2), multiple=True)
        settle(ch1)
        settle(ch2)
        assert support.queue_stats(q1) == (0, 0, 1)
        assert support.queue_stats(q2) == (0, 0, 1)
    finally:
        support.safe_close(conn)
