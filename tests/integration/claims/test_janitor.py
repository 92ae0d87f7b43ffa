"""The janitor at start: what a kill -9 mid-upload left in the LMDB claim
store is removed before the listeners open, and the log says what went
and how many bytes. A payload of 4 MiB or more is kept in a file of its
own under data_dir/claims/ (nothing of it in LMDB), so what such an
upload leaves is a partial file there; the janitor's sweep of LMDB chunks
without their meta record is tested in tests/unit/test_claims.c."""
import ctypes
import os
import re
import time
import uuid

from conftest import Proxy, direct

import amqp_wire as wire  # noqa: E402

PARTIALS = re.compile(r"janitor: vhost /: (\d+) partial files? of claim uploads cut short "
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


def partial_files(directory):
    """(name, size) of the .partial files in directory."""
    if not os.path.isdir(directory):
        return []
    return [(n, os.path.getsize(os.path.join(directory, n)))
            for n in os.listdir(directory) if n.endswith(".partial")]


def test_kill9_mid_upload_then_restart_removes_the_partial_file(vhosts, dirs):
    data = os.path.join(dirs["top"], "data-janitor-" + uuid.uuid4().hex[:6])
    os.makedirs(data)
    files = os.path.join(data, "claims", "2f")  # the vhost "/" in hex
    p = Proxy(dirs["rules"], data)
    q = "acemq-cc-janitor-" + uuid.uuid4().hex[:8]
    try:
        with direct() as d:
            d.channel().queue_declare(q)
        c = wire.RawClient(p.port).handshake()
        c.channel_open(1)
        # 8 MiB announced, 6 MiB sent: the first 4 MiB go to the payload's
        # file, which never becomes whole.
        c.send(wire.method_frame(1, wire.BASIC_PUBLISH, wire.basic_publish_args("", q))
               + wire.content_header_frame(1, 8 << 20))
        chunk = wire.frame(wire.FRAME_BODY, 1, b"j" * (c.frame_max - 8))
        for _ in range((6 << 20) // len(chunk)):
            c.send(chunk)
        deadline = time.monotonic() + 60
        while not [f for f in partial_files(files) if f[1] >= 4 << 20]:
            assert time.monotonic() < deadline, "the payload's file was never written"
            time.sleep(0.1)
        p.kill9()
        c.close_socket()
        left = partial_files(files)
        assert len(left) == 1 and left[0][1] == 4 << 20, left
        assert stored_keys(data, "claims//") == []  # nothing of it in LMDB
        before = len(p.stderr())
        p.start()
        log = p.stderr()[before:]
        m = PARTIALS.search(log)
        assert m, log
        assert (int(m.group(1)), int(m.group(2))) == (1, 4 << 20), m.group(0)
        assert partial_files(files) == []
        # Removed: the next start finds nothing to remove.
        p.stop()
        before = len(p.stderr())
        p.start()
        assert "cut short" not in p.stderr()[before:]
        with direct() as d:
            ch = d.channel()
            assert ch.queue_declare(q, passive=True).method.message_count == 0
            ch.queue_delete(q)
    finally:
        p.stop()
