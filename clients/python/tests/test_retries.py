"""Retries and failover against real failures: a reply lost after the SEND
ran (a relay that cuts the connection), `-TRYAGAIN` from a frozen
PostgreSQL, an address where nothing listens, and an mwmq SIGKILLed under
the client. A retried SEND is never stored twice: it carries a KEY."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from mwlab.procs import free_port

import mwmq

from conftest import Mwmq, Site
from relay import CuttingRelay


class Records(logging.Handler):
    """The client's log records (from any thread)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Records:
    h = Records()
    logger = logging.getLogger("mwmq")
    old = logger.level
    logger.addHandler(h)
    logger.setLevel(logging.DEBUG)
    yield h
    logger.removeHandler(h)
    logger.setLevel(old)


def test_a_send_whose_reply_is_lost_is_retried_with_its_key_and_stored_once(
    client: mwmq.Client, mq: Mwmq, queue: str
):
    client.create_queue(queue)
    relay = CuttingRelay(mq.port)
    try:
        with mwmq.Client(f"redis://app:app-secret@127.0.0.1:{relay.port}", retries=3) as through:
            assert through.ping()
            relay.arm()
            mid = through.send(queue, "once")  # ran, reply lost, sent again with the same KEY
            assert relay.cuts == 1
            assert client.length(queue) == 1
            [m] = client.recv(queue)
            assert (m.id, m.body) == (mid, b"once") and client.ack(m)

            relay.arm()
            ids = through.send_many(queue, [f"n{i}" for i in range(5)])
            assert relay.cuts == 2 and len(set(ids)) == 5
            assert sorted(m.id for m in client.recv(queue, count=10)) == sorted(ids)

        # Without auto_key, a SEND without a key is not sent again: it may
        # have run, and it did.
        with mwmq.Client(f"redis://app:app-secret@127.0.0.1:{relay.port}", auto_key=False) as keyless:
            assert keyless.ping()
            relay.arm()
            with pytest.raises(mwmq.ConnectionLost, match="whether it ran is unknown"):
                keyless.send(queue, "maybe")
            assert relay.cuts == 3
            assert client.peek(queue) is not None and client.peek(queue).body == b"maybe"
            # One with a key is.
            relay.arm()
            mid = keyless.send(queue, "keyed", key="k-1")
            assert relay.cuts == 4
            assert keyless.send(queue, "keyed", key="k-1") == mid
    finally:
        relay.close()


def test_tryagain_from_a_frozen_database_is_retried_and_sends_once(
    site: Site, client: mwmq.Client, queue: str, records: Records
):
    """PostgreSQL SIGSTOPped: mwmq answers -TRYAGAIN once a statement
    outlives statement_timeout_ms (docs/mwmq.md, A database that does not
    answer). A keyed SEND is retried until the database is back; one without
    a key (auto_key off) raises TryAgain."""
    client.create_queue(queue)
    fast = site.start("[database]\nstatement_timeout_ms = 300\n")
    url = fast.url("app")
    results: dict[str, object] = {}

    def send(name: str, **kw: object) -> None:
        with mwmq.Client(url, retry_backoff=(0.05, 0.3), retries=200, **kw) as c:
            c.ping()
            try:
                results[name] = c.send(queue, name)
            except mwmq.MwmqError as e:
                results[name] = e

    frozen = site.freeze_postgres()
    try:
        threads = [
            threading.Thread(target=send, args=("keyed",)),
            threading.Thread(target=send, args=("keyless",), kwargs={"auto_key": False}),
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            r.msg.endswith("trying again in %.2f s") for r in records.records
        ):
            time.sleep(0.05)
        retried = [r for r in records.records if getattr(r, "mwmq_command", "") == "SEND"]
        assert retried and "TRYAGAIN" in retried[0].mwmq_error
    finally:
        site.thaw(frozen)
    for t in threads:
        t.join(60)
    assert isinstance(results["keyless"], mwmq.TryAgain)
    mid = results["keyed"]
    assert isinstance(mid, str)
    got = client.recv(queue, count=10)
    assert [(m.id, m.body) for m in got] == [(mid, b"keyed")]
    fast.kill()


def test_failover_to_the_next_address(site: Site, mq: Mwmq, queue: str):
    nothing = f"redis://127.0.0.1:{free_port()}"
    with mwmq.Client([nothing, mq.url("app")], retries=0) as c:
        c.create_queue(queue)
        assert c.address == f"redis://127.0.0.1:{mq.port}"
    # Two mwmq processes on one database; the first is SIGKILLed under the client.
    first = site.start()
    with mwmq.Client([first.url("app"), mq.url("app")], retries=2) as c:
        c.send(queue, "via first")
        [m] = c.recv(queue, vt_ms=30_000)
        assert c.address == f"redis://127.0.0.1:{first.port}"
        first.kill()
        mid = c.send(queue, "via second")
        assert c.address == f"redis://127.0.0.1:{mq.port}"
        assert c.ack(m)  # a lease is the database's: the other process honours it
        [m2] = c.recv(queue)
        assert (m2.id, m2.body) == (mid, b"via second") and c.ack(m2)
