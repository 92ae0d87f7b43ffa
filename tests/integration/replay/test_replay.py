"""Dead letters replayed through the admin endpoint (POST /replay), with a
real RabbitMQ and pika: a thousand dead letters, some claim-checked, moved
back to their original queue at a given rate, each once and intact; none
lost when the proxy is killed mid-replay; a claim check whose payload was
deleted left in the source and reported; the other reasons a message
stays; a cancel; the token; bad input."""
import collections
import os

import pika
import pytest

import support
from conftest import (DLX, EXCHANGE, TOKEN, VHOST, Proxy, body_of, check_stopped,
                      dead_letters, depth, direct, take_all)

WINDOW = 64  # REPLAY_WINDOW: publishes out at once


def test_thousand_replayed_once_intact_at_rate(proxy, queues):
    orig, dlq = queues
    sent = dead_letters(proxy, orig, dlq, 1000)
    assert len(os.listdir(proxy.fs)) == 100  # every tenth is claim-checked
    status, r = proxy.replay(queue=dlq, count=1000, rate=500)
    assert status == 202, r
    assert r["state"] == "running" and r["queued"] == 1000 and r["target"] == "x-death"
    r = proxy.wait_replay(r["id"])
    assert r["state"] == "done", r
    assert (r["taken"], r["moved"], r["skipped"]) == (1000, 1000, 0), r
    assert r["empty"] is False and r["missing"] == []
    # The rate bounds it: the 1000th message is taken 999 / 500 s after the first.
    assert r["ended_at_ms"] - r["started_at_ms"] >= 1990, r
    assert depth(dlq) == 0
    # Through the proxy: the claim checks come back as their payloads.
    c = proxy.connect(VHOST)
    got = take_all(c, orig)
    c.close()
    ids = collections.Counter(m for m, _b, _h in got)
    assert len(got) == 1000 and set(ids) == set(sent), (len(got), ids.most_common(3))
    for mid, body, headers in got:
        assert body == sent[mid], mid
        # They went as they were: their x-death says where they died.
        assert headers["x-death"][0]["queue"] == orig


def test_sigkill_mid_replay_loses_nothing(dirs, queues):
    """The proxy dies (SIGKILL) with the replay half done: what it had not
    acknowledged is back in the dead-letter queue, so every message is in
    the source or the target. Only a publish out at the moment of the kill
    (at most the window) may be in both: the move is at-least-once."""
    orig, dlq = queues
    p = Proxy(dirs["rules"], dirs["data"], dirs["fs"])
    try:
        sent = dead_letters(p, orig, dlq, 1000)
        status, r = p.replay(queue=dlq, count=1000, rate=200)
        assert status == 202, r
        rid = r["id"]

        def halfway():
            return p.request("GET", "/replay/%d" % rid)[1]["moved"] >= 300
        assert support.wait_until(halfway, 60, interval=0.1)
        p.kill9()
    finally:
        p.stop()
    # The broker gives back the unacknowledged once it sees the socket close.
    c = direct()
    assert support.wait_until(lambda: depth(dlq) + depth(orig) >= 1000, 20)
    source = take_all(c, dlq)
    target = take_all(c, orig)
    c.close()
    s_ids = collections.Counter(m for m, _b, _h in source)
    t_ids = collections.Counter(m for m, _b, _h in target)
    assert max(s_ids.values()) == 1 and max(t_ids.values()) == 1
    assert set(s_ids) | set(t_ids) == set(sent)  # none lost
    both = set(s_ids) & set(t_ids)
    assert len(source) + len(target) == 1000 + len(both)
    print("sigkill mid-replay: %d in the source, %d in the target, %d in both"
          % (len(source), len(target), len(both)))
    assert len(both) <= WINDOW, len(both)
    assert 300 <= len(target) < 1000 and len(source) > 0, (len(source), len(target))


def test_deleted_payload_stays_and_is_reported(proxy, queues):
    orig, dlq = queues
    before = set(os.listdir(proxy.fs))
    sent = dead_letters(proxy, orig, dlq, 20, claimed=lambda i: i % 4 == 0)
    keys = sorted(set(os.listdir(proxy.fs)) - before)
    assert len(keys) == 5
    gone = keys[:2]
    for k in gone:
        os.remove(os.path.join(proxy.fs, k))
    status, r = proxy.replay(queue=dlq, count=100, rate=1000)
    assert status == 202, r
    r = proxy.wait_replay(r["id"])
    assert r["state"] == "done" and r["empty"] is True, r
    assert (r["taken"], r["moved"], r["skipped"]) == (20, 18, 2), r
    assert r["skipped_by"]["payload_missing"] == 2, r
    assert sorted(m["key"] for m in r["missing"]) == gone
    missing_ids = {m["message_id"] for m in r["missing"]}
    # The two stay in the source as they were: references to what is gone.
    c = direct()
    left = take_all(c, dlq)
    c.close()
    assert {m for m, _b, _h in left} == missing_ids
    assert sorted(b[3:].decode() for _m, b, _h in left) == gone
    assert all(b[:3] == b"\xac\x01\x01" for _m, b, _h in left)
    c = proxy.connect(VHOST)
    got = take_all(c, orig)
    c.close()
    assert {m: b for m, b, _h in got} == {m: b for m, b in sent.items() if m not in missing_ids}


def test_what_cannot_move_stays_counted(proxy, queues):
    """No x-death, an x-death whose exchange is gone, one whose routing key
    routes nowhere (returned): each stays in the source, counted; a target
    given takes every message there instead."""
    orig, dlq = queues
    c = direct()
    ch = c.channel()
    ch.confirm_delivery()

    def death(exchange, key):
        return {"x-death": [{"count": 1, "reason": "rejected", "queue": orig,
                             "exchange": exchange, "routing-keys": [key]}]}
    cases = {"plain": None, "gone": death("replay-no-such-x", orig),
             "nowhere": death(EXCHANGE, "replay-routes-nowhere"), "ok": death(EXCHANGE, orig)}
    for mid, headers in cases.items():
        ch.basic_publish("", dlq, mid.encode(), pika.BasicProperties(message_id=mid,
                                                                     headers=headers))
    c.close()
    status, r = proxy.replay(queue=dlq, count=10)
    assert status == 202, r
    r = proxy.wait_replay(r["id"])
    assert (r["state"], r["taken"], r["moved"], r["empty"]) == ("done", 4, 1, True), r
    by = r["skipped_by"]
    assert (by["no_x_death"], by["no_exchange"], by["returned"]) == (1, 1, 1), r
    c = direct()
    assert sorted(m for m, _b, _h in take_all(c, orig)) == ["ok"]
    c.close()
    assert depth(dlq) == 3
    # To a target given: all three go there, x-death or not.
    other = support.unique_name("replay-other")
    c = direct()
    c.channel().queue_declare(other, durable=True)
    c.close()
    try:
        status, r = proxy.replay(queue=dlq, count=3, rate=10000, exchange="",
                                 routing_key=other)
        assert status == 202, r
        assert r["target"] == {"exchange": "", "routing_key": other}
        r = proxy.wait_replay(r["id"])
        assert (r["state"], r["moved"], r["skipped"]) == ("done", 3, 0), r
        c = direct()
        assert sorted(m for m, _b, _h in take_all(c, other)) == ["gone", "nowhere", "plain"]
        c.close()
    finally:
        c = direct()
        c.channel().queue_delete(other)
        c.close()


def test_cancel_stops_it(proxy, queues):
    orig, dlq = queues
    dead_letters(proxy, orig, dlq, 300, claimed=lambda i: False)
    status, r = proxy.replay(queue=dlq, count=300, rate=50)
    assert status == 202, r
    rid = r["id"]
    assert support.wait_until(lambda: proxy.request("GET", "/replay/%d" % rid)[1]["moved"] >= 20,
                              30, interval=0.1)
    status, r = proxy.request("DELETE", "/replay/%d" % rid)
    assert status == 200 and r["state"] == "cancelled", r
    assert r["skipped"] == 0 and r["moved"] == r["taken"] < 300, r
    moved = r["moved"]
    # Nothing moves after the cancel; what was taken settled before it ended.
    assert depth(orig) == moved and depth(dlq) == 300 - moved
    status, again = proxy.request("DELETE", "/replay/%d" % rid)
    assert status == 409 and "error" in again
    status, listed = proxy.request("GET", "/replay")
    assert status == 200 and any(x["id"] == rid and x["state"] == "cancelled"
                                 for x in listed["replays"])
    assert depth(orig) == moved


def test_every_route_needs_the_token(proxy, queues):
    _orig, dlq = queues
    routes = [("GET", "/replay", None), ("POST", "/replay", {"queue": dlq, "count": 1}),
              ("GET", "/replay/1", None), ("DELETE", "/replay/1", None)]
    for method, path, body in routes:
        for token in (None, "wrong-" + TOKEN):
            status, _ = proxy.request(method, path, dict(body, vhost=VHOST) if body else None,
                                      token=token)
            assert status == 401, (method, path, token, status)


@pytest.mark.parametrize("raw, code, why", [
    ("{", 400, "not JSON"),
    ("[1, 2]", 400, "JSON object"),
    ('{"vhost": "%s", "queue": "q", "count": 1} x' % VHOST, 400, "not JSON"),
    ('{"vhost": "%s", "queue": "q", "count": 1}\x00 x' % VHOST, 400, "not JSON"),
    ("", 400, "not JSON"),
    ('{"vhost": "%s", "queue": "q"}' % VHOST, 400, "required"),
    ('{"queue": "q", "count": 1}', 400, "required"),
    ('{"vhost": "%s", "queue": "q", "count": 0}' % VHOST, 400, "count"),
    ('{"vhost": "%s", "queue": "q", "count": 100001}' % VHOST, 400, "count"),
    ('{"vhost": "%s", "queue": "q", "count": 1.5}' % VHOST, 400, "count"),
    ('{"vhost": "%s", "queue": "q", "count": "10"}' % VHOST, 400, "count"),
    ('{"vhost": "%s", "queue": "q", "count": 1, "rate": 0}' % VHOST, 400, "rate"),
    ('{"vhost": "%s", "queue": "q", "count": 1, "rate": 1e9}' % VHOST, 400, "rate"),
    ('{"vhost": "%s", "queue": "", "count": 1}' % VHOST, 400, "queue"),
    ('{"vhost": "%s", "queue": "%s", "count": 1}' % (VHOST, "q" * 256), 400, "queue"),
    ('{"vhost": "%s", "queue": "q", "count": 1, "exchange": 7}' % VHOST, 400, "exchange"),
    ('{"vhost": "%s", "queue": "q", "count": 1, "limit": 7}' % VHOST, 400, "unknown"),
    ('{"vhost": "acemq-replay-no-such-vhost", "queue": "q", "count": 1}', 404, "vhost"),
    ('{"vhost": "%s", "queue": "replay-no-such-queue", "count": 1}' % VHOST, 404, "queue"),
])
def test_bad_input_4xx(proxy, raw, code, why):
    status, r = proxy.request("POST", "/replay", raw=raw)
    assert status == code, (raw, status, r)
    assert why in r["error"], r


def test_bad_targets_and_ids_4xx(proxy, queues):
    _orig, dlq = queues
    status, r = proxy.replay(queue=dlq, count=1, exchange="replay-no-such-x")
    assert status == 404 and "exchange" in r["error"], r
    status, r = proxy.request("POST", "/replay", raw="{" + " " * 5000 + "}")
    assert status == 413, r
    for path in ("/replay/999999", "/replay/abc", "/replay/0", "/replay/-1", "/replay/"):
        for method in ("GET", "DELETE"):
            status, r = proxy.request(method, path)
            assert status == 404, (method, path, status, r)
    status, r = proxy.request("PUT", "/replay", {})
    assert status == 405
    # One replay of a queue at a time.
    c = direct()
    ch = c.channel()
    for i in range(20):
        ch.basic_publish("", dlq, b"x", pika.BasicProperties(message_id="x%d" % i))
    c.close()
    status, r = proxy.replay(queue=dlq, count=20, rate=2)
    assert status == 202, r
    status, again = proxy.replay(queue=dlq, count=20)
    assert status == 409 and "runs already" in again["error"], again
    status, r = proxy.request("DELETE", "/replay/%d" % r["id"])
    assert status == 200 and r["state"] == "cancelled", r
    # Alive and answering after all of it.
    status, _ = proxy.request("GET", "/replay")
    assert status == 200
