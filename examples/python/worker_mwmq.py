"""The worker of mwmq's own queue `shop.orders`, run by the package's
worker (mwmq.Worker):

    python -m mwmq worker worker_mwmq:handle --queue shop.orders

A handler that returns is ACKed; one that raises is NACKed, and the
queue's settings (shop.py creates it) decide the rest: BACKOFF waits before
the next try, MAXDELIVERIES 3 moves the message to `shop.orders.dead`.
"""

from __future__ import annotations

import mwmq

import orders


def handle(msg: mwmq.Message) -> None:
    orders.ship(int(msg.json()["order"]))
