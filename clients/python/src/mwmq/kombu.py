"""kombu's transport for mwmq: Celery (and any kombu program) sends and
receives through mwmq's own queues, `celery -A app worker --broker
mwmq://user:password@host:6380//`.

A kombu message (its JSON envelope: body, headers, properties) is the body
of one mwmq message. What mwmq does itself rather than kombu in memory:

- **delivery**: a consumer RECVs up to its prefetch with a lease of
  `visibility_timeout` seconds (default 60), once the prefetch has room for
  a quarter of it (not one RECV per task); an ACK acknowledges it, a
  reject with requeue (and a channel closed with messages still held, as at
  a worker's warm shutdown) NACKs it back at once, a reject without requeue
  drops it (ACK), as AMQP without a dead-letter exchange does;
- **ACKs in the background**: `message.ack()` hands the ACK to
  `ack_threads` threads (8; 0 sends it before returning) and returns, as
  AMQP's basic.ack awaits no reply. mwmq runs one connection's requests
  one at a time but batches ACKs arriving together on several, and Celery's
  prefork pool acknowledges from one thread: ACKing there cost a commit's
  round trip per task. Closing the connection waits for those handed over
  (acker.py); an ACK lost with its process leaves the task to come back
  after its lease, as any crash before the ACK does;
- **leases held as long as the work**: while a process holds a message (a
  task running with `acks_late`, prefetched, or waiting for its ETA) a
  thread TOUCHes its lease every third of `visibility_timeout`; a worker that
  dies stops renewing, and its messages come back to the others within
  `visibility_timeout`. (`lease_renewal: False` turns this off: the lease is
  then all the time a message may be held, as with kombu's Redis transport);
- **countdown and eta**: a message whose `eta` header is in the future is
  sent with `DELAY` (at most 7 days, mwmq's limit; past that it comes early
  and Celery holds it until its time);
- **priority**: a message's priority 0-9 is mwmq's `PRIORITY`, higher first
  (the AMQP order; a priority of 0 sends none, so queues without priorities
  stay on mwmq's plain path);
- **in the application's transaction**: inside `with
  mwmq.kombu.sql_transaction(cursor):` a task sent (`task.delay()`) is a
  `SELECT mwmq.send(...)` on that DB-API cursor of mwmq's database, so it
  is visible to workers when the application's transaction commits and
  never sent if it rolls back (the queue must exist: the workers declare it);
- **a message kombu did not write** (a SEND by another program: not JSON,
  not kombu's envelope, a body that does not decode) never reaches kombu,
  where it would fail every drain and hold up the messages behind it: it is
  logged and NACKed on a queue with MAXDELIVERIES (so that it ends in the
  queue's dead letters), dropped (ACK) on a queue without;
- **queues** are created when declared (`QCREATE ... ` unless they exist);
  queue arguments `x-mwmq-max-deliveries`, `x-mwmq-dead-letter`,
  `x-mwmq-backoff` ([base_ms, max_ms]) and the other settings of QCREATE
  apply when the queue is created (its dead-letter queue is created first).

Exchanges and bindings live in each process's memory, as with every kombu
virtual transport without a store for them (SQS): direct and topic
exchanges route to the queues the publishing process declared, which Celery
does before it publishes. There is no fanout, so Celery's remote control,
events and mingle/gossip are off (Celery checks the transport), as on SQS;
declaring a fanout exchange (`celery inspect`, `revoke`, a `Broadcast`
queue) logs a warning that what goes there reaches no one.

Transport options (`broker_transport_options`): `visibility_timeout`
(seconds, 60), `lease_renewal` (True), `wait_time_seconds` (how long a
consumer of one queue waits in one RECV, 5; capped by kombu's drain
timeout), `polling_interval` (seconds between rounds over several queues,
0.5; a consumer whose prefetch is full waits for an ACK instead),
`queue_name_prefix` (''), `prefetch_max` (messages per RECV when kombu
sets no prefetch, 10), `ack_threads` (8), `send_keys` (True: every SEND
carries a KEY of its own, a uuid4, so that a SEND whose reply was lost is
sent again without being stored twice; Celery's task id would not do, as
Celery sends a task again under the same id for a retry, `Task.replace`
and `chord_unlock`. False: no KEY, which mwmq batches with the other SENDs
waiting, a higher rate with many producers; a lost reply then raises
ConnectionLost and kombu's retry of the publish may store it twice).

The `mwmq://` and `mwmqs://` (TLS) schemes are known to kombu once this
module is imported; installing the package makes them known in every
process without it (see `_mwmq_kombu`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import datetime, timezone
from queue import Empty
from time import monotonic, sleep
from typing import Any

import redis.exceptions as rex
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.utils.json import dumps, loads
from kombu.utils.scheduling import FairCycle

from . import Client, sql
from .acker import Acker
from .errors import ConnectionLost, MwmqError, NoPerm, NoQueue, TryAgain
from .types import Message as MwmqMessage

logger = logging.getLogger(__name__)

DEFAULT_PORT = 6380
# mwmq's longest DELAY (crates/mwmq/src/command.rs: MAX_DELAY_MS).
MAX_DELAY_MS = 7 * 24 * 3600 * 1000
# Queue arguments (`Queue(..., queue_arguments={...})`) and the
# create_queue keyword each becomes.
QUEUE_ARGUMENTS = {
    "x-mwmq-max-deliveries": "max_deliveries",
    "x-mwmq-dead-letter": "dead_letter",
    "x-mwmq-max-messages": "max_messages",
    "x-mwmq-max-bytes": "max_bytes",
    "x-mwmq-concurrency": "concurrency",
    "x-mwmq-rate": "rate",
    "x-mwmq-backoff": "backoff",
}


# The fanout exchanges declared in this process and said to reach no one.
_FANOUTS_SAID: set[str | None] = set()

# The cursor of sql_transaction's block, if any.
_SQL_CURSOR: ContextVar[Any] = ContextVar("mwmq_kombu_sql_cursor", default=None)


@contextlib.contextmanager
def sql_transaction(cursor: Any) -> Iterator[None]:
    """Within the block, what kombu sends through mwmq (Celery's
    `task.delay()`, `apply_async`, ...) goes into `cursor`'s transaction:
    `mwmq.send(...)` in SQL (mwmq.sql.send) instead of a SEND over RESP.
    `cursor` is a DB-API cursor (psycopg 3 or psycopg2) of mwmq's database;
    the messages are visible to workers once that transaction commits, and
    gone if it rolls back."""
    token = _SQL_CURSOR.set(cursor)
    try:
        yield
    finally:
        _SQL_CURSOR.reset(token)


def delay_ms(message: dict[str, Any], now: datetime | None = None) -> int | None:
    """How long mwmq should hold a kombu message back: until its `eta`
    header (Celery's countdown and eta, ISO 8601), at most MAX_DELAY_MS;
    None when it has none or it is past."""
    eta = (message.get("headers") or {}).get("eta")
    if not eta:
        return None
    try:
        when = datetime.fromisoformat(str(eta))
    except ValueError:
        return None
    if when.tzinfo is None:
        # Naive: local time, as a naive datetime.now() would give it.
        when = when.astimezone()
    now = now or datetime.now(timezone.utc)
    ms = math.ceil((when - now).total_seconds() * 1000)
    if ms <= 0:
        return None
    return min(ms, MAX_DELAY_MS)


def malformed(payload: Any) -> str | None:
    """What makes a decoded body other than kombu's envelope (a JSON object
    whose `properties` is an object, with `delivery_info` and `headers`
    objects and a string `body` where present), or None."""
    if not isinstance(payload, dict):
        return f"a JSON {type(payload).__name__}, not an object"
    if not isinstance(payload.get("properties"), dict):
        return "no properties object"
    if not isinstance(payload["properties"].get("delivery_info") or {}, dict):
        return "delivery_info is not an object"
    if not isinstance(payload.get("headers") or {}, dict):
        return "headers is not an object"
    if not isinstance(payload.get("body") or "", str):
        return "the body is not a string"
    return None


def held_delivery(info: dict[str, Any]) -> MwmqMessage:
    """The mwmq delivery a kombu message's delivery_info names (its body
    left out: only queue, id and lease are needed to settle it)."""
    return MwmqMessage(info["queue"], info["id"], int(info["lease"]), "", b"")


class QoS(virtual.QoS):
    """kombu's prefetch bookkeeping, and the mwmq delivery of each message
    held, which the lease keeper renews and ACK and NACK settle. Acks may
    come from other threads (Celery's thread pool), hence the lock."""

    def __init__(self, channel: Channel, prefetch_count: int = 0):
        super().__init__(channel, prefetch_count)
        self._leases: dict[str, MwmqMessage] = {}
        self._lock = threading.Lock()

    def append(self, message: Any, delivery_tag: str) -> None:
        super().append(message, delivery_tag)
        info = (message.delivery_info or {}).get("mwmq")
        if info:
            with self._lock:
                self._leases[delivery_tag] = held_delivery(info)

    def release(self, delivery_tag: str) -> MwmqMessage | None:
        """The delivery of a message no longer held (acked, rejected, given back)."""
        with self._lock:
            return self._leases.pop(delivery_tag, None)

    def held(self) -> list[tuple[str, MwmqMessage]]:
        with self._lock:
            return list(self._leases.items())

    def restore_unacked(self) -> list[Any]:
        errors = super().restore_unacked()
        with self._lock:
            self._leases.clear()
        return errors


class Channel(virtual.Channel):
    """A kombu channel over the transport's mwmq client."""

    QoS = QoS

    from_transport_options = (
        *virtual.Channel.from_transport_options,
        "visibility_timeout",
        "lease_renewal",
        "wait_time_seconds",
        "queue_name_prefix",
        "prefetch_max",
        "ack_threads",
        "send_keys",
    )
    visibility_timeout: float = 60.0
    lease_renewal: bool = True
    wait_time_seconds: float = 5.0
    queue_name_prefix: str = ""
    prefetch_max: int = 10
    ack_threads: int = 8
    send_keys: bool = True

    def __init__(self, connection: Transport, **kwargs: Any):
        self._noack_queues: set[str] = set()
        super().__init__(connection, **kwargs)
        # Whether the last round of gets waited in a RECV, or found the
        # prefetch without room (Transport.drain_events).
        self.waited = self.full = False

    @property
    def client(self) -> Client:
        return self.connection.mwmq

    @property
    def vt_ms(self) -> int:
        return max(1, int(float(self.visibility_timeout) * 1000))

    def _queue_name(self, queue: str) -> str:
        return f"{self.queue_name_prefix}{queue}"

    # -- queues

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        options = {}
        for arg, value in (kwargs.get("arguments") or {}).items():
            if arg in QUEUE_ARGUMENTS:
                options[QUEUE_ARGUMENTS[arg]] = tuple(value) if arg == "x-mwmq-backoff" else value
        name = self._queue_name(queue)
        dead_letter = options.get("dead_letter")
        if isinstance(dead_letter, str) and dead_letter:
            # QCREATE wants it to exist; without the admin right there, the
            # QCREATE below says what is wrong.
            with contextlib.suppress(NoPerm):
                self.client.create_queue(dead_letter, exist_ok=True)
        try:
            self.client.create_queue(name, exist_ok=True, **options)
        except NoPerm:
            # A user without the admin right may still use a queue made for it.
            if not self._has_queue(queue):
                raise

    def exchange_declare(self, exchange: str | None = None, type: str = "direct", **kwargs: Any) -> Any:
        if type == "fanout" and exchange not in _FANOUTS_SAID:
            # kombu would drop what is published there without a word, and
            # `celery inspect` would say only that no worker replied.
            _FANOUTS_SAID.add(exchange)
            logger.warning(
                "mwmq has no fanout exchanges: what is sent to %r reaches no one (celery inspect, "
                "control and revoke, and broadcast queues, do not work on mwmq; see docs/mwmq.md, "
                "What Celery cannot do here)",
                exchange,
            )
        return super().exchange_declare(exchange, type, **kwargs)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        try:
            self.client.length(self._queue_name(queue))
        except NoQueue:
            return False
        return True

    def _size(self, queue: str) -> int:
        return self.client.length(self._queue_name(queue))

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(NoQueue):
            self.client.drop_queue(self._queue_name(queue))

    def _purge(self, queue: str) -> int:
        """Removes the messages ready now (delayed and leased ones stay)."""
        name, purged = self._queue_name(queue), 0
        while True:
            msgs = self.client.recv(name, count=1000, vt_ms=60_000)
            if not msgs:
                return purged
            self.client.ack_many(msgs)
            purged += len(msgs)

    # -- sending

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        name, body = self._queue_name(queue), dumps(message)
        options = {"delay_ms": delay_ms(message), "priority": self._get_message_priority(message) or None}
        cursor = _SQL_CURSOR.get()
        if cursor is not None:
            sql.send(cursor, name, body, **options)
        else:
            self.client.send(name, body, **options)

    # -- receiving

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._noack_queues.add(queue)
        else:
            self.connection.keep_leases()
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        if queue is not None:
            self._noack_queues.discard(queue)
        return super().basic_cancel(consumer_tag)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        if not no_ack:
            self.connection.keep_leases()
        try:
            payload = self._get(queue, no_ack=no_ack)
        except Empty:
            return None
        message = self.Message(payload, channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _get(self, queue: str, timeout: float | None = None, no_ack: bool = False) -> dict[str, Any]:
        for payload in self._take(queue, 1, 0, no_ack):
            return payload
        raise Empty()

    def _poll(self, cycle: Any, callback: Any, timeout: float | None = None) -> Any:
        return cycle.get(callback, timeout=timeout)

    def _reset_cycle(self) -> None:
        self._cycle = FairCycle(self._get_bulk, self._active_queues, Empty)

    def drain_events(self, timeout: float | None = None, callback: Any = None, **kwargs: Any) -> None:
        self.waited = self.full = False
        if not self._consumers:
            raise Empty()
        if not self._room():
            self.full = True
            raise Empty()
        self._poll(self.cycle, callback, timeout=timeout)

    def _room(self) -> bool:
        """Whether to RECV now: the prefetch has room for a quarter of it
        (one at least). Refilling one message at a time would cost a RECV
        per task; a worker still holds three quarters meanwhile."""
        room = self.qos.can_consume_max_estimate()
        return room is None or room >= max(1, int(self.qos.prefetch_count or 0) // 4)

    def _get_bulk(self, queue: str, callback: Any = None, timeout: float | None = None) -> None:
        """Delivers what one RECV of `queue` gives (up to what the prefetch
        allows). A consumer of one queue waits in mwmq for it; with several
        each is looked at in turn without waiting."""
        room = self.qos.can_consume_max_estimate()
        count = self.prefetch_max if room is None else min(room, 1000)
        if count <= 0:
            raise Empty()
        wait_ms = 0
        if len(self._active_queues) == 1:
            wait = float(self.wait_time_seconds)
            if timeout is not None:
                wait = min(wait, timeout)
            wait_ms = int(wait * 1000)
            self.waited = wait_ms > 0
        payloads = self._take(queue, count, wait_ms, queue in self._noack_queues)
        if not payloads:
            raise Empty()
        for payload in payloads:
            self.connection._deliver(payload, queue)

    def _take(self, queue: str, count: int, wait_ms: int, no_ack: bool) -> list[dict[str, Any]]:
        """Up to `count` kombu payloads from `queue`: leased (RECV), or taken
        for good (POP) for a consumer that does not acknowledge."""
        name = self._queue_name(queue)
        if no_ack:
            msgs = []
            for _ in range(count):
                m = self.client.pop(name)
                if m is None:
                    break
                msgs.append(m)
        else:
            msgs = self.client.recv(name, count=count, vt_ms=self.vt_ms, wait_ms=wait_ms or None)
        payloads = []
        for m in msgs:
            payload = self._payload(m)
            if payload is not None:
                payloads.append(payload)
        return payloads

    def _payload(self, m: MwmqMessage) -> dict[str, Any] | None:
        """The kombu payload a message carries, marked with its delivery; None
        for one kombu could not read (see `_refuse`)."""
        try:
            payload = loads(m.body)
            problem = malformed(payload)
        except (ValueError, TypeError, RecursionError) as e:  # not JSON, not UTF-8, nested too deep
            payload, problem = None, str(e) or type(e).__name__
        if problem is None:
            properties = payload["properties"]
            if m.lease is not None:
                info = properties.get("delivery_info") or {}
                info["mwmq"] = {"queue": m.queue, "id": m.id, "lease": m.lease}
                properties["delivery_info"] = info
            # One tag per delivery: a message delivered again is another delivery.
            properties["delivery_tag"] = f"{m.queue}/{m.id}/{m.lease}"
            try:
                self.Message(payload, channel=self)  # as kombu will read it: its body decodes
            except Exception as e:
                problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            self._refuse(m, problem)
            return None
        return payload

    def _refuse(self, m: MwmqMessage, problem: str) -> None:
        """A message kombu did not write (a SEND by another program, a
        truncated or hand-made envelope) never reaches kombu, where it would
        fail every round before the messages behind it. On a queue with
        MAXDELIVERIES it is NACKed, so that it ends in the queue's dead
        letters (or is dropped by mwmq without a DEADLETTER) once its
        deliveries are spent; on a queue without, it is dropped (ACK), as
        Celery drops a message it cannot decode. Logged either way."""
        limited = False
        if m.lease is not None:  # (one taken by POP is gone already)
            with contextlib.suppress(MwmqError):
                limited = self.client.info(m.queue).max_deliveries > 0
        fate = "given back for the queue's MAXDELIVERIES to dead-letter it" if limited else "dropped"
        logger.error("mwmq: message %s of %r is not a kombu message (%s): %s", m.id, m.queue, problem, fate)
        if m.lease is None:
            return
        if limited:
            self.client.nack(m)
        else:
            self.client.ack(m)

    # -- settling

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        held = self.qos.release(delivery_tag)
        if held is not None:
            acker = self.connection.acker
            if acker is not None:
                acker.ack(held)
            else:
                self.connection.acked(held, self.client.ack(held))
        super().basic_ack(delivery_tag, multiple)
        self.connection.freed.set()

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if not requeue:
            held = self.qos.release(delivery_tag)
            if held is not None:
                self.client.ack(held)
        # With requeue, QoS.reject gives it back through _restore (a NACK).
        super().basic_reject(delivery_tag, requeue)
        self.connection.freed.set()

    def _restore(self, message: Any) -> None:
        """Gives a held message back (NACK: visible again at once, or after
        the queue's BACKOFF)."""
        held = self.qos.release(message.delivery_tag)
        if held is None:
            info = (message.delivery_info or {}).get("mwmq")
            if not info:
                super()._restore(message)
                return
            held = held_delivery(info)
        self.client.nack(held)


class LeaseKeeper(threading.Thread):
    """Renews the leases of every message the transport's channels hold,
    every third of the visibility timeout, until stopped."""

    def __init__(self, transport: Transport, vt_ms: int):
        super().__init__(name="mwmq-lease-keeper", daemon=True)
        self.transport = transport
        self.vt_ms = vt_ms
        self.stopping = threading.Event()

    def run(self) -> None:
        period = max(self.vt_ms / 3000, 0.05)
        while not self.stopping.wait(period):
            try:
                self.renew()
            except (MwmqError, rex.RedisError, OSError) as e:
                logger.warning("mwmq: renewing leases failed (%s); trying again in %.1f s", e, period)

    def renew(self) -> None:
        for channel in list(self.transport.channels):
            qos = channel._qos
            if qos is None:
                continue
            held = qos.held()
            for start in range(0, len(held), 500):
                if self.stopping.is_set():
                    return
                chunk = held[start : start + 500]
                renewed = self.transport.mwmq.touch_many([m for _, m in chunk], self.vt_ms)
                for (tag, m), ok in zip(chunk, renewed, strict=True):
                    if not ok and qos.release(tag):
                        logger.warning(
                            "mwmq: the lease of message %s of %r ran out while held: "
                            "it may be delivered again",
                            m.id,
                            m.queue,
                        )


class Transport(virtual.Transport):
    """kombu's transport for `mwmq://` (and `mwmqs://`, TLS) URLs."""

    Channel = Channel

    default_port = DEFAULT_PORT
    driver_type = "mwmq"
    driver_name = "mwmq"
    # kombu parses mwmq://user:password@host:port/ into the connection's fields.
    can_parse_url = False
    # Between rounds over several queues (one queue waits in RECV instead).
    polling_interval = 0.5

    implements = virtual.Transport.implements.extend(
        asynchronous=False,
        exchange_type=frozenset(["direct", "topic"]),
        heartbeats=False,
    )
    connection_errors = (
        *virtual.Transport.connection_errors,
        ConnectionLost,
        TryAgain,
        rex.ConnectionError,
        rex.TimeoutError,
    )
    channel_errors = (*virtual.Transport.channel_errors, MwmqError)

    def __init__(self, client: Any, **kwargs: Any):
        super().__init__(client, **kwargs)
        self._mwmq: Client | None = None
        self._keeper: LeaseKeeper | None = None
        self._keeper_lock = threading.Lock()
        # Set when a message is acknowledged or rejected: room in a full
        # prefetch, which drain_events waits for (Celery's pool threads and
        # result handler settle messages while its main thread drains).
        self.freed = threading.Event()
        self._acker: Acker | None = None

    @property
    def acker(self) -> Acker | None:
        """What sends ACKs in the background (None with `ack_threads` 0)."""
        options = self.client.transport_options or {}
        threads = int(options.get("ack_threads", Channel.ack_threads))
        if threads <= 0:
            return None
        with self._keeper_lock:
            if self._acker is None:
                self._acker = Acker(self.mwmq, threads, self.acked)
            return self._acker

    def acked(self, held: MwmqMessage, result: bool | BaseException) -> None:
        """What became of an ACK: said in the log unless it went through."""
        if result is False:
            logger.warning(
                "mwmq: the lease of message %s of %r had run out before its ACK: it may have been "
                "delivered again (raise visibility_timeout)",
                held.id,
                held.queue,
            )
        elif isinstance(result, BaseException):
            logger.warning(
                "mwmq: the ACK of message %s of %r failed (%s): it comes back after its lease",
                held.id,
                held.queue,
                result,
            )

    @property
    def mwmq(self) -> Client:
        """The mwmq client of this connection, made on first use."""
        if self._mwmq is None:
            self._mwmq = self._make_client()
        return self._mwmq

    def _make_client(self) -> Client:
        conninfo = self.client
        options = conninfo.transport_options or {}
        tls = conninfo.ssl or conninfo.transport_cls == "mwmqs"
        host = conninfo.hostname or "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        ssl_options = conninfo.ssl if isinstance(conninfo.ssl, dict) else {}
        wait = float(options.get("wait_time_seconds", Channel.wait_time_seconds))
        return Client(
            f"{'mwmqs' if tls else 'mwmq'}://{host}:{conninfo.port or self.default_port}",
            username=conninfo.userid or None,
            password=conninfo.password or None,
            ssl=bool(tls),
            socket_connect_timeout=conninfo.connect_timeout or 5.0,
            # Each reply within this, a RECV's wait included.
            socket_timeout=wait + 30.0,
            auto_key=bool(options.get("send_keys", Channel.send_keys)),
            **ssl_options,
        )

    def keep_leases(self) -> None:
        """Starts renewing held messages' leases (once; not with lease_renewal off)."""
        options = self.client.transport_options or {}
        if not options.get("lease_renewal", Channel.lease_renewal):
            return
        with self._keeper_lock:
            if self._keeper is None:
                vt = float(options.get("visibility_timeout", Channel.visibility_timeout))
                self._keeper = LeaseKeeper(self, max(1, int(vt * 1000)))
                self._keeper.start()

    def establish_connection(self) -> Any:
        self.mwmq.ping()
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stopping.set()
        try:
            super().close_connection(connection)
        finally:
            if keeper is not None and keeper is not threading.current_thread():
                keeper.join(5)
            acker, self._acker = self._acker, None
            if acker is not None and not acker.close(10.0):
                logger.warning(
                    "mwmq: %d ACKs unanswered at the close: they come back after their lease", acker.pending
                )
            if self._mwmq is not None:
                self._mwmq.close()
                self._mwmq = None

    def verify_connection(self, connection: Any) -> bool:
        """True, without a round trip: kombu asks before every publish
        (`Connection.connected`), and the client reconnects and fails over
        by itself at its next request (a PING here cost a round trip per
        task sent). kombu's own transports answer the same."""
        return True

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """Delivers what the channels' consumers get; without anything, waits
        in RECV (one queue) or sleeps `polling_interval` (several) until
        `timeout`. With the prefetch full, waits for a message to be settled
        instead (at most `polling_interval`)."""
        start = monotonic()
        while True:
            self.freed.clear()
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                pass
            left = None if timeout is None else timeout - (monotonic() - start)
            if left is not None and left <= 0:
                raise TimeoutError()  # socket.timeout, which kombu's callers catch
            if any(getattr(c, "waited", False) for c in self.channels):
                continue
            pause = float(self.polling_interval or 0)
            pause = pause if left is None else min(pause, left)
            if any(getattr(c, "full", False) for c in self.channels):
                self.freed.wait(pause)
            else:
                sleep(pause)

    def driver_version(self) -> str:
        from . import __version__

        return __version__


# `import mwmq.kombu` is enough for kombu to know the schemes, wherever the
# startup hook (_mwmq_kombu) did not run (python -S, an unusual install).
TRANSPORT_ALIASES.setdefault("mwmq", "mwmq.kombu:Transport")
TRANSPORT_ALIASES.setdefault("mwmqs", "mwmq.kombu:Transport")
