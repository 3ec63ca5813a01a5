"""Every mwmq command this package sends, as a `Call`: its arguments, how its
reply is read, and whether it may be sent again when its first try may have
run (a lost reply, `-TRYAGAIN`). No I/O: the sync and async clients both
carry these out, so they cannot drift apart.

Repeating is safe for all but one: a SEND without a KEY, which a second try
could store twice. A repeated ACK, NACK or TOUCH answers 0 when the first
went through (the lease is no longer current); a repeated RECV leaves what
the lost reply carried to come back after its lease (mwmq gives the leases
of an undelivered reply back at once when it sees the client leave).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from . import types as t

T = TypeVar("T")

Body = bytes | bytearray | memoryview | str


@dataclass(frozen=True)
class Call(Generic[T]):
    """One command: `args` as sent, `parse` for its reply, `repeatable` when
    sending it twice does no harm."""

    args: tuple[Any, ...]
    parse: Callable[[Any], T]
    repeatable: bool = True


def _ok(reply: Any) -> None:
    return None


def _bool(reply: Any) -> bool:
    return bool(int(reply))


def _int(reply: Any) -> int:
    return int(reply)


def _opt(args: list[Any], flag: str, value: Any) -> None:
    if value is not None:
        args += [flag, value]


def body_bytes(body: Body) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")


def send(
    queue: str,
    body: Body,
    *,
    delay_ms: int | None = None,
    key: str | None = None,
    group: str | None = None,
    priority: int | None = None,
    to: str | None = None,
) -> Call[str]:
    args: list[Any] = ["SEND", queue, body_bytes(body)]
    _opt(args, "TO", to)
    _opt(args, "DELAY", delay_ms)
    _opt(args, "KEY", key)
    _opt(args, "GROUP", group)
    _opt(args, "PRIORITY", priority)
    return Call(tuple(args), t.text, repeatable=key is not None)


def recv(
    queue: str,
    *,
    count: int = 1,
    vt_ms: int | None = None,
    wait_ms: int | None = None,
    sender: str | None = None,
) -> Call[list[t.Message]]:
    args: list[Any] = ["RECV", queue]
    _opt(args, "FROM", sender)
    _opt(args, "VT", vt_ms)
    args += ["COUNT", count]
    _opt(args, "WAIT", wait_ms)
    return Call(tuple(args), lambda rows: [t.received(queue, r) for r in rows or []])


def ack(queue: str, id: str | int, lease: int) -> Call[bool]:
    return Call(("ACK", queue, id, lease), _bool)


def nack(queue: str, id: str | int, lease: int, delay_ms: int | None = None) -> Call[bool]:
    args: list[Any] = ["NACK", queue, id, lease]
    _opt(args, "DELAY", delay_ms)
    return Call(tuple(args), _bool)


def touch(queue: str, id: str | int, lease: int, ms: int) -> Call[bool]:
    return Call(("TOUCH", queue, id, lease, ms), _bool)


def pop(queue: str, sender: str | None = None) -> Call[t.Message | None]:
    args: list[Any] = ["POP", queue]
    _opt(args, "FROM", sender)
    return Call(tuple(args), lambda r: t.taken(queue, r))


def peek(queue: str, sender: str | None = None) -> Call[t.Message | None]:
    args: list[Any] = ["PEEK", queue]
    _opt(args, "FROM", sender)
    return Call(tuple(args), lambda r: t.taken(queue, r))


def _rate(rate: int | float | str) -> str:
    """RATE's argument: a number is per second; text is taken as written (`20/min`)."""
    if isinstance(rate, str):
        return rate
    return f"{rate:g}/s"


def _queue_options(
    max_deliveries: int | None,
    dead_letter: str | bool | None,
    max_messages: int | None,
    max_bytes: int | None,
    concurrency: int | None,
    rate: int | float | str | None,
    backoff: tuple[int, ...] | bool | None,
) -> list[Any]:
    args: list[Any] = []
    _opt(args, "MAXDELIVERIES", max_deliveries)
    if dead_letter is False:
        args.append("NODEADLETTER")
    elif dead_letter is not None and dead_letter is not True:
        args += ["DEADLETTER", dead_letter]
    _opt(args, "MAXMESSAGES", max_messages)
    _opt(args, "MAXBYTES", max_bytes)
    _opt(args, "CONCURRENCY", concurrency)
    if rate is not None:
        args += ["RATE", _rate(rate)]
    if backoff is False:
        args.append("NOBACKOFF")
    elif backoff is not None and backoff is not True:
        if len(backoff) not in (2, 3):
            raise ValueError(
                f"backoff is (base_ms, max_ms) or (base_ms, max_ms, jitter_pct), not {backoff!r}"
            )
        args += ["BACKOFF", backoff[0], backoff[1]]
        if len(backoff) == 3:
            args += ["JITTER", backoff[2]]
    return args


def create_queue(
    name: str,
    *,
    max_deliveries: int | None = None,
    dead_letter: str | None = None,
    max_messages: int | None = None,
    max_bytes: int | None = None,
    concurrency: int | None = None,
    rate: int | float | str | None = None,
    backoff: tuple[int, ...] | None = None,
) -> Call[None]:
    opts = _queue_options(max_deliveries, dead_letter, max_messages, max_bytes, concurrency, rate, backoff)
    return Call(("QCREATE", name, *opts), _ok)


def alter_queue(
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
) -> Call[None]:
    opts = _queue_options(max_deliveries, dead_letter, max_messages, max_bytes, concurrency, rate, backoff)
    _opt(opts, "RETAIN", retain_ms)
    if not opts:
        raise ValueError("alter_queue: nothing to change (give at least one setting)")
    return Call(("QALTER", name, *opts), _ok)


def simple(*args: Any) -> Call[None]:
    """QDROP, QPAUSE, QRESUME: OK or an error."""
    return Call(tuple(args), _ok)


def queues(pending: bool = False) -> Call[list[str]]:
    args = ("QLIST", "PENDING") if pending else ("QLIST",)
    return Call(args, lambda r: [t.text(x) for x in r or []])


def length(queue: str) -> Call[int]:
    return Call(("QLEN", queue), _int)


def info(queue: str) -> Call[t.QueueInfo]:
    return Call(("QINFO", queue), t.queue_info)


def dead_letters(queue: str, count: int | None = None) -> Call[list[t.DeadLetter]]:
    args: list[Any] = ["QDEAD", queue]
    _opt(args, "COUNT", count)
    return Call(tuple(args), lambda rows: [t.dead_letter(r) for r in rows or []])


def redrive(dead_letter_queue: str, to: str | None = None, count: int | None = None) -> Call[int]:
    args: list[Any] = ["REDRIVE", dead_letter_queue]
    _opt(args, "TO", to)
    _opt(args, "COUNT", count)
    return Call(tuple(args), _int)


def schedule(
    name: str,
    queue: str,
    cron: str,
    body: Body,
    *,
    tz: str | None = None,
    key: str | None = None,
    catchup: str | None = None,
) -> Call[None]:
    args: list[Any] = ["QSCHEDULE", name, queue, cron, body_bytes(body)]
    _opt(args, "TZ", tz)
    _opt(args, "KEY", key)
    _opt(args, "CATCHUP", catchup)
    return Call(tuple(args), _ok)


def unschedule(name: str) -> Call[bool]:
    return Call(("QUNSCHEDULE", name), _bool)


def schedules() -> Call[list[t.Schedule]]:
    return Call(("QSCHEDULES",), lambda rows: [t.schedule(r) for r in rows or []])


def ping() -> Call[bool]:
    return Call(("PING",), lambda r: True)


def delivery(
    target: t.Message | str, args: Iterable[Any], extra: int
) -> tuple[str, str | int, int, list[Any]]:
    """(queue, id, lease, the rest) from `(msg, *rest)` or `(queue, id, lease, *rest)`,
    the forms ack, nack and touch take; `extra` is how many positional values follow."""
    rest = list(args)
    if isinstance(target, t.Message):
        if target.lease is None:
            raise ValueError(
                f"message {target.id} of {target.queue!r} holds no lease (POP and PEEK take none)"
            )
        queue, mid, lease = target.queue, target.id, target.lease
    else:
        if len(rest) < 2:
            raise TypeError("give a Message, or the queue, the message id and the lease")
        queue, mid, lease = target, rest[0], rest[1]
        rest = rest[2:]
    if len(rest) > extra:
        raise TypeError(f"too many arguments: {rest!r}")
    return queue, mid, int(lease), rest


def ack_of(target: t.Message | str, args: Iterable[Any]) -> Call[bool]:
    """ACK from the clients' `ack(msg)` or `ack(queue, id, lease)`."""
    queue, mid, lease, _ = delivery(target, args, 0)
    return ack(queue, mid, lease)


def nack_of(target: t.Message | str, args: Iterable[Any], delay_ms: int | None) -> Call[bool]:
    """NACK from `nack(msg, delay_ms)` or `nack(queue, id, lease, delay_ms)`."""
    queue, mid, lease, rest = delivery(target, args, 1)
    return nack(queue, mid, lease, rest[0] if rest else delay_ms)


def touch_of(target: t.Message | str, args: Iterable[Any]) -> Call[bool]:
    """TOUCH from `touch(msg, ms)` or `touch(queue, id, lease, ms)`."""
    queue, mid, lease, rest = delivery(target, args, 1)
    if not rest:
        raise TypeError("touch: how long (ms) is missing")
    return touch(queue, mid, lease, rest[0])
