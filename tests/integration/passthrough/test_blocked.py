"""connection.blocked / connection.unblocked reach the client (memory alarm)."""

import support


def set_watermark(value):
    support.rabbitmqctl("set_vm_memory_high_watermark", value)


def test_blocked_and_unblocked_notifications(direct_port, proxy_port, new_queue, connections):
    queue = new_queue("acemq-it-blocked")
    sides = {}
    for name, port in (("direct", direct_port), ("proxy", proxy_port)):
        conn = connections(port)
        events = []
        conn.add_on_connection_blocked_callback(
            lambda c, frame, ev=events: ev.append(("blocked", frame.method.reason)))
        conn.add_on_connection_unblocked_callback(
            lambda c, frame, ev=events: ev.append(("unblocked", None)))
        sides[name] = {"conn": conn, "ch": conn.channel(), "events": events, "published": 0}

    def pump(_t):
        for s in sides.values():
            s["conn"].process_data_events(0.05)

    def publish_until_blocked(_t):
        # RabbitMQ 3.10 blocks a connection (and notifies it) on its first
        # publish after the alarm went off, so keep publishing until notified.
        for s in sides.values():
            if not s["events"]:
                s["ch"].basic_publish("", queue, b"during-alarm")
                s["published"] += 1
        pump(_t)

    try:
        set_watermark("0.00000001")
        ok = support.wait_until(lambda: all(s["events"] for s in sides.values()), 20,
                                interval=0.2, pump=publish_until_blocked)
        assert ok, {k: s["events"] for k, s in sides.items()}
    finally:
        set_watermark("0.4")
    assert support.wait_until(lambda: all(len(s["events"]) >= 2 for s in sides.values()), 20,
                              interval=0.1, pump=pump), {k: s["events"] for k, s in sides.items()}
    for name, s in sides.items():
        assert s["events"] == [("blocked", "low on memory"), ("unblocked", None)], name
        assert s["conn"].is_open, name
    # everything published while blocked is delivered once the alarm clears
    total = sum(s["published"] for s in sides.values())
    for s in sides.values():
        s["ch"].confirm_delivery()
        s["ch"].basic_publish("", queue, b"after-alarm")
    assert support.queue_depth(direct_port, queue)[0] == total + 2
