"""mwmq.sql: a message sent and acknowledged inside the application's own
PostgreSQL transaction (psycopg), as the role app_sql that acts as user app."""

from __future__ import annotations

import psycopg
import pytest

import mwmq
import mwmq.sql

from conftest import Site


@pytest.fixture
def app_sql(site: Site) -> str:
    """The conninfo of the role app_sql, allowed to call mwmq.send and mwmq.ack."""
    with psycopg.connect(site.pg.conninfo, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = 'app_sql'").fetchone()
        if not exists:
            admin.execute("CREATE ROLE app_sql LOGIN")
        admin.execute("GRANT USAGE ON SCHEMA mwmq TO app_sql")
        admin.execute(
            "GRANT EXECUTE ON FUNCTION mwmq.send(text, bytea, text, bigint, text, text, integer), "
            "mwmq.ack(text, bigint, bigint) TO app_sql"
        )
    return site.pg.conninfo.replace("user=postgres", "user=app_sql")


def test_send_and_ack_in_the_applications_transaction(client: mwmq.Client, app_sql: str, queue: str):
    client.create_queue(queue)
    with psycopg.connect(app_sql) as conn:
        with conn.transaction(), conn.cursor() as cur:
            mid = mwmq.sql.send(cur, queue, b"\x00\xff order 17", key="order-17", priority=5)
            assert client.length(queue) == 0  # not before COMMIT
        assert client.length(queue) == 1
        with pytest.raises(psycopg.errors.UndefinedObject), conn.transaction(), conn.cursor() as cur:
            mwmq.sql.send(cur, f"{queue}.missing", "x")
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            mwmq.sql.send(cur, queue, "rolled back")
        [m] = client.recv(queue, vt_ms=30_000)
        assert (m.id, m.body, m.sender) == (mid, b"\x00\xff order 17", "app")
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            assert mwmq.sql.ack(cur, m) is True
        with conn.transaction(), conn.cursor() as cur:
            assert mwmq.sql.ack(cur, m.queue, m.id, m.lease) is True
    assert client.length(queue) == 0 and client.ack(m) is False
