"""Minimal AMQP 0-9-1 wire codec and a synchronous raw-socket client.

Used by the tests that need to see (or produce) exact bytes: protocol
headers, malformed frames, raw content headers, pipelined publishes.
Frames are built by hand with struct; field tables reuse pika's encoder.
"""

import socket
import struct
import time

from pika import data as pika_data

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE

# (class_id, method_id)
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
BASIC_PUBLISH = (60, 40)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)

# Basic property flag bits, in wire order.
BASIC_PROPERTY_BITS = [
    ("content_type", 15, "shortstr"),
    ("content_encoding", 14, "shortstr"),
    ("headers", 13, "table"),
    ("delivery_mode", 12, "octet"),
    ("priority", 11, "octet"),
    ("correlation_id", 10, "shortstr"),
    ("reply_to", 9, "shortstr"),
    ("expiration", 8, "shortstr"),
    ("message_id", 7, "shortstr"),
    ("timestamp", 6, "longlong"),
    ("type", 5, "shortstr"),
    ("user_id", 4, "shortstr"),
    ("app_id", 3, "shortstr"),
    ("cluster_id", 2, "shortstr"),
]


class ConnectionClosedError(Exception):
    """The peer closed the TCP connection."""


# --------------------------------------------------------------------------
# encoding


def shortstr(value):
    if isinstance(value, str):
        value = value.encode("utf-8")
    if len(value) > 255:
        raise ValueError("shortstr too long")
    return struct.pack(">B", len(value)) + value


def longstr(value):
    if isinstance(value, str):
        value = value.encode("utf-8")
    return struct.pack(">I", len(value)) + value


def table(value):
    pieces = []
    pika_data.encode_table(pieces, value or {})
    return b"".join(pieces)


def frame(frame_type, channel, payload, end=FRAME_END):
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def method_payload(method, args=b""):
    return struct.pack(">HH", method[0], method[1]) + args


def method_frame(channel, method, args=b""):
    return frame(FRAME_METHOD, channel, method_payload(method, args))


def content_header_payload(body_size, properties=None, class_id=60):
    properties = properties or {}
    flags = 0
    fields = b""
    for name, bit, kind in BASIC_PROPERTY_BITS:
        if name not in properties or properties[name] is None:
            continue
        flags |= 1 << bit
        value = properties[name]
        if kind == "shortstr":
            fields += shortstr(value)
        elif kind == "octet":
            fields += struct.pack(">B", value)
        elif kind == "longlong":
            fields += struct.pack(">Q", value)
        elif kind == "table":
            fields += table(value)
    return struct.pack(">HHQH", class_id, 0, body_size, flags) + fields


def content_header_frame(channel, body_size, properties=None):
    return frame(FRAME_HEADER, channel, content_header_payload(body_size, properties))


def body_frames(channel, body, frame_max):
    chunk = frame_max - 8
    out = []
    for start in range(0, len(body), chunk):
        out.append(frame(FRAME_BODY, channel, body[start:start + chunk]))
    return out


def basic_publish_args(exchange="", routing_key="", mandatory=False, immediate=False):
    bits = (1 if mandatory else 0) | (2 if immediate else 0)
    return struct.pack(">H", 0) + shortstr(exchange) + shortstr(routing_key) + struct.pack(">B", bits)


def publish_frames(channel, routing_key, body, frame_max, properties=None, exchange="", mandatory=False):
    frames = [method_frame(channel, BASIC_PUBLISH, basic_publish_args(exchange, routing_key, mandatory))]
    frames.append(content_header_frame(channel, len(body), properties))
    frames.extend(body_frames(channel, body, frame_max))
    return b"".join(frames)


# --------------------------------------------------------------------------
# decoding


def parse_method(payload):
    class_id, method_id = struct.unpack_from(">HH", payload, 0)
    return (class_id, method_id), payload[4:]


def read_shortstr(buf, offset):
    n = buf[offset]
    return buf[offset + 1:offset + 1 + n], offset + 1 + n


def read_longstr(buf, offset):
    (n,) = struct.unpack_from(">I", buf, offset)
    return buf[offset + 4:offset + 4 + n], offset + 4 + n


def parse_connection_close(args):
    (reply_code,) = struct.unpack_from(">H", args, 0)
    reply_text, off = read_shortstr(args, 2)
    class_id, method_id = struct.unpack_from(">HH", args, off)
    return {
        "reply_code": reply_code,
        "reply_text": reply_text.decode("utf-8", "replace"),
        "class_id": class_id,
        "method_id": method_id,
    }


def parse_connection_start(args):
    major, minor = struct.unpack_from(">BB", args, 0)
    props, off = pika_data.decode_table(args, 2)
    mechanisms, off = read_longstr(args, off)
    locales, off = read_longstr(args, off)
    return {
        "version_major": major,
        "version_minor": minor,
        "server_properties": props,
        "mechanisms": mechanisms,
        "locales": locales,
    }


def parse_connection_tune(args):
    channel_max, frame_max, heartbeat = struct.unpack_from(">HIH", args, 0)
    return {"channel_max": channel_max, "frame_max": frame_max, "heartbeat": heartbeat}


def parse_basic_ack(args):
    delivery_tag, bits = struct.unpack_from(">QB", args, 0)
    return delivery_tag, bool(bits & 1)


def parse_get_ok(args):
    delivery_tag, redelivered = struct.unpack_from(">QB", args, 0)
    exchange, off = read_shortstr(args, 9)
    routing_key, off = read_shortstr(args, off)
    (message_count,) = struct.unpack_from(">I", args, off)
    return {
        "delivery_tag": delivery_tag,
        "redelivered": bool(redelivered & 1),
        "exchange": exchange,
        "routing_key": routing_key,
        "message_count": message_count,
    }


def parse_content_header(payload):
    class_id, weight, body_size, flags = struct.unpack_from(">HHQH", payload, 0)
    return {"class_id": class_id, "weight": weight, "body_size": body_size, "flags": flags}


# --------------------------------------------------------------------------
# client


class Frame(object):
    __slots__ = ("type", "channel", "payload")

    def __init__(self, frame_type, channel, payload):
        self.type = frame_type
        self.channel = channel
        self.payload = payload

    @property
    def method(self):
        if self.type != FRAME_METHOD:
            return None
        return parse_method(self.payload)[0]

    @property
    def args(self):
        return parse_method(self.payload)[1]

    def __repr__(self):
        if self.type == FRAME_METHOD:
            return "Frame(method %r ch=%d len=%d)" % (self.method, self.channel, len(self.payload))
        return "Frame(type=%d ch=%d len=%d)" % (self.type, self.channel, len(self.payload))


class RawClient(object):
    """A blocking AMQP 0-9-1 client speaking directly over a TCP socket."""

    def __init__(self, port, host="127.0.0.1", timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.frame_max = 131072
        self.channel_max = 2047
        self.heartbeat = 0
        self.start = None
        self.tune = None

    # -- io ----------------------------------------------------------------

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("timed out waiting for data")
        self.sock.settimeout(remaining)
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionClosedError("peer closed the connection")
        self.buf += chunk

    def read_exact(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        while len(self.buf) < n:
            self._fill(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_frame(self, timeout=10.0, skip_heartbeats=True):
        deadline = time.monotonic() + timeout
        while True:
            while len(self.buf) < 7:
                self._fill(deadline)
            frame_type, channel, size = struct.unpack_from(">BHI", self.buf, 0)
            while len(self.buf) < 7 + size + 1:
                self._fill(deadline)
            payload = self.buf[7:7 + size]
            end = self.buf[7 + size]
            self.buf = self.buf[8 + size:]
            if end != FRAME_END:
                raise ValueError("bad frame end 0x%02x from peer" % end)
            if frame_type == FRAME_HEARTBEAT and skip_heartbeats:
                continue
            return Frame(frame_type, channel, payload)

    def expect(self, method, channel=None, timeout=10.0):
        f = self.read_frame(timeout)
        if f.method == CONNECTION_CLOSE and method != CONNECTION_CLOSE:
            raise AssertionError("expected %r, got connection.close %r" % (method, parse_connection_close(f.args)))
        if f.method != method or (channel is not None and f.channel != channel):
            raise AssertionError("expected %r on channel %r, got %r" % (method, channel, f))
        return f

    def read_until_eof(self, timeout=10.0):
        """Collect frames until the peer closes the socket.

        Returns (frames, closed) where closed tells whether EOF (or a reset)
        was seen before the timeout.
        """
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                frames.append(self.read_frame(max(deadline - time.monotonic(), 0.001)))
            except (ConnectionClosedError, ConnectionResetError, BrokenPipeError):
                return frames, True
            except socket.timeout:
                return frames, False

    def close_socket(self):
        try:
            self.sock.close()
        except OSError:
            pass

    # -- handshake -----------------------------------------------------------

    def handshake(self, heartbeat=0, frame_max=None, channel_max=None, vhost="/",
                  username="guest", password="guest", capabilities=None, client_properties=None):
        self.send(PROTOCOL_HEADER)
        f = self.expect(CONNECTION_START, 0)
        self.start = parse_connection_start(f.args)
        caps = {
            "publisher_confirms": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "authentication_failure_close": True,
        }
        if capabilities is not None:
            caps = capabilities
        client_props = {"product": "acemq-it-raw", "capabilities": caps}
        client_props.update(client_properties or {})
        response = b"\x00" + username.encode() + b"\x00" + password.encode()
        self.send(method_frame(0, CONNECTION_START_OK,
                               table(client_props) + shortstr("PLAIN") + longstr(response) + shortstr("en_US")))
        f = self.expect(CONNECTION_TUNE, 0)
        self.tune = parse_connection_tune(f.args)
        self.channel_max = channel_max if channel_max is not None else self.tune["channel_max"]
        self.frame_max = frame_max if frame_max is not None else self.tune["frame_max"]
        self.heartbeat = heartbeat
        self.send(method_frame(0, CONNECTION_TUNE_OK,
                               struct.pack(">HIH", self.channel_max, self.frame_max, self.heartbeat)))
        self.send(method_frame(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00"))
        self.expect(CONNECTION_OPEN_OK, 0)
        return self

    def channel_open(self, channel=1):
        self.send(method_frame(channel, CHANNEL_OPEN, shortstr("")))
        self.expect(CHANNEL_OPEN_OK, channel)

    def confirm_select(self, channel=1):
        self.send(method_frame(channel, CONFIRM_SELECT, b"\x00"))
        self.expect(CONFIRM_SELECT_OK, channel)

    def queue_declare(self, channel, queue, passive=False, durable=False, exclusive=False, auto_delete=False):
        bits = (passive << 0) | (durable << 1) | (exclusive << 2) | (auto_delete << 3)
        self.send(method_frame(channel, QUEUE_DECLARE,
                               struct.pack(">H", 0) + shortstr(queue) + struct.pack(">B", bits) + table({})))
        f = self.expect(QUEUE_DECLARE_OK, channel)
        name, off = read_shortstr(f.args, 0)
        message_count, consumer_count = struct.unpack_from(">II", f.args, off)
        return name.decode(), message_count, consumer_count

    def publish(self, channel, routing_key, body, properties=None, exchange="", mandatory=False):
        self.send(publish_frames(channel, routing_key, body, self.frame_max, properties, exchange, mandatory))

    def basic_get(self, channel, queue, no_ack=True):
        """Returns (get_ok_fields, header_payload, body) or None on get-empty."""
        self.send(method_frame(channel, BASIC_GET,
                               struct.pack(">H", 0) + shortstr(queue) + struct.pack(">B", 1 if no_ack else 0)))
        f = self.read_frame()
        if f.method == BASIC_GET_EMPTY:
            return None
        if f.method != BASIC_GET_OK:
            raise AssertionError("expected get-ok/get-empty, got %r" % (f,))
        fields = parse_get_ok(f.args)
        h = self.read_frame()
        assert h.type == FRAME_HEADER, h
        size = parse_content_header(h.payload)["body_size"]
        body = b""
        while len(body) < size:
            b = self.read_frame()
            assert b.type == FRAME_BODY, b
            body += b.payload
        return fields, h.payload, body

    def close(self, timeout=10.0):
        """Polite connection.close / close-ok, then close the socket."""
        try:
            self.send(method_frame(0, CONNECTION_CLOSE, struct.pack(">H", 200) + shortstr("bye") + struct.pack(">HH", 0, 0)))
            deadline = time.monotonic() + timeout
            while True:
                f = self.read_frame(max(deadline - time.monotonic(), 0.001))
                if f.method == CONNECTION_CLOSE_OK:
                    break
        finally:
            self.close_socket()


def find_connection_close(frames):
    for f in frames:
        if f.type == FRAME_METHOD and f.channel == 0 and f.method == CONNECTION_CLOSE:
            return parse_connection_close(f.args)
    return None


def collect_confirms(client, channel, expected, timeout=30.0):
    """Read basic.ack / basic.nack frames on a confirm-mode channel until every
    sequence number in 1..expected is settled.

    Returns (acked, nacked, frames) where acked/nacked are sets of sequence
    numbers (multiple=true expanded against the still-outstanding ones) and
    frames is the list of (method, delivery_tag, multiple) in arrival order.
    Raises AssertionError on a tag that is not outstanding.
    """
    outstanding = set(range(1, expected + 1))
    acked, nacked, frames = set(), set(), []
    deadline = time.monotonic() + timeout
    while outstanding:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("confirms missing for %s" % sorted(outstanding)[:50])
        f = client.read_frame(remaining)
        if f.method == CONNECTION_CLOSE:
            raise AssertionError("connection closed: %r" % parse_connection_close(f.args))
        if f.method not in (BASIC_ACK, BASIC_NACK) or f.channel != channel:
            continue
        tag, multiple = parse_basic_ack(f.args)
        frames.append((f.method, tag, multiple))
        if multiple:
            settled = {t for t in outstanding if t <= tag}
        else:
            if tag not in outstanding:
                raise AssertionError("confirm for unknown or already settled sequence number %d" % tag)
            settled = {tag}
        outstanding -= settled
        (acked if f.method == BASIC_ACK else nacked).update(settled)
    return acked, nacked, frames
