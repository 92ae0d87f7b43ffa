"""The rabbitmq-c command line tools (amqp-tools) work through the proxy."""

import os
import subprocess

import pytest

import support

MiB = 1024 * 1024
FRAME_MAX = 131072

SIZES = {
    "empty": 0,
    "one": 1,
    "frame_max-8": FRAME_MAX - 8,
    "frame_max+1": FRAME_MAX + 1,
    "1MiB": MiB,
    "16MiB": 16 * MiB,
}


def tool(name, port, *args, input=None, timeout=60):
    argv = [name, "--server", support.HOST, "--port", str(port), "--username", "guest",
            "--password", "guest"] + list(args)
    proc = subprocess.run(argv, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return proc


def check(proc):
    assert proc.returncode == 0, "%r exited %d: %s" % (proc.args, proc.returncode,
                                                        proc.stderr.decode("utf-8", "replace"))
    return proc


@pytest.mark.parametrize("size_name", list(SIZES))
def test_publish_stdin_and_get(size_name, endpoint, new_queue):
    queue = new_queue("acemq-it-tools")
    body = os.urandom(SIZES[size_name])
    check(tool("amqp-publish", endpoint.port, "-r", queue, "-C", "application/x-test", "-p", input=body))
    assert support.queue_depth(support.BROKER_PORT, queue)[0] == 1
    got = check(tool("amqp-get", endpoint.port, "-q", queue)).stdout
    assert len(got) == len(body)
    assert got == body
    # queue is now empty: amqp-get reports that with exit status 2
    empty = tool("amqp-get", endpoint.port, "-q", queue)
    assert empty.returncode == 2 and empty.stdout == b""


@pytest.mark.parametrize("size_name", ["one", "frame_max+1", "1MiB"])
def test_publish_and_consume(size_name, endpoint, new_queue):
    queue = new_queue("acemq-it-tools")
    body = os.urandom(SIZES[size_name])
    check(tool("amqp-publish", endpoint.port, "-r", queue, input=body))
    got = check(tool("amqp-consume", endpoint.port, "-q", queue, "-c", "1", "cat")).stdout
    assert got == body
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)


def test_publish_body_option_with_properties(endpoint, new_queue, connections):
    """amqp-publish -b with headers/content type/encoding/persistent/reply-to:
    what the broker stores is exactly what the tool sent."""
    queue = new_queue("acemq-it-tools")
    check(tool("amqp-publish", endpoint.port, "-r", queue, "-b", "hello from amqp-publish",
               "-C", "text/plain", "-E", "utf-8", "-p", "-t", "reply.here",
               "-H", "x-first: one", "-H", "x-second: two"))
    ch = connections(support.BROKER_PORT).channel()
    method, props, body = ch.basic_get(queue, auto_ack=True)
    assert body == b"hello from amqp-publish"
    assert props.content_type == "text/plain"
    assert props.content_encoding == "utf-8"
    assert props.delivery_mode == 2
    assert props.reply_to == "reply.here"
    assert props.headers == {"x-first": "one", "x-second": "two"}


def test_line_buffered_publish_and_consume_count(endpoint, new_queue):
    queue = new_queue("acemq-it-tools")
    lines = [("line-%03d" % i).encode() for i in range(50)]
    check(tool("amqp-publish", endpoint.port, "-r", queue, "-l", input=b"\n".join(lines) + b"\n"))
    assert support.queue_depth(support.BROKER_PORT, queue)[0] == 50
    # each message (the line with its newline) goes to a separate `cat`;
    # the outputs concatenate in queue order
    got = check(tool("amqp-consume", endpoint.port, "-q", queue, "-c", "50", "-p", "10", "cat")).stdout
    assert got == b"".join(line + b"\n" for line in lines)
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)


def test_declare_and_delete_queue_tools(endpoint):
    queue = support.unique_name("acemq-it-tools-decl")
    try:
        out = check(tool("amqp-declare-queue", endpoint.port, "-q", queue)).stdout
        assert out.strip() == queue.encode()
        assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)
        check(tool("amqp-publish", endpoint.port, "-r", queue, "-b", "x"))
        out = check(tool("amqp-delete-queue", endpoint.port, "-q", queue)).stdout
        assert out.strip() == b"1"
    finally:
        conn = support.connect(support.BROKER_PORT)
        try:
            conn.channel().queue_delete(queue)
        finally:
            support.safe_close(conn)
