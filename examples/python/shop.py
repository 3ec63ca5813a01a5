"""The shop's web handler (the standard library's HTTP server): an order is
stored and its job queued in one PostgreSQL transaction, so a job exists if
and only if its order does.

    POST /orders {"item": "book", "via": "mwmq"}   -> 201 {"id": 17}
    GET  /orders/17                                 -> {"id": 17, "item": "book", "status": "shipped", ...}

`via` chooses the worker (default: `--via`): `mwmq` queues a message on
mwmq's queue `shop.orders` with `mwmq.sql.send`; `celery` and `taskiq`
call the task as usual (`ship.delay(id)`, `await ship.kiq(id)`) inside
`mwmq.kombu.sql_transaction` / `mwmq.taskiq.sql_transaction`, which turn
the send into the same `mwmq.send(...)` in the handler's transaction.

    DATABASE="host=/tmp/mwmq-run.X/pg port=5432 user=postgres dbname=mwmq" python shop.py --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import mwmq
import mwmq.sql

import orders

VIAS = ("mwmq", "celery", "taskiq")
# The largest order a client may post, and the largest id (PostgreSQL's
# bigint): a handler reads no more than it means to store.
MAX_BODY = 16 * 1024
MAX_ITEM = 200
MAX_ID = 2**63 - 1


def create_queues() -> None:
    """The queues the shop sends to, unless they exist. `shop.orders`: three
    deliveries at most, 200 ms then 400 ms between them, then the dead
    letters. (Celery's and taskiq's workers create theirs too.)"""
    with mwmq.Client(orders.MWMQ_URL) as mq:
        mq.create_queue("shop.orders.dead", exist_ok=True)
        mq.create_queue(
            "shop.orders",
            max_deliveries=3,
            dead_letter="shop.orders.dead",
            backoff=(200, 2000),
            exist_ok=True,
        )
        mq.create_queue("shop.celery", exist_ok=True)
        mq.create_queue("shop.taskiq", exist_ok=True)


def place(item: str, via: str) -> int:
    """The order's row and its job, committed together."""
    with orders.connect() as conn, conn.transaction(), conn.cursor() as cur:
        cur.execute("INSERT INTO shop_orders (item, via) VALUES (%s, %s) RETURNING id", (item, via))
        order_id = int(cur.fetchone()[0])
        if via == "mwmq":
            mwmq.sql.send(cur, "shop.orders", json.dumps({"order": order_id}))
        elif via == "celery":
            # Imported here: the mwmq variant runs without Celery and taskiq installed.
            from mwmq import kombu as mwmq_kombu

            from worker_celery import ship

            with mwmq_kombu.sql_transaction(cur):
                ship.delay(order_id)
        else:
            from mwmq import taskiq as mwmq_taskiq

            from worker_taskiq import ship as kiq_ship

            with mwmq_taskiq.sql_transaction(cur):
                asyncio.run(kiq_ship.kiq(order_id))
    return order_id


def order(order_id: int) -> dict[str, Any] | None:
    with orders.connect() as conn:
        row = conn.execute(
            "SELECT id, item, via, status, attempts FROM shop_orders WHERE id = %s", (order_id,)
        ).fetchone()
    return None if row is None else dict(zip(("id", "item", "via", "status", "attempts"), row, strict=True))


class Shop(BaseHTTPRequestHandler):
    via = "mwmq"
    # Seconds a client may take to send its request (a client that sends
    # less than its Content-Length does not hold a thread for ever).
    timeout = 30

    def reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        if self.path != "/orders":
            return self.reply(404, {"error": "POST /orders"})
        # Never read more than an order can be, nor until the client closes:
        # a length that is missing, malformed or too large is refused unread.
        raw = self.headers.get("Content-Length")
        try:
            length = int(raw) if raw is not None else -1
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            status = 411 if raw is None else 413 if length > MAX_BODY else 400
            return self.reply(status, {"error": f"a Content-Length of 0 to {MAX_BODY} bytes"})
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            item, via = str(body["item"]), str(body.get("via", self.via))
        except (ValueError, KeyError, TypeError, RecursionError):
            return self.reply(400, {"error": 'the body is {"item": "...", "via": "mwmq|celery|taskiq"}'})
        if not 0 < len(item) <= MAX_ITEM:
            return self.reply(400, {"error": f"an item is 1 to {MAX_ITEM} characters"})
        if via not in VIAS:
            return self.reply(400, {"error": f"via is one of {', '.join(VIAS)}, not {via!r}"})
        self.reply(201, {"id": place(item, via)})

    def do_GET(self) -> None:
        m = re.fullmatch(r"/orders/([0-9]{1,19})", self.path)
        found = order(int(m.group(1))) if m and int(m.group(1)) <= MAX_ID else None
        if found is None:
            return self.reply(404, {"error": "no such order"})
        self.reply(200, found)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--via", choices=VIAS, default="mwmq", help="the worker of orders that do not say")
    args = p.parse_args()
    orders.ensure_table()
    create_queues()
    Shop.via = args.via
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Shop)
    print(f"the shop listens on http://127.0.0.1:{args.port} (orders go via {args.via})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
