"""The sync client against a real mwmq: every call, every error class, TLS
with a user, and what an attacker may try (bodies that are not UTF-8, a body
at the server's limit and over it, another user's leases, a user without
the right to receive, a server with a valid certificate for another name),
and where a password must never show (errors, reprs, tracebacks with their
locals)."""

from __future__ import annotations

import traceback

import pytest
from mwlab.procs import free_port

import mwmq

from conftest import MAX_BODY, Mwmq, Site

# Module constants, not locals: a traceback's locals would show a local.
WRONG = "wrong-horse-battery"
SECRET = "correct-horse-battery"


def test_send_recv_ack_nack_touch_pop_peek(client: mwmq.Client, queue: str):
    assert client.create_queue(queue) is True
    assert client.create_queue(queue, exist_ok=True) is False
    first = client.send(queue, "hello")
    assert isinstance(first, str)
    ids = client.send_many(queue, [b"a", "b", bytearray(b"c")])
    assert len(set([first, *ids])) == 4
    assert client.length(queue) == 4
    peeked = client.peek(queue)
    assert peeked is not None and peeked.id == first and peeked.lease is None and peeked.text == "hello"

    got = client.recv(queue, count=3, vt_ms=5000)
    assert [m.id for m in got] == [first, *ids[:2]]
    assert [m.body for m in got] == [b"hello", b"a", b"b"]
    assert all(m.queue == queue and isinstance(m.lease, int) and m.sender == "app" for m in got)
    assert client.touch(got[0], 10_000) is True
    assert client.ack(got[0]) is True
    assert client.ack(got[0]) is False  # the lease is no longer current
    assert client.ack(queue, got[1].id, got[1].lease) is True
    assert client.nack(got[2]) is True  # back at once (no backoff)
    assert client.nack(got[2]) is False
    assert client.touch(queue, got[2].id, got[2].lease, 1000) is False

    popped = client.pop(queue)
    assert popped is not None and popped.id == ids[1] and popped.body == b"b" and popped.lease is None
    last = client.pop(queue)
    assert last is not None and last.body == b"c"
    assert client.pop(queue) is None and client.peek(queue) is None
    assert client.recv(queue, wait_ms=50) == []


def test_send_options_key_delay_priority_group_to(client: mwmq.Client, queue: str):
    client.create_queue(queue)
    one = client.send(queue, "x", key="order-17")
    assert client.send(queue, "x again", key="order-17") == one  # mwmq's dedup: the first id
    late = client.send(queue, "later", delay_ms=60_000)
    high = client.send(queue, "urgent", priority=9)
    g1 = client.send(queue, "g1", group="cust-1")
    client.send(queue, "g2", group="cust-1")
    client.send(queue, "for bob", to="bob")
    got = client.recv(queue, count=10, vt_ms=5000)
    # Priority first; the delayed one and the group's second are held back;
    # the one addressed to bob is not app's.
    assert [m.id for m in got] == [high, one, g1]
    info = client.info(queue)
    assert info.delayed == 1 and info.leased == 3
    assert late not in [m.id for m in got]
    with pytest.raises(mwmq.BadRequest, match="PRIORITY must be between 0 and 9"):
        client.send(queue, "x", priority=12)


def test_json_and_text_helpers(client: mwmq.Client, queue: str):
    client.create_queue(queue)
    client.send(queue, '{"n": 17, "name": "café"}')
    [m] = client.recv(queue)
    assert m.json() == {"n": 17, "name": "café"}
    assert m.text == '{"n": 17, "name": "café"}'


def test_queue_management_info_dead_letters_redrive(client: mwmq.Client, queue: str):
    dlq = f"{queue}.dead"
    client.create_queue(dlq)
    client.create_queue(
        queue,
        max_deliveries=1,
        dead_letter=dlq,
        max_messages=100,
        max_bytes=1 << 20,
        concurrency=4,
        rate=50,
        backoff=(100, 1000, 10),
    )
    info = client.info(queue)
    assert (info.max_deliveries, info.dead_letter, info.max_messages, info.max_bytes) == (
        1,
        dlq,
        100,
        1 << 20,
    )
    assert (info.concurrency, info.rate_per_sec) == (4, 50.0)
    assert (info.backoff_base_ms, info.backoff_max_ms, info.backoff_jitter_pct) == (100, 1000, 10)
    assert info.paused is False and info.extra == {}

    client.alter_queue(queue, concurrency=0, rate="600/min", retain_ms=60_000, backoff=False)
    client.pause(queue)
    info = client.info(queue)
    assert info.paused and info.concurrency == 0 and info.rate_per_sec == 10.0
    assert info.retain_ms == 60_000 and info.backoff_base_ms == 0
    assert queue in client.queues()

    mid = client.send(queue, "doomed", priority=3)
    assert client.recv(queue) == []  # paused
    client.resume(queue)
    [m] = client.recv(queue, vt_ms=5000)
    assert client.nack(m, delay_ms=0)
    assert client.recv(queue) == []  # its one delivery was spent: moved to the dead letters
    [dead] = client.dead_letters(queue)
    assert (dead.id, dead.queue, dead.origin, dead.reason) == (mid, dlq, queue, "max_deliveries")
    assert dead.deliveries == 1 and dead.sender == "app" and dead.body == b"doomed"
    assert dead.sent_at_ms is not None
    assert client.redrive(dlq) == 1
    assert client.info(queue).ready_by_priority in ({3: 1}, {})  # QINFO's counts are cached for a second
    assert client.length(queue) == 1
    client.alter_queue(queue, dead_letter=False)
    assert client.info(queue).dead_letter is None
    with pytest.raises(ValueError, match="nothing to change"):
        client.alter_queue(queue)
    client.drop_queue(queue)
    assert queue not in client.queues()


def test_schedules(client: mwmq.Client, queue: str):
    client.create_queue(queue)
    client.schedule(
        f"{queue}-nightly", queue, "30 2 * * *", "report {tick}", tz="Europe/Berlin", catchup="one"
    )
    [s] = [s for s in client.schedules() if s.name == f"{queue}-nightly"]
    assert (s.queue, s.cron, s.tz, s.catchup, s.key_prefix) == (
        queue,
        "30 2 * * *",
        "Europe/Berlin",
        "one",
        f"{queue}-nightly@",
    )
    assert s.next_run_ms is not None and s.last_run_ms is None and s.sent == 0
    assert client.unschedule(f"{queue}-nightly") is True
    assert client.unschedule(f"{queue}-nightly") is False
    with pytest.raises(mwmq.BadRequest, match="never fires"):
        client.schedule("never", queue, "0 0 30 2 *", "x")


def test_every_error_class(client: mwmq.Client, mq: Mwmq, queue: str):
    with pytest.raises(mwmq.NoQueue, match="no such queue") as e:
        client.send(queue, "x")
    assert e.value.code == "NOQUEUE" and str(e.value) == f"NOQUEUE no such queue '{queue}'"
    client.create_queue(queue, max_messages=1)
    with pytest.raises(mwmq.Exists, match="already exists"):
        client.create_queue(queue)
    client.send(queue, "one")
    with pytest.raises(mwmq.OverQuota, match=f"queue '{queue}' is full"):
        client.send(queue, "two")
    with pytest.raises(mwmq.BadRequest, match=r"^ERR unknown command") as bad:
        client.execute("FROB", queue)
    assert bad.value.code == "ERR"
    with mwmq.Client(mq.url("sender")) as sender:
        with pytest.raises(mwmq.NoPerm, match=r"^NOPERM User sender has no permissions to receive") as e:
            sender.recv(queue)
        assert isinstance(e.value, mwmq.MwmqError)
        with pytest.raises(mwmq.NoPerm):
            sender.pop(queue)
    with (
        mwmq.Client(f"redis://app:wrong@127.0.0.1:{mq.port}") as wrong,
        pytest.raises(mwmq.WrongPass, match="invalid username-password pair"),
    ):
        wrong.ping()
    with (
        mwmq.Client(f"redis://127.0.0.1:{mq.port}") as nobody,
        pytest.raises(mwmq.NoAuth, match=r"^NOAUTH .*(Authentication required|already authenticated)"),
    ):
        nobody.length(queue)
    client.redis.xadd(f"{queue}.s", {"a": "1"})
    with pytest.raises(mwmq.WrongType, match=r"^WRONGTYPE"):
        client.create_queue(f"{queue}.s")  # a stream's name
    # No address answers at all.
    with (
        mwmq.Client(f"redis://127.0.0.1:{free_closed_port()}", retries=1, retry_backoff=(0.01, 0.01)) as dead,
        pytest.raises(mwmq.ConnectionLost, match=r"no answer from redis://127\.0\.0\.1:"),
    ):
        dead.ping()


def free_closed_port() -> int:
    from mwlab.procs import free_port

    return free_port()  # handed out to this process, nothing listens on it


def test_tls_with_a_user(mq: Mwmq, pki, queue: str):
    for protocol in (2, 3):
        with mwmq.Client(mq.url("app", tls=True), ssl_ca_certs=str(pki["ca"]), protocol=protocol) as c:
            c.create_queue(f"{queue}{protocol}")
            mid = c.send(f"{queue}{protocol}", b"over tls")
            [m] = c.recv(f"{queue}{protocol}")
            assert (m.id, m.body, m.sender) == (mid, b"over tls", "app")
            assert c.ack(m)
    # mwmq:// and a separate username/password work alike; a client that
    # does not trust the CA is refused.
    with mwmq.Client(
        f"mwmqs://127.0.0.1:{mq.tls_port}", username="app", password="app-secret", ssl_ca_certs=str(pki["ca"])
    ) as c:
        assert c.length(f"{queue}2") == 0
    untrusting = mwmq.Client(f"rediss://app:app-secret@127.0.0.1:{mq.tls_port}", retries=0)
    with untrusting, pytest.raises(mwmq.ConnectionLost, match="certificate verify failed"):
        untrusting.ping()


def test_attacker_bodies_not_utf8_and_at_the_limit(client: mwmq.Client, queue: str):
    client.create_queue(queue)
    raw = bytes(range(256)) * 3 + b"\xff\xfe\x00"
    client.send(queue, raw)
    [m] = client.recv(queue)
    assert m.body == raw
    with pytest.raises(UnicodeDecodeError):
        _ = m.text
    client.ack(m)
    big = b"\x80" * MAX_BODY
    client.send(queue, big)
    [m] = client.recv(queue)
    assert m.body == big and client.ack(m)
    with pytest.raises(mwmq.BadRequest, match="over the server's limit"):
        client.send(queue, big + b"!")
    assert client.ping()  # the connection is still usable


def test_attacker_another_users_lease_is_refused(client: mwmq.Client, mq: Mwmq, queue: str):
    client.create_queue(queue)
    client.send(queue, "app's")
    [m] = client.recv(queue, vt_ms=30_000)
    with mwmq.Client(mq.url("other")) as other:
        # The right lease, but not other's delivery: refused as a stale lease.
        assert other.ack(m) is False
        assert other.nack(m) is False
        assert other.touch(m, 60_000) is False
        assert other.recv(queue) == []  # still leased to app
    assert client.ack(m) is True


def shown(e: BaseException) -> str:
    """Everything a log or an error report may show of an exception: its
    text, its repr, its traceback with every frame's locals (as
    `traceback`'s capture_locals, Sentry and `pytest -l` show them)."""
    tb = traceback.TracebackException.from_exception(e, capture_locals=True)
    return "\n".join([str(e), repr(e), *tb.format()])


def test_the_password_stays_out_of_errors_reprs_and_tracebacks(mq: Mwmq):
    # A refused login: the request's frames hold the client's settings.
    with mwmq.Client(f"redis://app:{WRONG}@127.0.0.1:{mq.port}", retries=0) as c:
        with pytest.raises(mwmq.WrongPass) as refused:
            c.ping()
        assert WRONG not in shown(refused.value) and WRONG not in repr(c.__dict__)
    # An address that does not answer.
    with mwmq.Client(f"redis://app:{SECRET}@127.0.0.1:{free_port()}", retries=0) as c:
        with pytest.raises(mwmq.ConnectionLost) as lost:
            c.ping()
        assert SECRET not in shown(lost.value)
    # A mistyped URL: the message (which the CLI prints) says what is wrong,
    # with the password masked.
    for url in (f"http://app:{SECRET}@127.0.0.1:6380", f"mwmq://app:{SECRET}@127.0.0.1:99999//"):
        with pytest.raises(ValueError) as bad:
            mwmq.Client(url)
        assert SECRET not in str(bad.value) + repr(bad.value) and "app:***@127.0.0.1" in str(bad.value)


def test_tls_refuses_a_valid_certificate_for_another_name(site: Site, pki):
    """A server whose certificate the trusted CA signed, but for another
    host name, is refused (redis-py 5 checks no host name by default: the
    client asks for it)."""
    assert mwmq.Client("rediss://127.0.0.1:1")._settings.redis_kwargs[0]["ssl_check_hostname"] is True
    elsewhere = site.start(cert="other")
    try:
        with (
            mwmq.Client(elsewhere.url("app", tls=True), ssl_ca_certs=str(pki["ca"]), retries=0) as c,
            pytest.raises(mwmq.ConnectionLost, match="certificate verify failed"),
        ):
            c.ping()
    finally:
        elsewhere.kill()
