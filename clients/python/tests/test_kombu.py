"""mwmq.kombu at kombu's level, without a Celery worker: what its round trips
and its waits are (bench/celery.sh measures what they are worth). Counted
or waited for with generous deadlines, never timed: an ACK handed to the
background goes out while its caller goes on, a full prefetch takes the
next message as soon as one is settled (not after `polling_interval`), a
publish costs its SEND and no PING. An mwmq process of the module's own,
which one test stops (SIGSTOP) for a while."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import kombu
import psycopg
import pytest
from kombu.pools import producers

import mwmq
import mwmq.kombu
from mwmq.acker import Acker

from conftest import Mwmq, Site

T = TypeVar("T")
PREFIX = "kombu-test."


def until(what: Callable[[], T], deadline: float = 30.0, why: str = "") -> T:
    """`what()` once it is truthy, polled until the deadline (then a failure saying why)."""
    end = time.monotonic() + deadline
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > end:
            pytest.fail(f"not within {deadline} s: {why}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def own(site: Site) -> Iterator[Mwmq]:
    """An mwmq of this module's own (on the session's database)."""
    m = site.start()
    yield m
    m.proc.send_signal(signal.SIGCONT)
    m.kill()


def connection(m: Mwmq, **options: Any) -> kombu.Connection:
    return kombu.Connection(
        f"mwmq://app:app-secret@127.0.0.1:{m.port}//",
        transport_options={"queue_name_prefix": PREFIX, **options},
    )


def commands(client: mwmq.Client) -> int:
    """The commands the mwmq process has carried out (INFO's count, this INFO included)."""
    info = dict(line.split(":", 1) for line in client.execute("INFO").decode().splitlines() if ":" in line)
    return int(info["total_commands_processed"])


def test_a_publish_is_one_send_without_a_ping(own: Mwmq, queue: str) -> None:
    """kombu asks `connected` each time a producer is taken from its pool
    (as Celery's `delay()` does): answered without a round trip, 20 publishes
    are 20 SENDs. (A PING there made them 40 commands.)"""
    with connection(own) as conn, mwmq.Client(own.url("app")) as client:
        q = kombu.Queue(queue)
        with producers[conn].acquire(block=True) as p:
            p.publish({"n": -1}, routing_key=queue, declare=[q])
        before = commands(client)
        for n in range(20):
            with producers[conn].acquire(block=True) as p:
                p.publish({"n": n}, routing_key=queue, retry=True)
        spent = commands(client) - before - 1
        assert client.length(PREFIX + queue) == 21
        assert spent == 20, f"{spent} commands for 20 publishes"


def test_an_ack_does_not_wait_for_mwmq_and_the_close_sends_it(own: Mwmq, queue: str) -> None:
    """message.ack() hands the ACK to the transport's ACK threads and
    returns while mwmq does not answer (stopped); once it answers, closing
    the connection waits for the ACK: the queue is empty right after."""
    conn = connection(own)
    with mwmq.Client(own.url("app")) as client:
        q = kombu.Queue(queue)
        with producers[conn].acquire(block=True) as p:
            p.publish({"n": 1}, routing_key=queue, declare=[q])
        got: list[Any] = []
        consumer = conn.Consumer(q, callbacks=[lambda body, msg: got.append(msg)], prefetch_count=1)
        consumer.consume()
        until(lambda: conn.drain_events(timeout=5) or got, why="the message delivered")
        own.proc.send_signal(signal.SIGSTOP)
        try:
            acking = threading.Thread(target=got[0].ack, daemon=True)
            acking.start()
            acking.join(30)
            assert not acking.is_alive(), "ack() waited for mwmq's answer"
        finally:
            own.proc.send_signal(signal.SIGCONT)
        consumer.cancel()
        conn.release()
        assert client.length(PREFIX + queue) == 0


def test_a_full_prefetch_takes_more_as_soon_as_one_is_acked(own: Mwmq, queue: str) -> None:
    """With the prefetch full, drain_events waits for a message to be
    settled, not for `polling_interval` (an hour here): a message acked on
    another thread (as Celery's pool threads do) lets the next one in while
    the drain runs."""
    with connection(own, polling_interval=3600) as conn:
        q = kombu.Queue(queue)
        with producers[conn].acquire(block=True) as p:
            for n in range(2):
                p.publish({"n": n}, routing_key=queue, declare=[q])
        got: list[Any] = []
        consumer = conn.Consumer(q, callbacks=[lambda body, msg: got.append(msg)], prefetch_count=1)
        consumer.consume()
        until(lambda: conn.drain_events(timeout=5) or got, why="the first message delivered")
        assert len(got) == 1

        def drain() -> None:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=60)

        draining = threading.Thread(target=drain, daemon=True)
        draining.start()
        until(lambda: consumer.channel.full, why="the drain finding the prefetch full")
        got[0].ack()
        until(lambda: len(got) == 2, why="the second message delivered after the first one's ACK")
        got[1].ack()
        draining.join(60)
        consumer.cancel()


def test_an_ack_of_a_lost_lease_is_logged(own: Mwmq, queue: str, caplog: pytest.LogCaptureFixture) -> None:
    """An ACK answered 0 (the lease given back meanwhile) is said in the
    log, from the ACK threads, by the time the connection is closed."""
    conn = connection(own)
    with mwmq.Client(own.url("app")) as client:
        q = kombu.Queue(queue)
        with producers[conn].acquire(block=True) as p:
            p.publish({"n": 1}, routing_key=queue, declare=[q])
        got: list[Any] = []
        consumer = conn.Consumer(q, callbacks=[lambda body, msg: got.append(msg)], prefetch_count=1)
        consumer.consume()
        until(lambda: conn.drain_events(timeout=5) or got, why="the message delivered")
        held = mwmq.kombu.held_delivery(got[0].delivery_info["mwmq"])
        assert client.nack(held, delay_ms=60_000)
        with caplog.at_level("WARNING", logger="mwmq.kombu"):
            got[0].ack()
            consumer.cancel()
            conn.release()
        assert "had run out before its ACK" in caplog.text
        assert client.length(PREFIX + queue) == 1


def test_send_keys_off_sends_without_a_key(site: Site, own: Mwmq, queue: str) -> None:
    """Every publish is a SEND with a KEY of its own (mwmq keeps it for the
    dedup window); with the transport option send_keys False, without one."""
    for keys, name in ((True, f"{queue}-keyed"), (False, f"{queue}-plain")):
        with connection(own, send_keys=keys) as conn, producers[conn].acquire(block=True) as p:
            for n in range(3):
                p.publish({"n": n}, routing_key=name, declare=[kombu.Queue(name)])
    with psycopg.connect(site.pg.conninfo, autocommit=True) as db:
        rows = db.execute(
            "SELECT q.name, count(k.key) FROM mwmq.mwmq_queues q"
            " LEFT JOIN mwmq.mwmq_keys k ON k.queue_id = q.id"
            " WHERE q.name LIKE %s AND q.dropped_at IS NULL GROUP BY q.name",
            (f"{PREFIX}{queue}-%",),
        ).fetchall()
    assert dict(rows) == {f"{PREFIX}{queue}-keyed": 3, f"{PREFIX}{queue}-plain": 0}


def test_an_acker_in_a_forked_child_sends_the_childs_acks(own: Mwmq, queue: str) -> None:
    """A child forked from a process whose Acker runs (its threads not
    copied) starts threads of its own for its ACKs."""
    with mwmq.Client(own.url("app")) as client:
        client.create_queue(queue)
        client.send_many(queue, [b"parent", b"child"])
        got: list[mwmq.Message] = []
        until(lambda: got.extend(client.recv(queue, count=2 - len(got))) or len(got) == 2, why="two messages")
        first, second = got
        acker = Acker(client, threads=2)
        acker.ack(first)
        assert acker.flush(30)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
            pid = os.fork()
        if pid == 0:
            try:
                acker.ack(second)
                os._exit(0 if acker.flush(30) else 1)
            finally:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's ACK was not sent"
        assert client.length(queue) == 0
        acker.close()
