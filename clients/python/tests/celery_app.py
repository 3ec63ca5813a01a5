"""The Celery application of test_celery.py, as a user would write it: no
import of mwmq (the `mwmq://` broker URL is enough once the package is
installed), Celery's database result backend on the test's PostgreSQL.

Configured from the environment, which the test sets for itself and the
workers it starts: MWMQ_TEST_BROKER (an mwmq:// URL), MWMQ_TEST_BACKEND
(a db+postgresql+psycopg:// URL), MWMQ_TEST_RUNS (a directory where each
task appends a line per run: what happened, the process, the time).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery

app = Celery("celery_app", broker=os.environ["MWMQ_TEST_BROKER"], backend=os.environ["MWMQ_TEST_BACKEND"])
app.conf.update(
    task_acks_late=True,
    task_default_queue="work",
    worker_prefetch_multiplier=1,
    # A short lease, so that a killed worker's task comes back quickly;
    # the queues under a prefix of their own on the shared mwmq.
    broker_transport_options={"visibility_timeout": 2, "queue_name_prefix": "celery-test."},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
RUNS = Path(os.environ["MWMQ_TEST_RUNS"])


def record(name: str, event: str) -> None:
    with (RUNS / name).open("a") as f:
        f.write(f"{event} {os.getpid()} {time.time():.6f}\n")


@app.task
def add(x: int, y: int) -> int:
    record(f"add-{x}-{y}", "run")
    return x + y


@app.task
def total(values: list[int]) -> int:
    return sum(values)


@app.task
def stamp(name: str) -> float:
    """When it ran."""
    record(name, "run")
    return time.time()


@app.task(bind=True, max_retries=3)
def flaky(self, name: str, failures: int) -> int:  # type: ignore[no-untyped-def]
    """Fails `failures` times (each retried after 0.3 s), then says how many retries it took."""
    record(name, "run")
    if self.request.retries < failures:
        raise self.retry(countdown=0.3)
    return self.request.retries


@app.task
def slow(name: str, seconds: float, once: bool = False) -> str:
    """Takes `seconds` (with `once`, only the first time it runs: a run after
    that is over at once)."""
    again = once and (RUNS / name).exists()
    record(name, "start")
    time.sleep(0 if again else seconds)
    record(name, "end")
    return name
