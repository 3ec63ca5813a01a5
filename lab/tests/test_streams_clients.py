"""mwmq's Redis Streams as stream workers see them, unchanged: redis-py's
stream methods over TLS with a user (RESP2 and RESP3), and FastStream's
Redis broker with a consumer group of two consumers."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_tls_clients import pki  # noqa: F401  (the fixture)

from mwlab.procs import Postgres, ProcessGroup, binary, free_port, wait_port


def user_table(name: str, password: str, pattern: str) -> str:
    return subprocess.run(
        [
            *(str(binary("mwmq")), "user", "add", name, "--password-stdin"),
            *("--send", pattern, "--receive", pattern, "--admin", pattern),
        ],
        input=f"{password}\n".encode(),
        capture_output=True,
        check=True,
    ).stdout.decode()


@pytest.fixture
def mwmq(tmp_path: Path, pki) -> Iterator[tuple[int, int]]:  # noqa: F811
    """mwmq over a throwaway PostgreSQL: a TLS port with user `app`
    (rights on `app.*`), and a plaintext loopback port beside it."""
    config = tmp_path / "mwmq.toml"
    config.write_text(user_table("app", "app-secret", "app.*"))
    config.chmod(0o600)
    with Postgres(tmp_path / "pg") as pg, ProcessGroup(tmp_path / "mq") as group:
        tls_port, plain_port = free_port(), free_port()
        cmd = [str(binary("mwmq")), "-c", str(config), "--listen", f"127.0.0.1:{tls_port}"]
        cmd += ["--db", pg.conninfo, "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"])]
        cmd += ["--plain-listen", f"127.0.0.1:{plain_port}", "--log", "warn"]
        group.start("mwmq", cmd)
        wait_port(tls_port)
        wait_port(plain_port)
        yield tls_port, plain_port


def test_redis_py_stream_methods_over_tls_with_a_user(mwmq, pki):  # noqa: F811
    import redis

    tls_port, _ = mwmq
    for protocol in (2, 3):
        r = redis.Redis(
            port=tls_port,
            ssl=True,
            ssl_ca_certs=str(pki["ca"]),
            username="app",
            password="app-secret",
            protocol=protocol,
            decode_responses=True,
        )
        s = f"app.orders{protocol}"
        assert r.xgroup_create(s, "billing", id="0", mkstream=True)
        ids = [r.xadd(s, {"n": str(i), "item": f"book {i}"}) for i in range(5)]
        assert r.xlen(s) == 5
        assert [e[0] for e in r.xrange(s, count=2)] == ids[:2]
        assert [e[0] for e in r.xrevrange(s, max=ids[3], min=ids[1])] == [ids[3], ids[2], ids[1]]
        read = r.xread({s: ids[2]})
        entries = read[s][0] if protocol == 3 else read[0][1]
        assert [e[0] for e in entries] == ids[3:]
        got = r.xreadgroup("billing", "w1", {s: ">"}, count=3)
        entries = got[s][0] if protocol == 3 else got[0][1]
        assert [e[0] for e in entries] == ids[:3]
        assert entries[0][1] == {"n": "0", "item": "book 0"}
        assert r.xack(s, "billing", ids[0]) == 1
        summary = r.xpending(s, "billing")
        assert summary["pending"] == 2 and summary["min"] == ids[1] and summary["max"] == ids[2]
        assert summary["consumers"] == [{"name": "w1", "pending": 2}]
        rows = r.xpending_range(s, "billing", min="-", max="+", count=10, consumername="w1")
        assert [x["message_id"] for x in rows] == ids[1:3]
        assert all(x["times_delivered"] == 1 for x in rows)
        claimed = r.xclaim(s, "billing", "w2", min_idle_time=0, message_ids=[ids[1]])
        assert [e[0] for e in claimed] == [ids[1]]
        cursor, auto, deleted = r.xautoclaim(s, "billing", "w2", min_idle_time=0, start_id="0-0")
        assert [e[0] for e in auto] == ids[1:3] and deleted == [] and cursor == "0-0"
        info = r.xinfo_stream(s)
        assert info["length"] == 5 and info["groups"] == 1 and info["last-generated-id"] == ids[-1]
        [group] = r.xinfo_groups(s)
        assert group["name"] == "billing" and group["pending"] == 2 and group["last-delivered-id"] == ids[2]
        consumers = {c["name"]: c["pending"] for c in r.xinfo_consumers(s, "billing")}
        assert consumers == {"w1": 0, "w2": 2}
        assert r.xgroup_delconsumer(s, "billing", "w2") == 2
        assert r.xdel(s, ids[4]) == 1
        assert r.xtrim(s, maxlen=2, approximate=False) == 2
        assert r.type(s) == "stream" and r.exists(s) == 1
        assert r.xgroup_destroy(s, "billing") == 1
        assert r.delete(s) == 1 and r.exists(s) == 0
        # Beyond the user's rights, and what mwmq does not have.
        with pytest.raises(redis.exceptions.ResponseError, match="no permissions"):
            r.xadd("payroll", {"x": "1"})
        with pytest.raises(redis.exceptions.ResponseError, match="unknown command"):
            r.set("app.k", "v")
        r.close()


def test_faststream_stream_subscribers_in_one_group_share_the_work(mwmq):
    """Two FastStream apps subscribe to one stream with one group (consumers
    a and b); a publisher sends 40 messages: each is handled once, by one
    of them, and acknowledged (nothing left pending)."""
    import redis
    import redis.asyncio as aioredis
    from faststream.redis import RedisBroker, StreamSub

    _, plain_port = mwmq
    url = f"redis://app:app-secret@127.0.0.1:{plain_port}"
    handled: list[tuple[str, int]] = []

    def app(consumer: str) -> RedisBroker:
        broker = RedisBroker(url)

        sub = StreamSub("app.jobs", group="workers", consumer=consumer, polling_interval=50)

        @broker.subscriber(stream=sub)
        async def handle(n: int) -> None:
            handled.append((consumer, n))

        return broker

    async def main() -> None:
        brokers = [app("a"), app("b")]
        for b in brokers:
            await b.start()
        publisher = RedisBroker(url)
        await publisher.connect()
        for n in range(40):
            await publisher.publish(n, stream="app.jobs")
        deadline = time.monotonic() + 30
        while len(handled) < 40 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # The handlers returned; their acknowledgements follow: wait for them
        # (not for a fixed time) before the apps stop.
        watch = aioredis.Redis(port=plain_port, username="app", password="app-secret")
        while time.monotonic() < deadline and (await watch.xpending("app.jobs", "workers"))["pending"]:
            await asyncio.sleep(0.05)
        await watch.aclose()
        for b in [*brokers, publisher]:
            await b.stop()

    asyncio.run(main())
    assert sorted(n for _, n in handled) == list(range(40)), "each message handled exactly once"
    r = redis.Redis(port=plain_port, username="app", password="app-secret")
    assert r.xpending("app.jobs", "workers")["pending"] == 0, "every message acknowledged"
    r.close()


def test_go_redis_workers_share_a_group_and_rescue_a_dead_one(mwmq, goredis_worker: Path):
    """go-redis (v9), unchanged: two workers in a group (XReadGroup with
    BLOCK, XAck), one that dies holding a batch, XAutoClaim of what it held;
    every message handled once, nothing pending (lab/tests/goredis, built
    while the session's other tests run: conftest.py)."""
    import json

    exe = goredis_worker
    _, plain_port = mwmq
    run = subprocess.run(
        [str(exe), f"127.0.0.1:{plain_port}", "app", "app-secret"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(run.stdout)
    assert summary["handled"] == 60 and summary["pending"] == 0 and summary["rescued"] == 5
    assert summary["lag"] == 0 and summary["entries_read"] == 60
    assert set(summary["by"]) <= {"w1", "w2", "rescuer"} and summary["by"]["rescuer"] == 5
