"""Many channels on one connection, many connections at once."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pika
import pytest

import amqp_wire as wire
import support

CHANNEL_MAX = 2047


def test_2047_channels_on_one_connection(endpoint, connections, new_queue):
    queue = new_queue("acemq-it-channels")
    conn = connections(endpoint.port)
    assert conn._impl.params.channel_max == CHANNEL_MAX
    chans = [conn.channel() for _ in range(CHANNEL_MAX)]
    assert sorted(c.channel_number for c in chans) == list(range(1, CHANNEL_MAX + 1))
    assert all(c.is_open for c in chans)
    probe = [chans[0], chans[1], chans[1023], chans[2045], chans[2046]]
    for ch in probe:
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"from channel %d" % ch.channel_number,
                         pika.BasicProperties(message_id=str(ch.channel_number)))
    # each probed channel fetches one message on its own channel number
    got = []
    for ch in probe:
        method, props, body = ch.basic_get(queue, auto_ack=False)
        assert method is not None
        assert method.delivery_tag == 1  # delivery tags are per channel
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    assert sorted(got) == sorted(b"from channel %d" % c.channel_number for c in probe)
    # every channel answers a synchronous method
    for ch in chans[::97] + [chans[-1]]:
        ch.basic_qos(prefetch_count=5)
    # close half of them explicitly, the rest go with the connection
    for ch in chans[::2]:
        ch.close()
    assert conn.is_open
    assert chans[1].queue_declare(queue, passive=True).method.message_count == 0


def channel_open_outcome(port, channel):
    c = wire.RawClient(port).handshake()
    try:
        c.send(wire.method_frame(channel, wire.CHANNEL_OPEN, wire.shortstr("")))
        f = c.read_frame(timeout=10)
        if f.method == wire.CONNECTION_CLOSE:
            close = wire.parse_connection_close(f.args)
            return "connection.close %d" % close["reply_code"], close["reply_text"]
        return "%r on channel %d" % (f.method, f.channel), ""
    finally:
        c.close_socket()


@pytest.mark.parametrize("channel", [CHANNEL_MAX + 1, 65535])
def test_channel_number_above_channel_max_like_broker(channel, direct_port, proxy_port):
    """RabbitMQ limits the number of open channels, not the channel number:
    channel.open on channel_max+1 (or 65535) as the only channel succeeds.
    The proxy gives the same answer."""
    direct = channel_open_outcome(direct_port, channel)
    proxy = channel_open_outcome(proxy_port, channel)
    print("direct: %r\nproxy:  %r" % (direct, proxy))
    assert proxy[0] == direct[0]


def _open(port):
    c = wire.RawClient(port, timeout=30).handshake()
    c.channel_open(1)
    return c


def test_500_concurrent_connections(proxy_port, new_queue):
    queue = new_queue("acemq-it-conns")
    n = 500
    t0 = time.monotonic()
    clients = []
    lock = threading.Lock()

    def open_one(_i):
        c = _open(proxy_port)
        with lock:
            clients.append(c)

    try:
        with ThreadPoolExecutor(50) as ex:
            list(ex.map(open_one, range(n)))
        assert len(clients) == n
        opened = time.monotonic() - t0

        # all 500 are open at once; now each does a confirmed publish
        def work(i):
            c = clients[i]
            c.confirm_select(1)
            c.publish(1, queue, b"conn-%d" % i, {"message_id": str(i)})
            acked, nacked, _ = wire.collect_confirms(c, 1, 1)
            assert acked == {1}
            name, count, consumers = c.queue_declare(1, queue, passive=True)
            assert name == queue

        with ThreadPoolExecutor(50) as ex:
            list(ex.map(work, range(n)))

        with ThreadPoolExecutor(50) as ex:
            list(ex.map(lambda c: c.close(), clients))
    finally:
        for c in clients:
            c.close_socket()
    elapsed = time.monotonic() - t0
    assert elapsed < 60, "500 connections took %.1f s (opening: %.1f s)" % (elapsed, opened)
    got = support.drain(support.BROKER_PORT, queue)
    assert sorted(int(p.message_id) for p, _ in got) == list(range(n))
    assert all(b == b"conn-%s" % p.message_id.encode() for p, b in got)


def test_500_connections_with_pika(proxy_port, new_queue):
    """Same with pika clients opened from a thread pool (a smaller operation)."""
    queue = new_queue("acemq-it-conns")
    n = 500
    conns = []
    lock = threading.Lock()

    def open_one(_i):
        conn = support.connect(proxy_port, heartbeat=0)
        with lock:
            conns.append(conn)

    try:
        with ThreadPoolExecutor(25) as ex:
            list(ex.map(open_one, range(n)))
        assert len(conns) == n

        def publish(i):
            ch = conns[i].channel()
            ch.basic_publish("", queue, b"p%d" % i)
            ch.close()  # a synchronous round trip after the publish

        with ThreadPoolExecutor(25) as ex:
            list(ex.map(publish, range(n)))
    finally:
        with ThreadPoolExecutor(25) as ex:
            list(ex.map(support.safe_close, conns))
    assert support.queue_depth(support.BROKER_PORT, queue) == (n, 0)
