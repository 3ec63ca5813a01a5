"""The synchronous client: mwmq's queue commands as methods over redis-py's
connection pool, one pool per address, with failover and retries (core.py)
and typed replies (types.py). Thread-safe: threads share the pool.

The commands go out on a pooled redis-py connection directly (send, then
read each reply) rather than through `Redis.execute_command`, so that a
connection that could not be made — nothing sent — is told apart from one
that broke with a request in flight, and so that `send_many` pipelines its
SENDs on one connection and reads each reply, refusals included.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, overload

import redis
import redis.exceptions as rex

from . import commands as c
from .base import ClientBase, all_or_raise, created
from .core import Attempts, Batch
from .errors import MwmqError, TryAgain, from_redis, is_connection_error
from .types import DeadLetter, Message, QueueInfo, Schedule

T = TypeVar("T")

_REPLY_ERRORS = (rex.ResponseError, rex.AuthenticationError, rex.AuthorizationError)


def _get_connection(pool: redis.ConnectionPool) -> Any:
    """A connected connection from the pool (redis-py 5.3+ takes no
    arguments; older ones want a command name)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("_")


class Client(ClientBase):
    """A connection to mwmq, or to the first of several addresses that
    answers; its keyword arguments are ClientBase's. Thread-safe.

        mq = mwmq.Client("redis://app:secret@127.0.0.1:6380")
        mq.send("jobs", b"resize 17.jpg")
    """

    def _setup(self) -> None:
        self._redis: list[redis.Redis | None] = [None] * len(self._settings.addresses)
        self._lock = threading.Lock()

    # -- connections

    def _pool(self, i: int) -> redis.ConnectionPool:
        with self._lock:
            r = self._redis[i]
            if r is None:
                r = self._redis[i] = redis.Redis(**self._settings.redis_kwargs[i])
            return r.connection_pool

    @property
    def redis(self) -> redis.Redis:
        """The redis-py client of the address in use (for Redis Streams and
        anything this class does not wrap). It does not fail over."""
        self._pool(self._current)
        r = self._redis[self._current]
        assert r is not None
        return r

    def _move(self, failed: int, to: int) -> None:
        with self._lock:
            super()._move(failed, to)

    def close(self) -> None:
        """Closes every connection (the client may be used again: it reconnects)."""
        for r in self._redis:
            if r is not None:
                r.connection_pool.disconnect()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _execute(self, calls: Sequence[c.Call[Any]]) -> list[Any]:
        """The calls' results in order, each a value or an MwmqError."""
        if not calls:
            return []
        batch, attempts = Batch(calls), Attempts(self._settings, str(calls[0].args[0]))
        while batch.pending:
            i = self._current
            pool = self._pool(i)
            try:
                conn = _get_connection(pool)
            except _REPLY_ERRORS as e:
                err = from_redis(e)
                if not isinstance(err, TryAgain):  # TRYAGAIN at login: the logins queue is full
                    raise err from None
                delay = attempts.try_again(err)
                if delay is None:
                    batch.give_up(err)
                    break
                time.sleep(delay)
                continue
            except (rex.RedisError, OSError) as e:
                if not is_connection_error(e):
                    raise
                delay = self._fail_over(batch, attempts, i, e)
                if delay is None:
                    break
                time.sleep(delay)
                continue
            replies: list[Any] = []
            try:
                args = batch.args()
                if len(args) == 1:
                    conn.send_command(*args[0])
                else:
                    conn.send_packed_command(conn.pack_commands(args))
                for _ in args:
                    try:
                        replies.append(conn.read_response())
                    except _REPLY_ERRORS as e:
                        replies.append(from_redis(e))
            except (rex.RedisError, OSError) as e:
                conn.disconnect()
                if not is_connection_error(e):
                    raise
                batch.broke(replies, self._settings.addresses[i], e)
                if batch.pending:
                    delay = self._fail_over(batch, attempts, i, e)
                    if delay is None:
                        break
                    time.sleep(delay)
                continue
            except BaseException:
                # Interrupted mid-request: the connection's state is unknown.
                conn.disconnect()
                raise
            finally:
                pool.release(conn)
            if batch.answered(replies):
                delay = attempts.try_again(batch.results[batch.pending[0]])
                if delay is None:
                    batch.give_up(batch.results[batch.pending[0]])
                    break
                time.sleep(delay)
        return batch.results

    def call(self, call: c.Call[T]) -> T:
        """Carries out one command (commands.py), raising its error."""
        [result] = self._execute([call])
        if isinstance(result, MwmqError):
            raise result
        return result

    def execute(self, *args: Any) -> Any:
        """Any command, as redis-py returns its reply (with this client's
        failover and retries; a command is taken as repeatable)."""
        return self.call(c.Call(tuple(args), lambda r: r))

    # -- messages

    def send(
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
        return self.call(
            self._send_call(queue, body, key, delay_ms=delay_ms, group=group, priority=priority, to=to)
        )

    def send_many(
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
        return all_or_raise(self._execute(calls)) if calls else []

    def recv(
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
        return self.call(c.recv(queue, count=count, vt_ms=vt_ms, wait_ms=wait_ms, sender=sender))

    @overload
    def ack(self, msg: Message) -> bool: ...
    @overload
    def ack(self, queue: str, id: str | int, lease: int) -> bool: ...
    def ack(self, target: Message | str, *args: Any) -> bool:
        """ACK: True, or False when the lease is no longer current (or the
        delivery is not this user's)."""
        return self.call(c.ack_of(target, args))

    def ack_many(self, msgs: Sequence[Message]) -> list[bool]:
        """ACKs pipelined on one connection."""
        return all_or_raise(self._execute([c.ack_of(m, ()) for m in msgs]))

    def touch_many(self, msgs: Sequence[Message], ms: int) -> list[bool]:
        """TOUCHes pipelined on one connection: each message invisible for `ms` more."""
        return all_or_raise(self._execute([c.touch_of(m, (ms,)) for m in msgs]))

    @overload
    def nack(self, msg: Message, delay_ms: int | None = None) -> bool: ...
    @overload
    def nack(self, queue: str, id: str | int, lease: int, delay_ms: int | None = None) -> bool: ...
    def nack(self, target: Message | str, *args: Any, delay_ms: int | None = None) -> bool:
        """NACK: visible again after `delay_ms`, or without it after the
        queue's BACKOFF (at once without one). False when the lease is no
        longer current."""
        return self.call(c.nack_of(target, args, delay_ms))

    @overload
    def touch(self, msg: Message, ms: int) -> bool: ...
    @overload
    def touch(self, queue: str, id: str | int, lease: int, ms: int) -> bool: ...
    def touch(self, target: Message | str, *args: Any) -> bool:
        """TOUCH: the message stays invisible for `ms` more from now. False
        when the lease is no longer current."""
        return self.call(c.touch_of(target, args))

    def pop(self, queue: str, sender: str | None = None) -> Message | None:
        """POP: a message taken and deleted at once (at most once), or None."""
        return self.call(c.pop(queue, sender))

    def peek(self, queue: str, sender: str | None = None) -> Message | None:
        """PEEK: the next message without taking it, or None."""
        return self.call(c.peek(queue, sender))

    # -- queues

    def create_queue(
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
        [result] = self._execute([call])
        return created(result, exist_ok)

    def alter_queue(
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
        self.call(
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

    def drop_queue(self, name: str) -> None:
        """QDROP: the queue and its messages."""
        self.call(c.simple("QDROP", name))

    def pause(self, name: str) -> None:
        """QPAUSE: SENDs are stored, nothing is handed out."""
        self.call(c.simple("QPAUSE", name))

    def resume(self, name: str) -> None:
        """QRESUME."""
        self.call(c.simple("QRESUME", name))

    def queues(self, pending: bool = False) -> list[str]:
        """QLIST: every queue (that this user has a right on), or with
        `pending` those holding a message this connection may take now."""
        return self.call(c.queues(pending))

    def length(self, queue: str) -> int:
        """QLEN: visible, delayed and leased messages."""
        return self.call(c.length(queue))

    def info(self, queue: str) -> QueueInfo:
        """QINFO."""
        return self.call(c.info(queue))

    def dead_letters(self, queue: str, count: int | None = None) -> list[DeadLetter]:
        """QDEAD: the latest dead letters of `queue` (default 10), last moved first."""
        return self.call(c.dead_letters(queue, count))

    def redrive(self, dead_letter_queue: str, *, to: str | None = None, count: int | None = None) -> int:
        """REDRIVE: moves dead letters back (to `to`, or each where it came
        from); how many moved."""
        return self.call(c.redrive(dead_letter_queue, to, count))

    def schedule(
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
        self.call(c.schedule(name, queue, cron, body, tz=tz, key=key, catchup=catchup))

    def unschedule(self, name: str) -> bool:
        """QUNSCHEDULE: False when there is no such schedule."""
        return self.call(c.unschedule(name))

    def schedules(self) -> list[Schedule]:
        """QSCHEDULES: those of the queues this user may see."""
        return self.call(c.schedules())

    def ping(self) -> bool:
        return self.call(c.ping())
