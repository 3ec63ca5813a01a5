"""The shop's own data and its one job, shared by the web handler (shop.py)
and the three workers: a table of orders in the same PostgreSQL database
as mwmq, and `ship`, the work a worker does for an order.

Configured from the environment: DATABASE (a libpq conninfo of mwmq's
database, as `make run-mq` prints it) and MWMQ_URL (mwmq's address,
redis://127.0.0.1:6380 by default).
"""

from __future__ import annotations

import os

import psycopg

DATABASE = os.environ.get("DATABASE", "")
MWMQ_URL = os.environ.get("MWMQ_URL", "redis://127.0.0.1:6380")

TABLE = """CREATE TABLE shop_orders (
    id bigserial PRIMARY KEY,
    item text NOT NULL,
    via text NOT NULL,
    status text NOT NULL DEFAULT 'new',
    attempts integer NOT NULL DEFAULT 0
)"""


def connect() -> psycopg.Connection:
    if not DATABASE:
        raise SystemExit("DATABASE is not set: the conninfo of mwmq's database (make run-mq prints it)")
    return psycopg.connect(DATABASE)


def ensure_table() -> None:
    """Creates the table of orders unless it exists (a role that may not
    create tables finds it made by whoever may)."""
    with connect() as conn:
        if conn.execute("SELECT to_regclass('shop_orders')").fetchone() == (None,):
            conn.execute(TABLE)


def ship(order_id: int) -> None:
    """The work: counts the attempt (committed whatever happens next), then
    ships the order, or fails for an item named `explode...` (to show
    retries and dead letters)."""
    with connect() as conn:
        with conn.transaction():
            row = conn.execute(
                "UPDATE shop_orders SET attempts = attempts + 1 WHERE id = %s RETURNING item", (order_id,)
            ).fetchone()
        if row is None:
            raise LookupError(f"no order {order_id}")
        if row[0].startswith("explode"):
            raise RuntimeError(f"order {order_id}: {row[0]!r} cannot be shipped")
        conn.execute("UPDATE shop_orders SET status = 'shipped' WHERE id = %s", (order_id,))
