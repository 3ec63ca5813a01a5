"""The Celery variant: the broker is mwmq (`mwmq://`, nothing to import:
installing the mwmq package with its `celery` extra is enough), the results
go to Celery's database backend in the same PostgreSQL.

    celery -A worker_celery worker -P threads -c 4
"""

from __future__ import annotations

from celery import Celery

import orders


def sqlalchemy_url(conninfo: str) -> str:
    """Celery's database backend URL for a libpq conninfo (`host=/tmp/x
    port=5432 user=postgres dbname=mwmq`; a unix socket or a host)."""
    kv = dict(part.split("=", 1) for part in conninfo.split())
    auth = kv.get("user", "postgres") + (f":{kv['password']}" if "password" in kv else "")
    query = "&".join(f"{k}={kv[k]}" for k in ("host", "port") if k in kv)
    return f"db+postgresql+psycopg://{auth}@/{kv.get('dbname', 'postgres')}?{query}"


app = Celery(
    "shop",
    # mwmq:// (mwmqs:// for TLS) from the redis:// form of MWMQ_URL.
    broker=orders.MWMQ_URL.replace("redis", "mwmq", 1) + "//",
    backend=sqlalchemy_url(orders.DATABASE),
)
app.conf.update(
    task_default_queue="shop.celery",
    task_acks_late=True,  # the message stays in mwmq until the task is done
    worker_prefetch_multiplier=1,
    broker_transport_options={"visibility_timeout": 60},
)


@app.task(autoretry_for=(RuntimeError,), max_retries=2, default_retry_delay=0.5)
def ship(order_id: int) -> None:
    """Retried twice after 0.5 s (a countdown: mwmq holds it as a DELAY),
    then a FAILURE in the result backend."""
    orders.ship(order_id)
