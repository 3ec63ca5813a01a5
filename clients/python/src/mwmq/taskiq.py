"""taskiq's broker for mwmq: `MwmqBroker(url, queue=...)` sends each task
as one mwmq message and runs what a worker receives with its lease held.

    from mwmq.taskiq import MwmqBroker
    broker = MwmqBroker("mwmq://app:secret@127.0.0.1:6380", queue="tasks")

    @broker.task
    async def resize(path: str) -> None: ...

    # taskiq worker app:broker        (the worker)
    # await resize.kiq("17.jpg")      (the application, after broker.startup())

- **kick** is a SEND of taskiq's message to the queue; the task's labels
  `delay` (seconds, taskiq's convention: SmartRetryMiddleware retries with
  it) and `priority` (0-9, higher first) become `DELAY` and `PRIORITY`;
- **listen** RECVs with `WAIT` and yields each message as an
  `AckableMessage`, leased for `visibility_timeout` seconds; taskiq calls its
  `ack` (an ACK) when the task is done (or when received, saved: the task's
  `ack_type`);
- **leases held as long as the work**: the broker TOUCHes what it has
  handed out and not yet seen acknowledged every third of
  `visibility_timeout`, so a task longer than the lease is not delivered
  twice while its worker lives; a worker that dies stops renewing and its
  tasks come back after `visibility_timeout`. At `shutdown`, what was handed
  out and not acknowledged (prefetched, or cut short) is given back at once
  (NACK);
- **in the application's transaction**: inside `with
  mwmq.taskiq.sql_transaction(cursor):` a kick (`await task.kiq(...)`) is a
  `SELECT mwmq.send(...)` on that DB-API cursor of mwmq's database (sync:
  psycopg 3 or psycopg2), committed or rolled back with the application's
  rows (the queue must exist: the workers' startup creates it);
- **startup** creates the queue unless it exists (`queue_options`: QCREATE's
  settings, such as `max_deliveries=5, dead_letter="tasks.dead"`), and its
  dead-letter queue first, which QCREATE wants to exist.

A task that raises is a result in taskiq, not a failure of the message: it
is acknowledged as any other (taskiq's retry middlewares send it again). The
result backend is the application's choice (taskiq's own, a database).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import redis.exceptions as rex
from taskiq import AckableMessage, AsyncBroker, BrokerMessage

from . import sql
from .aio import AsyncClient
from .errors import MwmqError, NoPerm
from .types import Message

logger = logging.getLogger(__name__)

# mwmq's longest DELAY (crates/mwmq/src/command.rs: MAX_DELAY_MS).
MAX_DELAY_MS = 7 * 24 * 3600 * 1000


# The cursor of sql_transaction's block, if any.
_SQL_CURSOR: ContextVar[Any] = ContextVar("mwmq_taskiq_sql_cursor", default=None)


@contextlib.contextmanager
def sql_transaction(cursor: Any) -> Iterator[None]:
    """Within the block (and the coroutines it runs, `asyncio.run(...)`
    included: they inherit the context), MwmqBroker's kicks go into
    `cursor`'s transaction as `mwmq.send(...)` in SQL instead of a SEND over
    RESP: visible to workers once it commits, gone if it rolls back."""
    token = _SQL_CURSOR.set(cursor)
    try:
        yield
    finally:
        _SQL_CURSOR.reset(token)


def send_options(labels: dict[str, Any]) -> dict[str, int | None]:
    """SEND's DELAY and PRIORITY from a task's labels (`delay` in seconds,
    `priority` 0-9); ValueError saying which label is wrong."""
    delay_ms = priority = None
    delay = labels.get("delay")
    if delay not in (None, ""):
        try:
            seconds = float(delay)
        except (TypeError, ValueError):
            seconds = math.nan
        if not math.isfinite(seconds):
            raise ValueError(f"the label delay is a number of seconds, not {delay!r}")
        if seconds > 0:
            delay_ms = min(round(seconds * 1000), MAX_DELAY_MS)
    value = labels.get("priority")
    if value not in (None, ""):
        try:
            priority = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"the label priority is 0 to 9 (higher first), not {value!r}") from None
        if not 0 <= priority <= 9:
            raise ValueError(f"the label priority is 0 to 9 (higher first), not {priority}")
        priority = priority or None
    return {"delay_ms": delay_ms, "priority": priority}


class MwmqBroker(AsyncBroker):
    """A taskiq broker over one mwmq queue.

    `url`: mwmq's address (`mwmq://user:password@host:6380`,
    `redis://host:6380`, `mwmqs://` or `rediss://` for TLS; a list to fail
    over between); `queue`: the queue's name; `visibility_timeout`: the
    lease, in seconds; `lease_renewal`: renew the leases of tasks being
    worked on (False: the lease is all the time a task may take);
    `wait_seconds`: how long one RECV waits for a message (`taskiq
    worker` notices SIGTERM only between two: a longer wait, a slower stop); `prefetch`: how
    many messages one RECV leases (1: one each time taskiq asks);
    `queue_options`: QCREATE's settings for `startup` to create the queue
    with (`create_queue=False`: it must exist); `client_options`: the
    mwmq.aio.AsyncClient's keyword arguments (`username`, `ssl_ca_certs`, ...).
    """

    def __init__(
        self,
        url: str | Sequence[str] = "redis://127.0.0.1:6380",
        queue: str = "taskiq",
        *,
        visibility_timeout: float = 60.0,
        lease_renewal: bool = True,
        wait_seconds: float = 2.0,
        prefetch: int = 1,
        create_queue: bool = True,
        queue_options: dict[str, Any] | None = None,
        client_options: dict[str, Any] | None = None,
    ):
        super().__init__()
        if visibility_timeout <= 0:
            raise ValueError(f"visibility_timeout is a number of seconds above 0, not {visibility_timeout}")
        if prefetch < 1:
            raise ValueError(f"prefetch is 1 or more, not {prefetch}")
        self.url = url
        self.queue = queue
        self.vt_ms = max(1, int(visibility_timeout * 1000))
        self.lease_renewal = lease_renewal
        self.wait_ms = int(wait_seconds * 1000)
        self.prefetch = prefetch
        self.create_queue = create_queue
        self.queue_options = dict(queue_options or {})
        self.client_options = dict(client_options or {})
        self._client: AsyncClient | None = None
        # What listen handed out and taskiq did not acknowledge yet, by
        # delivery (id and lease: a message may come back to this worker
        # while an earlier delivery of it is still held).
        self._held: dict[tuple[str, int | None], Message] = {}
        self._keeper: asyncio.Task[None] | None = None

    @property
    def client(self) -> AsyncClient:
        """The mwmq client, made on first use."""
        if self._client is None:
            self._client = AsyncClient(self.url, **self.client_options)
        return self._client

    async def startup(self) -> None:
        await super().startup()
        if self.create_queue:
            dead_letter = self.queue_options.get("dead_letter")
            if isinstance(dead_letter, str) and dead_letter:
                # Without the admin right there, QCREATE below says what is wrong.
                with contextlib.suppress(NoPerm):
                    await self.client.create_queue(dead_letter, exist_ok=True)
            try:
                await self.client.create_queue(self.queue, exist_ok=True, **self.queue_options)
            except NoPerm:
                # A user without the admin right may still use a queue made for it.
                await self.client.length(self.queue)

    async def shutdown(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        held, self._held = list(self._held.values()), {}
        if held and self._client is not None:
            for m in held:
                with contextlib.suppress(MwmqError, rex.RedisError, OSError):
                    await self._client.nack(m)
            logger.info("mwmq: gave %d unacknowledged messages of %r back", len(held), self.queue)
        await super().shutdown()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def kick(self, message: BrokerMessage) -> None:
        options = send_options(message.labels)
        cursor = _SQL_CURSOR.get()
        if cursor is not None:
            sql.send(cursor, self.queue, message.message, **options)
        else:
            await self.client.send(self.queue, message.message, **options)

    async def listen(self) -> AsyncGenerator[bytes | AckableMessage, None]:
        if self.lease_renewal and self._keeper is None:
            self._keeper = asyncio.create_task(self._keep_leases())
        while True:
            msgs = await self.client.recv(
                self.queue, count=self.prefetch, vt_ms=self.vt_ms, wait_ms=self.wait_ms or None
            )
            for m in msgs:
                self._held[(m.id, m.lease)] = m
            for m in msgs:
                yield AckableMessage(data=m.body, ack=self._acker(m))

    def _acker(self, m: Message) -> Callable[[], Awaitable[None]]:
        async def ack() -> None:
            self._held.pop((m.id, m.lease), None)
            if not await self.client.ack(m):
                logger.warning(
                    "mwmq: the lease of message %s of %r had run out before its ACK: it may have been "
                    "delivered again",
                    m.id,
                    m.queue,
                )

        return ack

    async def _keep_leases(self) -> None:
        """TOUCHes what is held every third of the lease, until cancelled."""
        period = max(self.vt_ms / 3000, 0.05)
        while True:
            await asyncio.sleep(period)
            held = list(self._held.values())
            if not held:
                continue
            try:
                renewed = await self.client.touch_many(held, self.vt_ms)
            except (MwmqError, rex.RedisError, OSError) as e:
                logger.warning("mwmq: renewing leases failed (%s); trying again in %.1f s", e, period)
                continue
            for m, ok in zip(held, renewed, strict=True):
                if not ok and self._held.pop((m.id, m.lease), None) is not None:
                    logger.warning(
                        "mwmq: the lease of message %s of %r ran out while held: it may be delivered again",
                        m.id,
                        m.queue,
                    )
