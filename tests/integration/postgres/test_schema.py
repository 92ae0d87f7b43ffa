"""The schema as operations.md gives it, created ahead by an operator, and a
role granted only what that page says: the proxy creates nothing and
works."""
import os
import re
import uuid

from conftest import IDEM_Q, Host
from test_shared import BROKER, consume_all, depth, mid, publish

HERE = os.path.dirname(os.path.abspath(__file__))
DOC = os.path.join(HERE, "..", "..", "..", "docs", "operations.md")


def doc_sql():
    """The indented SQL of operations.md's PostgreSQL section."""
    with open(DOC) as f:
        text = f.read()
    section = text[text.index("## PostgreSQL"):]
    block = re.search(r"\n((?:    .*\n|\n)+)", section[section.index("CREATE TABLE") - 200:])
    lines = [ln[4:] for ln in block.group(1).splitlines()]
    return "\n".join(lines)


def test_schema_created_ahead_with_least_privilege(pg, top, fresh):
    db = "acemq_ahead_%s" % uuid.uuid4().hex[:8]
    pg.psql("CREATE DATABASE %s" % db, db="postgres")
    sql = doc_sql().replace("PASSWORD '...'", "PASSWORD 'x'")
    assert "GRANT SELECT, INSERT, UPDATE, DELETE" in sql
    role = "acemq_proxy"
    if pg.psql("SELECT count(*) FROM pg_roles WHERE rolname = '%s'" % role, db="postgres") != \
            [["0"]]:
        sql = sql.replace("CREATE ROLE acemq_proxy LOGIN PASSWORD 'x';", "")
    pg.psql(sql, db=db)
    pg.psql("REVOKE CREATE ON SCHEMA public FROM PUBLIC; "
            "REVOKE CREATE ON DATABASE %s FROM PUBLIC" % db, db=db)
    url = "postgresql://%s:x@127.0.0.1:%d/%s" % (role, pg.port, db)
    h = Host(top, "ahead-%s" % uuid.uuid4().hex[:6], url)
    try:
        k = uuid.uuid4().hex
        publish(BROKER, IDEM_Q, [(b"1", mid(k)), (b"2", mid(k))])
        got = consume_all(h.port, IDEM_Q)
        assert [g[0] for g in got] == [k]
        assert depth(IDEM_Q) == 0
        assert h.metric("acemq_proxy_postgres_operation_errors_total") == 0
        assert pg.psql("SELECT count(*) FROM acemq_idempotency", db=db) == [["1"]]
        assert "schema version 1 created" not in h.proxy.stderr()
    finally:
        h.stop()
