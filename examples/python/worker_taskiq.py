"""The taskiq variant: a broker on mwmq's queue `shop.taskiq`, three tries
by taskiq's SmartRetryMiddleware (its delays are mwmq DELAYs).

    taskiq worker worker_taskiq:broker
"""

from __future__ import annotations

from taskiq.middlewares import SmartRetryMiddleware

from mwmq.taskiq import MwmqBroker

import orders

broker = MwmqBroker(orders.MWMQ_URL, queue="shop.taskiq").with_middlewares(
    SmartRetryMiddleware(default_retry_count=3, default_delay=0.5)
)


@broker.task(retry_on_error=True)
def ship(order_id: int) -> None:
    """A plain function: taskiq runs it in a thread."""
    orders.ship(order_id)
