"""What mwmq's replies become: messages, a queue's QINFO, dead letters and
schedules as dataclasses, built from redis-py's replies in either protocol
(RESP2 gives a map as a flat array, RESP3 as a dict)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


def text(v: Any) -> str:
    """A bulk string (bytes) or integer as text; nil as ''."""
    if v is None:
        return ""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def opt_text(v: Any) -> str | None:
    """A bulk string as text; nil and '' as None."""
    return text(v) or None


def opt_int(v: Any) -> int | None:
    return None if v is None or v == b"" else int(v)


def as_map(v: Any) -> dict[str, Any]:
    """A map reply (RESP3 dict or RESP2 flat array) with text keys."""
    if isinstance(v, dict):
        return {text(k): x for k, x in v.items()}
    items = list(v or [])
    return {text(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


@dataclass
class Message:
    """A message as RECV, POP or PEEK gave it. `lease` is the delivery's
    token (RECV only: POP and PEEK hold none); `id` is mwmq's message id, as
    text (as SEND returned it)."""

    queue: str
    id: str
    lease: int | None
    sender: str
    body: bytes

    @property
    def text(self) -> str:
        """The body as UTF-8 text (UnicodeDecodeError if it is not)."""
        return self.body.decode("utf-8")

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


def received(queue: str, row: Any) -> Message:
    """A RECV row: [id, lease, sender, body]."""
    mid, lease, sender, body = row
    return Message(queue, text(mid), int(lease), text(sender), bytes(body or b""))


def taken(queue: str, row: Any) -> Message | None:
    """A POP or PEEK reply: [id, sender, body] or nil."""
    if not row:
        return None
    mid, sender, body = row
    return Message(queue, text(mid), None, text(sender), bytes(body or b""))


@dataclass
class DeadLetter:
    """A row of QDEAD: a message that was not acknowledged within its queue's
    MAXDELIVERIES, where it is held now and where it came from."""

    id: str
    queue: str
    origin: str
    reason: str
    deliveries: int
    sender: str
    sent_at_ms: int | None
    body: bytes


def dead_letter(row: Any) -> DeadLetter:
    mid, queue, origin, reason, deliveries, sender, sent_at, body = row
    return DeadLetter(
        text(mid),
        text(queue),
        text(origin),
        text(reason),
        int(deliveries or 0),
        text(sender),
        opt_int(sent_at),
        bytes(body or b""),
    )


@dataclass
class QueueInfo:
    """QINFO's map (docs/mwmq.md, the QINFO row): the queue's counts (cached
    for `info_cache_ms`), its settings, and this mwmq process's counters.
    Keys this version does not know (a stream's `type`, `length`, ...) are in
    `extra`."""

    ready: int = 0
    delayed: int = 0
    leased: int = 0
    oldest_ready_ms: int = 0
    max_deliveries: int = 0
    dead_letter: str | None = None
    dead_letters_held: int = 0
    max_messages: int = 0
    max_bytes: int = 0
    counted_messages: int = 0
    counted_bytes: int = 0
    paused: bool = False
    concurrency: int = 0
    rate_per_sec: float = 0.0
    held_by_concurrency: int = 0
    held_by_rate: int = 0
    retain_ms: int = 0
    archived: int = 0
    ready_by_priority: dict[int, int] = field(default_factory=dict)
    backoff_base_ms: int = 0
    backoff_max_ms: int = 0
    backoff_jitter_pct: int = 0
    sent: int = 0
    received: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    dropped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


_INFO_FIELDS = {f.name: f for f in dataclasses.fields(QueueInfo) if f.name != "extra"}


def queue_info(reply: Any) -> QueueInfo:
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in as_map(reply).items():
        if k not in _INFO_FIELDS:
            extra[k] = text(v) if isinstance(v, bytes) else v
        elif k == "dead_letter":
            values[k] = opt_text(v)
        elif k == "paused":
            values[k] = bool(int(v or 0))
        elif k == "rate_per_sec":
            values[k] = float(text(v) or 0)
        elif k == "ready_by_priority":
            values[k] = {int(p): int(n) for p, n in as_map(v).items()}
        else:
            values[k] = int(v or 0)
    return QueueInfo(**values, extra=extra)


@dataclass
class Schedule:
    """A row of QSCHEDULES: a periodic SEND, its next and last runs (ms since
    the epoch; None before the first run or when it never fires again)."""

    name: str
    queue: str
    cron: str
    tz: str
    catchup: str
    key_prefix: str
    body_bytes: int
    created_by: str | None
    next_run_ms: int | None
    last_tick_ms: int | None
    last_run_ms: int | None
    last_id: str | None
    sent: int
    missed: int
    refused: int
    extra: dict[str, Any] = field(default_factory=dict)


_SCHEDULE_TEXT = ("name", "queue", "cron", "tz", "catchup", "key_prefix")
_SCHEDULE_OPT_INT = ("next_run_ms", "last_tick_ms", "last_run_ms")
_SCHEDULE_INT = ("body_bytes", "sent", "missed", "refused")


def schedule(reply: Any) -> Schedule:
    m = as_map(reply)
    known = {*_SCHEDULE_TEXT, *_SCHEDULE_OPT_INT, *_SCHEDULE_INT, "created_by", "last_id"}
    return Schedule(
        **{k: text(m.get(k)) for k in _SCHEDULE_TEXT},
        **{k: opt_int(m.get(k)) for k in _SCHEDULE_OPT_INT},
        **{k: int(m.get(k) or 0) for k in _SCHEDULE_INT},
        created_by=opt_text(m.get("created_by")),
        last_id=opt_text(m.get("last_id")),
        extra={k: v for k, v in m.items() if k not in known},
    )
