"""taskiq on mwmq's queues (mwmq.taskiq.MwmqBroker), against the shared
mwmq of conftest.py.

taskiq ships no test suite for brokers to run (its own tests drive its
in-memory broker); these are the checks taskiq's broker packages make of
theirs (taskiq-redis's tests/test_broker.py: a kick reaches one of two
listeners, as an AckableMessage), and what acknowledgement means on mwmq:
an ACK empties the queue, a message not acknowledged comes back after its
lease, a message held longer than its lease is renewed and not delivered
again, taskiq's receiver runs tasks and its retry middleware's delays
become DELAY, labels become DELAY and PRIORITY, and `taskiq worker` runs
tasks from the queue and stops on SIGTERM with nothing left.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from taskiq import AckableMessage, AsyncBroker, BrokerMessage
from taskiq.api import run_receiver_task
from taskiq.brokers.inmemory_broker import InmemoryResultBackend
from taskiq.middlewares import SmartRetryMiddleware
from test_sql import app_sql  # noqa: F401  (the fixture)

import mwmq
from mwmq.taskiq import MwmqBroker, send_options, sql_transaction

from conftest import Mwmq, Site

TESTS = Path(__file__).resolve().parent


def message(body: bytes, **labels: Any) -> BrokerMessage:
    return BrokerMessage(task_id=uuid.uuid4().hex, task_name="t", message=body, labels=labels)


async def first(broker: AsyncBroker) -> bytes | AckableMessage:
    """The first message the broker's listen gives."""
    async for m in broker.listen():
        return m
    raise AssertionError("listen ended")


async def cancel(*tasks: asyncio.Task[Any]) -> None:
    for t in tasks:
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t


def until(what: Any, deadline: float = 30.0, why: str = "") -> Any:
    end = time.monotonic() + deadline
    while not (got := what()):
        if time.monotonic() > end:
            pytest.fail(f"not within {deadline} s: {why}")
        time.sleep(0.05)
    return got


def test_a_kick_reaches_one_of_two_listeners_and_ack_acknowledges(
    mq: Mwmq, client: mwmq.Client, queue: str
) -> None:
    async def main() -> None:
        a, b = (MwmqBroker(mq.url("app"), queue=queue, wait_seconds=1) for _ in range(2))
        await a.startup()
        await b.startup()
        listeners = {asyncio.create_task(first(a)), asyncio.create_task(first(b))}
        await a.kick(message(b"hello"))
        done, pending = await asyncio.wait(listeners, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        got = done.pop().result()
        assert isinstance(got, AckableMessage) and got.data == b"hello"
        assert client.length(queue) == 1  # leased until acknowledged
        await got.ack()
        assert client.length(queue) == 0
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in pending)  # the other got nothing
        await cancel(*pending)
        await a.shutdown()
        await b.shutdown()

    asyncio.run(main())


def test_startup_creates_the_dead_letter_queue_first(mq: Mwmq, client: mwmq.Client, queue: str) -> None:
    """QCREATE wants a DEADLETTER queue to exist: startup creates it first,
    so `queue_options={"dead_letter": ...}` works on a fresh mwmq."""

    async def main() -> None:
        options = {"max_deliveries": 2, "dead_letter": f"{queue}.dead"}
        broker = MwmqBroker(mq.url("app"), queue=queue, queue_options=options)
        await broker.startup()
        await broker.shutdown()

    asyncio.run(main())
    info = client.info(queue)
    assert (info.max_deliveries, info.dead_letter) == (2, f"{queue}.dead")
    assert client.length(f"{queue}.dead") == 0


def test_an_unacknowledged_message_comes_back_after_its_lease(
    mq: Mwmq, client: mwmq.Client, queue: str
) -> None:
    """A worker that stops renewing (as one that died) loses the message to
    another once its lease (1 s) is over."""

    async def main() -> None:
        dead = MwmqBroker(mq.url("app"), queue=queue, visibility_timeout=1, lease_renewal=False)
        heir = MwmqBroker(mq.url("app"), queue=queue, wait_seconds=1)
        await dead.startup()
        await heir.startup()
        await dead.kick(message(b"orphan"))
        taken = await asyncio.wait_for(first(dead), 30)
        assert isinstance(taken, AckableMessage)
        again = await asyncio.wait_for(first(heir), 30)
        assert isinstance(again, AckableMessage) and again.data == b"orphan"
        await again.ack()
        assert client.length(queue) == 0
        await taken.ack()  # too late: its lease is over (logged), nothing changes
        await dead.shutdown()
        await heir.shutdown()

    asyncio.run(main())


def test_a_message_held_past_its_lease_is_renewed_not_delivered_again(
    mq: Mwmq, client: mwmq.Client, queue: str
) -> None:
    """Held for 4.5 s against a 2 s lease while another listener waits:
    the broker renews the lease, the other gets nothing (without renewal it
    would get the message after 2 s)."""

    async def main() -> None:
        holder = MwmqBroker(mq.url("app"), queue=queue, visibility_timeout=2)
        other = MwmqBroker(mq.url("app"), queue=queue, wait_seconds=1)
        await holder.startup()
        await other.startup()
        await holder.kick(message(b"long job"))
        held = await asyncio.wait_for(first(holder), 30)
        waiting = asyncio.create_task(first(other))
        await asyncio.sleep(4.5)
        assert not waiting.done()
        assert isinstance(held, AckableMessage)
        await held.ack()
        assert client.length(queue) == 0
        await cancel(waiting)
        await holder.shutdown()
        await other.shutdown()

    asyncio.run(main())


def test_shutdown_gives_back_what_was_not_acknowledged(mq: Mwmq, client: mwmq.Client, queue: str) -> None:
    async def main() -> None:
        broker = MwmqBroker(mq.url("app"), queue=queue, visibility_timeout=3600)
        await broker.startup()
        await broker.kick(message(b"unfinished"))
        await asyncio.wait_for(first(broker), 30)
        await broker.shutdown()

    asyncio.run(main())
    # Visible again at once, not after its hour-long lease.
    [m] = client.recv(queue)
    assert m.body == b"unfinished"
    client.ack(m)


def test_taskiqs_receiver_runs_tasks_and_retries_after_the_delay(mq: Mwmq, queue: str) -> None:
    async def main() -> None:
        broker = (
            MwmqBroker(mq.url("app"), queue=queue, wait_seconds=1)
            .with_result_backend(InmemoryResultBackend())
            .with_middlewares(SmartRetryMiddleware(default_retry_count=3, default_delay=0.3))
        )
        runs: list[float] = []

        @broker.task
        async def add(x: int, y: int) -> int:
            return x + y

        @broker.task(retry_on_error=True)
        async def flaky(failures: int) -> int:
            runs.append(time.monotonic())
            if len(runs) <= failures:
                raise RuntimeError("not yet")
            return len(runs)

        await broker.startup()
        worker = asyncio.create_task(run_receiver_task(broker))
        assert (await (await add.kiq(2, 3)).wait_result(timeout=30)).return_value == 5
        assert (await (await flaky.kiq(2)).wait_result(timeout=30)).return_value == 3
        # Each retry came back after its delay (never earlier).
        assert all(b - a >= 0.3 for a, b in itertools.pairwise(runs))
        await cancel(worker)
        await broker.shutdown()

    asyncio.run(main())


def test_labels_are_delay_and_priority(mq: Mwmq, client: mwmq.Client, queue: str) -> None:
    async def main() -> None:
        broker = MwmqBroker(mq.url("app"), queue=queue)
        await broker.startup()
        for name, priority in (("p1", 1), ("p9", 9), ("none", None), ("p5", 5)):
            labels = {} if priority is None else {"priority": priority}
            await broker.kick(message(name.encode(), **labels))
        msgs = client.recv(queue, count=4)
        assert [m.body for m in msgs] == [b"p9", b"p5", b"p1", b"none"]
        client.ack_many(msgs)
        await broker.kick(message(b"later", delay=3600))
        with pytest.raises(ValueError, match="priority is 0 to 9"):
            await broker.kick(message(b"x", priority=12))
        with pytest.raises(ValueError, match="delay is a number of seconds"):
            await broker.kick(message(b"x", delay="soon"))
        await broker.shutdown()

    asyncio.run(main())
    info = until(lambda: (i := client.info(queue)).delayed == 1 and i, why="QINFO: delayed")
    assert info.ready == 0
    assert send_options({"delay": "0.25", "priority": "0"}) == {"delay_ms": 250, "priority": None}


def test_labels_that_are_no_number_of_seconds_are_refused() -> None:
    """A label from a hostile or careless caller: an infinite or NaN delay
    is refused as any other non-number (inf raised OverflowError, NaN was
    taken as no delay); a huge one is mwmq's longest DELAY."""
    for bad in ("inf", "-inf", "nan", "1e400", float("inf"), float("nan")):
        with pytest.raises(ValueError, match="delay is a number of seconds"):
            send_options({"delay": bad})
    assert send_options({"delay": "1e300"})["delay_ms"] == 7 * 24 * 3600 * 1000


def test_a_message_back_while_held_is_renewed_as_a_delivery_of_its_own(
    mq: Mwmq, client: mwmq.Client, queue: str
) -> None:
    """The message a worker holds comes back to it (given back by hand, with
    the lease the broker holds), and the first delivery's late ACK does not
    end the renewal of the second: a rival waiting through 2.5 leases gets
    nothing (the broker kept its deliveries by id: the rival got it)."""

    async def main() -> None:
        holder = MwmqBroker(mq.url("app"), queue=queue, visibility_timeout=1, wait_seconds=1)
        rival = MwmqBroker(mq.url("app"), queue=queue, wait_seconds=1)
        await holder.startup()
        await rival.startup()
        await holder.kick(message(b"twice"))
        one = await asyncio.wait_for(first(holder), 30)
        [held] = holder._held.values()
        assert client.nack(held, delay_ms=0)
        two = await asyncio.wait_for(first(holder), 30)
        assert isinstance(one, AckableMessage) and isinstance(two, AckableMessage)
        await one.ack()  # too late: that lease was given back (logged)
        waiting = asyncio.create_task(first(rival))
        await asyncio.sleep(2.5)
        assert not waiting.done()
        await two.ack()
        assert client.length(queue) == 0
        await cancel(waiting)
        await holder.shutdown()
        await rival.shutdown()

    asyncio.run(main())


def test_a_listener_without_the_receive_right_is_refused_loudly(
    mq: Mwmq, client: mwmq.Client, queue: str
) -> None:
    """listen raises NoPerm (`taskiq worker` logs it as its worker process
    dies; taskiq restarts a dead worker unless `--max-fails` says not to),
    rather than finding the queue empty."""
    client.create_queue(queue)

    async def main() -> None:
        broker = MwmqBroker(mq.url("sender"), queue=queue, wait_seconds=1)
        await broker.startup()  # may not create the queue: finds it
        with pytest.raises(mwmq.NoPerm, match="receive"):
            await asyncio.wait_for(first(broker), 30)
        await broker.shutdown()

    asyncio.run(main())


def test_a_kick_in_the_applications_transaction(
    mq: Mwmq,
    client: mwmq.Client,
    queue: str,
    app_sql: str,  # noqa: F811
) -> None:
    """Inside sql_transaction, a kick is mwmq.send() in the application's
    transaction: committed with it, or never sent."""
    broker = MwmqBroker(mq.url("app"), queue=queue)

    @broker.task
    async def ship(order: int) -> None: ...

    async def main() -> None:
        await broker.startup()
        # A sync psycopg connection, as a web handler has: the kick runs in the block.
        with psycopg.connect(app_sql) as conn:
            with conn.transaction(force_rollback=True), conn.cursor() as cur, sql_transaction(cur):
                await ship.kiq(16)
            with conn.transaction(), conn.cursor() as cur, sql_transaction(cur):
                await ship.kiq(17)
                assert client.length(queue) == 0
        await broker.shutdown()

    asyncio.run(main())
    [m] = client.recv(queue, count=10)
    assert json.loads(m.body)["args"] == [17]
    client.ack(m)


@pytest.fixture
def taskiq_env(mq: Mwmq, queue: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {
        "MWMQ_TEST_TASKIQ_URL": mq.url("app"),
        "MWMQ_TEST_TASKIQ_QUEUE": queue,
        "MWMQ_TEST_RUNS": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_the_taskiq_worker_command_runs_tasks_from_the_queue(
    site: Site, client: mwmq.Client, queue: str, taskiq_env: dict[str, str], tmp_path: Path
) -> None:
    sys.modules.pop("taskiq_app", None)
    app = importlib.import_module("taskiq_app")
    names = [f"note-{i}" for i in range(5)]

    async def kick() -> None:
        await app.broker.startup()
        for name in names:
            await app.note.kiq(name)
        await app.broker.shutdown()

    asyncio.run(kick())
    cmd = [sys.executable, "-m", "taskiq", "worker", "taskiq_app:broker", "--workers", "1"]
    worker = site.group.start("taskiq-worker", cmd)
    until(lambda: all((tmp_path / n).exists() for n in names), 60, "every task ran")
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.popen.wait(60) == 0
    assert [len((tmp_path / n).read_text().splitlines()) for n in names] == [1] * 5
    assert client.length(queue) == 0
