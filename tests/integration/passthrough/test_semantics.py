"""AMQP features behave through the proxy exactly as against the broker."""

import pika
import pika.exceptions
import pytest

import amqp_wire as wire
import support


# -- publisher confirms -------------------------------------------------------


def test_confirms_blocking(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-confirm")
    ch = connections(endpoint.port).channel()
    ch.confirm_delivery()
    for i in range(1000):
        # raises NackError/UnroutableError unless the broker acked it
        ch.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(message_id=str(i)), mandatory=True)
    assert support.queue_depth(support.BROKER_PORT, queue) == (1000, 0)
    got = support.drain(support.BROKER_PORT, queue)
    assert [p.message_id for p, _ in got] == [str(i) for i in range(1000)]
    assert [b for _, b in got] == [b"m%d" % i for i in range(1000)]


def test_confirms_pipelined_sequence_numbers(endpoint, new_queue):
    """2000 publishes written back to back; every sequence number 1..2000 is
    acked exactly once."""
    queue = new_queue("acemq-it-confirm")
    n = 2000
    c = wire.RawClient(endpoint.port).handshake()
    try:
        c.channel_open(1)
        c.confirm_select(1)
        batch = b"".join(wire.publish_frames(1, queue, b"body-%d" % i, c.frame_max, {"message_id": str(i)})
                         for i in range(n))
        c.send(batch)
        acked, nacked, frames = wire.collect_confirms(c, 1, n)
        assert acked == set(range(1, n + 1))
        assert not nacked
        tags = [t for _, t, _ in frames]
        assert tags == sorted(tags), "confirms out of order"
        c.close()
    finally:
        c.close_socket()
    assert support.queue_depth(support.BROKER_PORT, queue) == (n, 0)


def test_confirms_on_several_channels(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-confirm")
    conn = connections(endpoint.port)
    chans = [conn.channel() for _ in range(5)]
    for ch in chans:
        ch.confirm_delivery()
    for i in range(40):
        chans[i % 5].basic_publish("", queue, b"x", pika.BasicProperties(message_id=str(i)))
    assert support.queue_depth(support.BROKER_PORT, queue) == (40, 0)


# -- transactions -------------------------------------------------------------


def test_tx_commit_and_rollback(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-tx")
    ch = connections(endpoint.port).channel()
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", queue, b"rolled-back-%d" % i)
    # nothing visible before the transaction ends
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)
    ch.tx_rollback()
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)
    for i in range(2):
        ch.basic_publish("", queue, b"committed-%d" % i)
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)
    ch.tx_commit()
    got = [b for _, b in support.drain(support.BROKER_PORT, queue)]
    assert got == [b"committed-0", b"committed-1"]


def test_tx_ack_rollback_keeps_message(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-tx")
    pub = connections(support.BROKER_PORT).channel()
    pub.confirm_delivery()
    pub.basic_publish("", queue, b"keep-me")
    conn = connections(endpoint.port)
    ch = conn.channel()
    ch.tx_select()
    method, _, body = ch.basic_get(queue, auto_ack=False)
    assert body == b"keep-me"
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()
    conn.close()
    # the rolled back ack did not happen: the message is requeued on close
    method, _, body = pub.basic_get(queue, auto_ack=True)
    assert body == b"keep-me" and method.redelivered is True


# -- basic.get ----------------------------------------------------------------


def test_basic_get_and_get_empty(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-get")
    ch = connections(endpoint.port).channel()
    assert ch.basic_get(queue, auto_ack=True) == (None, None, None)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", queue, b"g%d" % i)
    counts, tags, bodies = [], [], []
    for _ in range(3):
        method, _, body = ch.basic_get(queue, auto_ack=False)
        counts.append(method.message_count)
        tags.append(method.delivery_tag)
        bodies.append(body)
    assert counts == [2, 1, 0]
    assert tags == [1, 2, 3]
    assert bodies == [b"g0", b"g1", b"g2"]
    assert ch.basic_get(queue, auto_ack=True) == (None, None, None)
    ch.basic_ack(3, multiple=True)
    assert support.queue_stats(queue)[:2] == (0, 0)


def test_channel_error_is_relayed(endpoint, connections):
    conn = connections(endpoint.port)
    ch = conn.channel()
    missing = support.unique_name("acemq-it-missing")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare(missing, passive=True)
    assert exc.value.reply_code == 404
    assert exc.value.reply_text == "NOT_FOUND - no queue '%s' in vhost '/'" % missing
    # the connection survives a channel error; the channel number can be reused
    ch2 = conn.channel()
    assert ch2.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    assert conn.is_open


# -- mandatory / basic.return ---------------------------------------------------


def test_mandatory_unroutable_returned(endpoint, connections):
    conn = connections(endpoint.port)
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda c, method, props, body: returned.append((method, props, body)))
    key = support.unique_name("acemq-it-nowhere")
    ch.basic_publish("", key, b"returned body", pika.BasicProperties(message_id="ret-1", headers={"h": 1}),
                     mandatory=True)
    assert support.wait_until(lambda: returned, 10, pump=lambda t: conn.process_data_events(t))
    method, props, body = returned[0]
    assert method.reply_code == 312
    assert method.reply_text == "NO_ROUTE"
    assert method.exchange == ""
    assert method.routing_key == key
    assert body == b"returned body"
    assert props.message_id == "ret-1" and props.headers == {"h": 1}
    # non-mandatory publishes to nowhere are silently dropped
    ch.basic_publish("", key, b"dropped")
    conn.process_data_events(0.3)
    assert len(returned) == 1


def test_mandatory_unroutable_in_confirm_mode(endpoint, connections):
    ch = connections(endpoint.port).channel()
    ch.confirm_delivery()
    key = support.unique_name("acemq-it-nowhere")
    with pytest.raises(pika.exceptions.UnroutableError) as exc:
        ch.basic_publish("", key, b"unroutable", mandatory=True)
    (msg,) = exc.value.messages
    assert msg.method.reply_code == 312
    assert msg.method.routing_key == key
    assert msg.body == b"unroutable"
    # the channel stays usable and later confirms still line up
    ch.basic_publish("", key, b"not mandatory")


# -- reject / nack --------------------------------------------------------------


def test_reject_requeue_redelivers(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-reject")
    ch = connections(endpoint.port).channel()
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"again", pika.BasicProperties(message_id="r1"))
    method, props, body = ch.basic_get(queue, auto_ack=False)
    assert method.redelivered is False
    ch.basic_reject(method.delivery_tag, requeue=True)
    method2, props2, body2 = ch.basic_get(queue, auto_ack=False)
    assert method2 is not None
    assert method2.redelivered is True
    assert method2.delivery_tag == method.delivery_tag + 1
    assert (props2.message_id, body2) == ("r1", b"again")
    ch.basic_reject(method2.delivery_tag, requeue=False)
    assert ch.basic_get(queue) == (None, None, None)
    assert support.queue_stats(queue)[:2] == (0, 0)


def test_nack_multiple_requeue(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-nack")
    conn = connections(endpoint.port)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", queue, b"n%d" % i)
    ch.basic_qos(prefetch_count=10)
    seen = []
    ch.basic_consume(queue, lambda c, m, p, b: seen.append((m.delivery_tag, m.redelivered, b)))
    assert support.wait_until(lambda: len(seen) == 3, 10, pump=lambda t: conn.process_data_events(t))
    assert seen == [(1, False, b"n0"), (2, False, b"n1"), (3, False, b"n2")]
    ch.basic_nack(3, multiple=True, requeue=True)
    assert support.wait_until(lambda: len(seen) == 6, 10, pump=lambda t: conn.process_data_events(t))
    assert seen[3:] == [(4, True, b"n0"), (5, True, b"n1"), (6, True, b"n2")]
    ch.basic_nack(5, multiple=True, requeue=False)
    ch.basic_ack(6)
    conn.process_data_events(0)
    ch.basic_qos(prefetch_count=10)  # round trip: the acks above are processed
    assert support.queue_stats(queue) == (0, 0, 1)


# -- direct reply-to ------------------------------------------------------------


def test_direct_reply_to_rpc(endpoint, connections, new_queue):
    rpc_queue = new_queue("acemq-it-rpc")
    client = connections(endpoint.port)
    server = connections(endpoint.port)
    cch = client.channel()
    sch = server.channel()
    replies = []
    cch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append((p, b)), auto_ack=True)
    for i in range(5):
        cch.basic_publish("", rpc_queue, b"request-%d" % i,
                          pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c%d" % i))
    handled = []

    def serve(_t):
        method, props, body = sch.basic_get(rpc_queue, auto_ack=True)
        if method is not None:
            assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
            handled.append(props.reply_to)
            sch.basic_publish("", props.reply_to, body.replace(b"request", b"reply"),
                              pika.BasicProperties(correlation_id=props.correlation_id))
        client.process_data_events(0.05)

    assert support.wait_until(lambda: len(replies) == 5, 15, pump=serve)
    assert [(p.correlation_id, b) for p, b in replies] == [("c%d" % i, b"reply-%d" % i) for i in range(5)]
    assert len(set(handled)) == 1


def test_reply_to_without_consumer_rejected(endpoint, connections):
    ch = connections(endpoint.port).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_publish("", "acemq-it-nowhere", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        ch.queue_declare("", exclusive=True)  # round trip so the error arrives
    assert exc.value.reply_code == 406


# -- consumer cancel notification ------------------------------------------------


def test_consumer_cancel_notification(endpoint, connections, direct_port):
    queue = support.unique_name("acemq-it-cancel")
    conn = connections(endpoint.port)
    ch = conn.channel()
    ch.queue_declare(queue)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method))
    tag = ch.basic_consume(queue, lambda *a: None)
    admin = connections(direct_port).channel()
    admin.queue_delete(queue)
    assert support.wait_until(lambda: cancelled, 10, pump=lambda t: conn.process_data_events(t))
    assert cancelled[0].consumer_tag == tag
    # channel and connection still usable
    assert ch.is_open and conn.is_open
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


def test_client_cancel_consumer(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-cancel")
    conn = connections(endpoint.port)
    ch = conn.channel()
    tag = ch.basic_consume(queue, lambda *a: None, consumer_tag="acemq-ctag")
    assert tag == "acemq-ctag"
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 1)
    ch.basic_cancel(tag)
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)
