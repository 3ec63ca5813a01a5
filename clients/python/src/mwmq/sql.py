"""Enqueue and acknowledge inside the application's own PostgreSQL
transaction: `mwmq.sql.send(cursor, ...)` calls the SQL function
`mwmq.send` (docs/mwmq.md, "Enqueue in the application's own transaction")
on a DB-API cursor of the queue's database (psycopg 3 or psycopg2), so the
message commits or rolls back with the application's rows. Nothing here
talks RESP, and psycopg is the application's own dependency, not this
package's.

    with conn.transaction():
        cur.execute("INSERT INTO orders ...")
        mwmq.sql.send(cur, "orders", b"order 17 placed", key="order-17")
"""

from __future__ import annotations

from typing import Any

from .commands import Body, body_bytes
from .types import Message

_SEND = (
    "SELECT mwmq.send(%s, %s::bytea, key => %s, delay_ms => %s, receiver => %s, "
    "message_group => %s, priority => %s)"
)
_ACK = "SELECT mwmq.ack(%s, %s, %s)"


def send(
    cursor: Any,
    queue: str,
    body: Body,
    *,
    key: str | None = None,
    delay_ms: int | None = None,
    to: str | None = None,
    group: str | None = None,
    priority: int | None = None,
) -> str:
    """`mwmq.send(...)` in the cursor's transaction: the message's id (as
    text, as Client.send returns it). PostgreSQL's errors are the driver's
    (SQLSTATE 42704 no such queue, 54000 full or too large, 42501 no right)."""
    cursor.execute(_SEND, (queue, body_bytes(body), key, delay_ms or 0, to, group, priority or 0))
    return str(cursor.fetchone()[0])


def ack(cursor: Any, msg: Message | str, id: str | int | None = None, lease: int | None = None) -> bool:
    """`mwmq.ack(...)` in the cursor's transaction: True when the lease was
    current (the delivery is acknowledged if and only if the transaction
    commits)."""
    if isinstance(msg, Message):
        queue, mid, lease = msg.queue, msg.id, msg.lease
    else:
        queue, mid = msg, id
    if mid is None or lease is None:
        raise ValueError("give a Message from recv, or the queue, the message id and the lease")
    cursor.execute(_ACK, (queue, int(mid), lease))
    return bool(cursor.fetchone()[0])
