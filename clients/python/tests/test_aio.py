"""The asyncio client against a real mwmq: its every call, its errors, TLS
with a user, a lost reply retried with its KEY, failover, and a waiting RECV
that is cancelled."""

from __future__ import annotations

import asyncio

import pytest
from mwlab.procs import free_port

import mwmq
from mwmq.aio import AsyncClient

from conftest import Mwmq
from relay import CuttingRelay


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_every_call(mq: Mwmq, queue: str):
    async def main() -> None:
        async with AsyncClient(mq.url("app")) as c:
            dlq = f"{queue}.dead"
            assert await c.create_queue(dlq)
            assert await c.create_queue(queue, max_deliveries=1, dead_letter=dlq, backoff=(100, 1000))
            assert not await c.create_queue(queue, exist_ok=True)
            a = await c.send(queue, "a", priority=1)
            b, d = await c.send_many(queue, [b"b", b"d"])
            assert await c.length(queue) == 3
            assert (await c.peek(queue)).id == a
            got = await c.recv(queue, count=2, vt_ms=5000)
            assert [m.id for m in got] == [a, b]
            assert await c.touch(got[0], 10_000)
            assert await c.ack_many(got) == [True, True]
            assert not await c.nack(got[0])
            popped = await c.pop(queue)
            assert popped is not None and popped.id == d and popped.body == b"d"
            assert await c.recv(queue, wait_ms=20) == []

            e = await c.send(queue, "e")
            [m] = await c.recv(queue, vt_ms=5000)
            assert await c.nack(m, delay_ms=0)
            assert await c.recv(queue) == []  # dead-lettered
            [dead] = await c.dead_letters(queue)
            assert (dead.id, dead.origin, dead.body) == (e, queue, b"e")
            assert await c.redrive(dlq, to=queue) == 1

            await c.alter_queue(queue, max_messages=10, backoff=False)
            await c.pause(queue)
            info = await c.info(queue)
            assert info.paused and info.max_messages == 10 and info.backoff_base_ms == 0
            await c.resume(queue)
            assert queue in await c.queues()
            await c.schedule(f"{queue}-tick", queue, "@daily", "tick")
            assert [s.name for s in await c.schedules() if s.queue == queue] == [f"{queue}-tick"]
            assert await c.unschedule(f"{queue}-tick")
            await c.drop_queue(queue)
            with pytest.raises(mwmq.NoQueue):
                await c.send(queue, "x")
            with pytest.raises(mwmq.Exists):
                await c.create_queue(dlq)
            assert await c.execute("PING") == b"PONG"
            assert await c.ping()

    run(main())


def test_errors_tls_and_rights(mq: Mwmq, pki, queue: str):
    async def main() -> None:
        async with AsyncClient(mq.url("app", tls=True), ssl_ca_certs=str(pki["ca"])) as c:
            await c.create_queue(queue, max_messages=1)
            await c.send(queue, "x")
            with pytest.raises(mwmq.OverQuota):
                await c.send(queue, "y")
            with pytest.raises(mwmq.BadRequest, match="COUNT must be between 1 and 1000"):
                await c.recv(queue, count=-1)
        async with AsyncClient(mq.url("sender")) as s:
            with pytest.raises(mwmq.NoPerm):
                await s.recv(queue)
        async with AsyncClient(f"redis://app:nope@127.0.0.1:{mq.port}") as w:
            with pytest.raises(mwmq.WrongPass):
                await w.ping()

    run(main())


def test_lost_reply_failover_and_a_cancelled_wait(mq: Mwmq, queue: str):
    relay = CuttingRelay(mq.port)

    async def main() -> None:
        nothing = f"redis://127.0.0.1:{free_port()}"
        url = f"redis://app:app-secret@127.0.0.1:{relay.port}"
        async with AsyncClient([nothing, url], retries=2) as c:
            await c.create_queue(queue)
            assert c.address == f"redis://127.0.0.1:{relay.port}"
            relay.arm()
            mid = await c.send(queue, "once")
            assert relay.cuts == 1 and await c.length(queue) == 1
            # A RECV waiting for 30 s, cancelled: its connection is closed,
            # and whatever it might have leased comes back at once.
            await c.create_queue(f"{queue}.empty")
            waiting = asyncio.ensure_future(c.recv(f"{queue}.empty", wait_ms=30_000))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            [m] = await c.recv(queue)
            assert (m.id, m.body) == (mid, b"once")

    try:
        run(main())
    finally:
        relay.close()
