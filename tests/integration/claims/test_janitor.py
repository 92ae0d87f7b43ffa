"""The janitor at start: what a kill -9 mid-upload left in the LMDB claim
store (chunks whose payload never got its meta record) is removed before
the listeners open, and the log says what went, chunks and bytes."""
import ctypes
import os
import re
import time
import uuid

from conftest import Proxy, direct

import amqp_wire as wire  # noqa: E402

ORPHANS = re.compile(r"janitor: vhost /: (\d+) orphaned chunks? of claim uploads cut short "
                     r"removed \((\d+) bytes\)")


class MDBVal(ctypes.Structure):
    _fields_ = [("mv_size", ctypes.c_size_t), ("mv_data", ctypes.c_void_p)]


def stored_keys(data, db):
    """The key lengths in one database of the proxy's LMDB environment, read
    with liblmdb the way a second reader process does (32: a payload's meta
    record, 41: a chunk)."""
    lib = ctypes.CDLL("liblmdb.so.0")
    env, txn, cur = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    dbi = ctypes.c_uint()
    k, v = MDBVal(), MDBVal()
    rdonly, mdb_next = 0x20000, 8
    assert lib.mdb_env_create(ctypes.byref(env)) == 0
    try:
        lib.mdb_env_set_maxdbs(env, 128)
        assert lib.mdb_env_open(env, data.encode(), rdonly, 0o600) == 0
        assert lib.mdb_txn_begin(env, None, rdonly, ctypes.byref(txn)) == 0
        try:
            if lib.mdb_dbi_open(txn, db.encode(), 0, ctypes.byref(dbi)) != 0:
                return []  # not created yet
            assert lib.mdb_cursor_open(txn, dbi, ctypes.byref(cur)) == 0
            keys = []
            while lib.mdb_cursor_get(cur, ctypes.byref(k), ctypes.byref(v), mdb_next) == 0:
                keys.append(k.mv_size)
            lib.mdb_cursor_close(cur)
            return keys
        finally:
            lib.mdb_txn_abort(txn)
    finally:
        lib.mdb_env_close(env)


def test_kill9_mid_upload_then_restart_logs_the_orphaned_chunks(vhosts, dirs):
    data = os.path.join(dirs["top"], "data-janitor-" + uuid.uuid4().hex[:6])
    os.makedirs(data)
    # Commits not fsynced: what kill -9 leaves is the same, and the test
    # does not wait on a busy disk.
    p = Proxy(dirs["rules"], data, extra=["--state-sync", "0"])
    q = "acemq-cc-janitor-" + uuid.uuid4().hex[:8]
    try:
        with direct() as d:
            d.channel().queue_declare(q)
        c = wire.RawClient(p.port).handshake()
        c.channel_open(1)
        # 8 MiB announced, 6 MiB sent: the first four 1 MiB chunks go to the
        # store in one commit, and the payload never gets its meta record.
        c.send(wire.method_frame(1, wire.BASIC_PUBLISH, wire.basic_publish_args("", q))
               + wire.content_header_frame(1, 8 << 20))
        chunk = wire.frame(wire.FRAME_BODY, 1, b"j" * (c.frame_max - 8))
        for _ in range((6 << 20) // len(chunk)):
            c.send(chunk)
        deadline = time.monotonic() + 60
        while len(stored_keys(data, "claims//")) < 4:
            assert time.monotonic() < deadline, "the chunks never reached the store"
            time.sleep(0.1)
        p.kill9()
        c.close_socket()
        keys = stored_keys(data, "claims//")
        assert len(keys) >= 4 and set(keys) == {41}, keys  # chunks only
        before = len(p.stderr())
        p.start()
        log = p.stderr()[before:]
        m = ORPHANS.search(log)
        assert m, log
        assert (int(m.group(1)), int(m.group(2))) == (len(keys), len(keys) << 20), m.group(0)
        assert stored_keys(data, "claims//") == []
        # Removed: the next start finds nothing to remove.
        p.stop()
        before = len(p.stderr())
        p.start()
        assert "orphaned chunk" not in p.stderr()[before:]
        with direct() as d:
            ch = d.channel()
            assert ch.queue_declare(q, passive=True).method.message_count == 0
            ch.queue_delete(q)
    finally:
        p.stop()
