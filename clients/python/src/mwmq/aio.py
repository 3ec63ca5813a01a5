"""The asyncio client: `AsyncClient` has Client's methods, awaited, over
redis.asyncio's connection pool, with the same failover and retries
(core.py) and the same replies (types.py).

    async with mwmq.aio.AsyncClient("redis://127.0.0.1:6380") as mq:
        await mq.send("jobs", b"resize 17.jpg")
        for msg in await mq.recv("jobs", wait_ms=1000):
            await mq.ack(msg)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, overload

import redis.asyncio as aioredis
import redis.exceptions as rex

from . import commands as c
from .base import ClientBase, all_or_raise, created
from .core import Attempts, Batch
from .errors import MwmqError, TryAgain, from_redis, is_connection_error
from .types import DeadLetter, Message, QueueInfo, Schedule

T = TypeVar("T")

_REPLY_ERRORS = (rex.ResponseError, rex.AuthenticationError, rex.AuthorizationError)


async def _get_connection(pool: aioredis.ConnectionPool) -> Any:
    """A connected connection from the pool (redis-py 5.3+ takes no
    arguments; older ones want a command name)."""
    try:
        return await pool.get_connection()
    except TypeError:
        return await pool.get_connection("_")


class AsyncClient(ClientBase):
    """mwmq over redis.asyncio; its keyword arguments are ClientBase's (as
    Client's). Use it from one event loop."""

    def _setup(self) -> None:
        self._redis: list[aioredis.Redis | None] = [None] * len(self._settings.addresses)

    # -- connections

    def _pool(self, i: int) -> aioredis.ConnectionPool:
        r = self._redis[i]
        if r is None:
            r = self._redis[i] = aioredis.Redis(**self._settings.redis_kwargs[i])
        return r.connection_pool

    @property
    def redis(self) -> aioredis.Redis:
        """The redis.asyncio client of the address in use (for Redis Streams
        and anything this class does not wrap). It does not fail over."""
        self._pool(self._current)
        r = self._redis[self._current]
        assert r is not None
        return r

    async def aclose(self) -> None:
        """Closes every connection (the client may be used again: it reconnects)."""
        for r in self._redis:
            if r is not None:
                await r.connection_pool.disconnect()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _execute(self, calls: Sequence[c.Call[Any]]) -> list[Any]:
        """The calls' results in order, each a value or an MwmqError (as Client._execute)."""
        if not calls:
            return []
        batch, attempts = Batch(calls), Attempts(self._settings, str(calls[0].args[0]))
        while batch.pending:
            i = self._current
            pool = self._pool(i)
            try:
                conn = await _get_connection(pool)
            except _REPLY_ERRORS as e:
                err = from_redis(e)
                if not isinstance(err, TryAgain):
                    raise err from None
                delay = attempts.try_again(err)
                if delay is None:
                    batch.give_up(err)
                    break
                await asyncio.sleep(delay)
                continue
            except (rex.RedisError, OSError) as e:
                if not is_connection_error(e):
                    raise
                delay = self._fail_over(batch, attempts, i, e)
                if delay is None:
                    break
                await asyncio.sleep(delay)
                continue
            replies: list[Any] = []
            try:
                args = batch.args()
                if len(args) == 1:
                    await conn.send_command(*args[0])
                else:
                    await conn.send_packed_command(conn.pack_commands(args))
                for _ in args:
                    try:
                        replies.append(await conn.read_response())
                    except _REPLY_ERRORS as e:
                        replies.append(from_redis(e))
            except (rex.RedisError, OSError) as e:
                await conn.disconnect()
                if not is_connection_error(e):
                    raise
                batch.broke(replies, self._settings.addresses[i], e)
                if batch.pending:
                    delay = self._fail_over(batch, attempts, i, e)
                    if delay is None:
                        break
                    await asyncio.sleep(delay)
                continue
            except BaseException:
                # Cancelled mid-request: the connection's state is unknown.
                await asyncio.shield(conn.disconnect())
                raise
            finally:
                await pool.release(conn)
            if batch.answered(replies):
                delay = attempts.try_again(batch.results[batch.pending[0]])
                if delay is None:
                    batch.give_up(batch.results[batch.pending[0]])
                    break
                await asyncio.sleep(delay)
        return batch.results

    async def call(self, call: c.Call[T]) -> T:
        """Carries out one command (commands.py), raising its error."""
        [result] = await self._execute([call])
        if isinstance(result, MwmqError):
            raise result
        return result

    async def execute(self, *args: Any) -> Any:
        """Any command, as redis-py returns its reply (with this client's
        failover and retries; a command is taken as repeatable)."""
        return await self.call(c.Call(tuple(args), lambda r: r))

    # -- messages

    async def send(
        self,
        queue: str,
        body: c.Body,
        *,
        delay_ms: int | None = None,
        key: str | None = None,
        group: str | None = None,
        priority: int | None = None,
        to: str | None = None,
    ) -> str:
        """SEND: stores a message and returns its id. `key`: a repeated key
        in the queue returns the first id (generated when not given and
        auto_key is on); `group`: an ordered group; `priority`: 0-9, higher
        first; `to`: only that receiver may take it; `delay_ms`: not visible
        before."""
        return await self.call(
            self._send_call(queue, body, key, delay_ms=delay_ms, group=group, priority=priority, to=to)
        )

    async def send_many(
        self,
        queue: str,
        bodies: Iterable[c.Body],
        *,
        delay_ms: int | None = None,
        group: str | None = None,
        priority: int | None = None,
        to: str | None = None,
        keys: Sequence[str] | None = None,
    ) -> list[str]:
        """SENDs of each body, pipelined on one connection; their ids in
        order. If one is refused, the others are still sent, and its error
        is raised with `.results` (an id or an MwmqError for each body)."""
        options = {"delay_ms": delay_ms, "group": group, "priority": priority, "to": to}
        calls = self._send_many_calls(queue, bodies, keys, **options)
        return all_or_raise(await self._execute(calls)) if calls else []

    async def recv(
        self,
        queue: str,
        *,
        count: int = 1,
        vt_ms: int | None = None,
        wait_ms: int | None = None,
        sender: str | None = None,
    ) -> list[Message]:
        """RECV: up to `count` messages, each leased for `vt_ms` (mwmq's
        default: 30 s); waits up to `wait_ms` for the first; only those sent
        by `sender` when given. Empty when nothing came."""
        self._check_wait(wait_ms)
        return await self.call(c.recv(queue, count=count, vt_ms=vt_ms, wait_ms=wait_ms, sender=sender))

    @overload
    async def ack(self, msg: Message) -> bool: ...
    @overload
    async def ack(self, queue: str, id: str | int, lease: int) -> bool: ...
    async def ack(self, target: Message | str, *args: Any) -> bool:
        """ACK: True, or False when the lease is no longer current (or the
        delivery is not this user's)."""
        return await self.call(c.ack_of(target, args))

    async def ack_many(self, msgs: Sequence[Message]) -> list[bool]:
        """ACKs pipelined on one connection."""
        return all_or_raise(await self._execute([c.ack_of(m, ()) for m in msgs]))

    async def touch_many(self, msgs: Sequence[Message], ms: int) -> list[bool]:
        """TOUCHes pipelined on one connection: each message invisible for `ms` more."""
        return all_or_raise(await self._execute([c.touch_of(m, (ms,)) for m in msgs]))

    @overload
    async def nack(self, msg: Message, delay_ms: int | None = None) -> bool: ...
    @overload
    async def nack(self, queue: str, id: str | int, lease: int, delay_ms: int | None = None) -> bool: ...
    async def nack(self, target: Message | str, *args: Any, delay_ms: int | None = None) -> bool:
        """NACK: visible again after `delay_ms`, or without it after the
        queue's BACKOFF (at once without one). False when the lease is no
        longer current."""
        return await self.call(c.nack_of(target, args, delay_ms))

    @overload
    async def touch(self, msg: Message, ms: int) -> bool: ...
    @overload
    async def touch(self, queue: str, id: str | int, lease: int, ms: int) -> bool: ...
    async def touch(self, target: Message | str, *args: Any) -> bool:
        """TOUCH: the message stays invisible for `ms` more from now. False
        when the lease is no longer current."""
        return await self.call(c.touch_of(target, args))

    async def pop(self, queue: str, sender: str | None = None) -> Message | None:
        """POP: a message taken and deleted at once (at most once), or None."""
        return await self.call(c.pop(queue, sender))

    async def peek(self, queue: str, sender: str | None = None) -> Message | None:
        """PEEK: the next message without taking it, or None."""
        return await self.call(c.peek(queue, sender))

    # -- queues

    async def create_queue(
        self,
        name: str,
        *,
        max_deliveries: int | None = None,
        dead_letter: str | None = None,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        concurrency: int | None = None,
        rate: int | float | str | None = None,
        backoff: tuple[int, ...] | None = None,
        exist_ok: bool = False,
    ) -> bool:
        """QCREATE. `rate`: per second, or text as mwmq takes it (`20/min`);
        `backoff`: (base_ms, max_ms) or (base_ms, max_ms, jitter_pct). True
        when created, False when it existed and `exist_ok` (its settings are
        then left as they are)."""
        call = c.create_queue(
            name,
            max_deliveries=max_deliveries,
            dead_letter=dead_letter,
            max_messages=max_messages,
            max_bytes=max_bytes,
            concurrency=concurrency,
            rate=rate,
            backoff=backoff,
        )
        [result] = await self._execute([call])
        return created(result, exist_ok)

    async def alter_queue(
        self,
        name: str,
        *,
        max_deliveries: int | None = None,
        dead_letter: str | bool | None = None,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        concurrency: int | None = None,
        rate: int | float | str | None = None,
        retain_ms: int | None = None,
        backoff: tuple[int, ...] | bool | None = None,
    ) -> None:
        """QALTER: only what is given changes. `dead_letter=False` is
        NODEADLETTER, `backoff=False` NOBACKOFF; 0 lifts a limit."""
        await self.call(
            c.alter_queue(
                name,
                max_deliveries=max_deliveries,
                dead_letter=dead_letter,
                max_messages=max_messages,
                max_bytes=max_bytes,
                concurrency=concurrency,
                rate=rate,
                retain_ms=retain_ms,
                backoff=backoff,
            )
        )

    async def drop_queue(self, name: str) -> None:
        """QDROP: the queue and its messages."""
        await self.call(c.simple("QDROP", name))

    async def pause(self, name: str) -> None:
        """QPAUSE: SENDs are stored, nothing is handed out."""
        await self.call(c.simple("QPAUSE", name))

    async def resume(self, name: str) -> None:
        """QRESUME."""
        await self.call(c.simple("QRESUME", name))

    async def queues(self, pending: bool = False) -> list[str]:
        """QLIST: every queue (that this user has a right on), or with
        `pending` those holding a message this connection may take now."""
        return await self.call(c.queues(pending))

    async def length(self, queue: str) -> int:
        """QLEN: visible, delayed and leased messages."""
        return await self.call(c.length(queue))

    async def info(self, queue: str) -> QueueInfo:
        """QINFO."""
        return await self.call(c.info(queue))

    async def dead_letters(self, queue: str, count: int | None = None) -> list[DeadLetter]:
        """QDEAD: the latest dead letters of `queue` (default 10), last moved first."""
        return await self.call(c.dead_letters(queue, count))

    async def redrive(
        self, dead_letter_queue: str, *, to: str | None = None, count: int | None = None
    ) -> int:
        """REDRIVE: moves dead letters back (to `to`, or each where it came
        from); how many moved."""
        return await self.call(c.redrive(dead_letter_queue, to, count))

    async def schedule(
        self,
        name: str,
        queue: str,
        cron: str,
        body: c.Body,
        tz: str | None = None,
        key: str | None = None,
        catchup: str | None = None,
    ) -> None:
        """QSCHEDULE: SEND `body` to `queue` at every tick of `cron` (in `tz`),
        making or replacing schedule `name`. `key`: the ticks' KEY prefix;
        `catchup`: none, one or all."""
        await self.call(c.schedule(name, queue, cron, body, tz=tz, key=key, catchup=catchup))

    async def unschedule(self, name: str) -> bool:
        """QUNSCHEDULE: False when there is no such schedule."""
        return await self.call(c.unschedule(name))

    async def schedules(self) -> list[Schedule]:
        """QSCHEDULES: those of the queues this user may see."""
        return await self.call(c.schedules())

    async def ping(self) -> bool:
        return await self.call(c.ping())
