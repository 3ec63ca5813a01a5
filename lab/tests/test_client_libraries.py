"""mwproxy as memcached client libraries see it: python-memcached, pymemcache
and libmemcached's tools (memcping, memcstat) work through a replicated
mwproxy as they do against memcached, and a binary-protocol client
(python-binary-memcached) fails at once instead of waiting for its timeout."""

from __future__ import annotations

import shutil
import subprocess
import time

import bmemcached
import memcache
import pytest
from pymemcache.client.base import Client as PymemcacheClient

from mwlab.procs import ProcessGroup


@pytest.fixture
def replicated(tmp_path, start_proxy):
    """mwproxy in front of three memcached servers, two replicas per key; yields its port."""
    with ProcessGroup(tmp_path / "servers") as group:
        ports = [group.memcached(f"mc{i}").port for i in range(3)]
        proxy = start_proxy(["-m", *[f"127.0.0.1:{p}" for p in ports], "-r", "2"])
        yield proxy.port, ports


def test_python_memcached_works_through_mwproxy(replicated):
    port, _ = replicated
    mc = memcache.Client([f"127.0.0.1:{port}"], cache_cas=True)
    try:
        python_memcached_scenario(mc)
    finally:
        mc.disconnect_all()


def python_memcached_scenario(mc: memcache.Client) -> None:
    items = {f"pm:{i}": f"value {i}" for i in range(300)}
    assert mc.set_multi(items) == []
    assert mc.get_multi(list(items)) == items
    assert mc.set("counter", "10")
    assert mc.incr("counter", 5) == 15
    assert mc.decr("counter", 20) == 0
    assert mc.gets("pm:1") == "value 1"
    assert mc.cas("pm:1", "changed")
    for _ in range(4):
        assert mc.get("pm:1") == "changed", "every replica has the cas'd value"
    assert mc.delete("pm:2")
    assert mc.get("pm:2") is None
    ((_, stats),) = mc.get_stats()
    assert int(stats["curr_items"]) >= 2 * 299, "items summed over the servers (two copies each)"
    assert stats["version"].count(".") == 2
    assert int(stats["limit_maxbytes"]) == 3 * 256 * 1024 * 1024


def test_pymemcache_works_through_mwproxy(replicated):
    port, _ = replicated
    c = PymemcacheClient(("127.0.0.1", port), timeout=5)
    try:
        pymemcache_scenario(c)
    finally:
        c.close()


def pymemcache_scenario(c: PymemcacheClient) -> None:
    version = c.version().decode()
    assert [int(x) for x in version.split(".")[:2]] >= [1, 6], version
    items = {f"py:{i}": b"v" * i for i in range(1, 200)}
    assert c.set_many(items, noreply=False) == []
    assert c.get_many(list(items)) == items
    assert c.add("py:1", b"again", noreply=False) is False
    assert c.touch("py:1", 300, noreply=False)
    value, cas = c.gets("py:3")
    assert value == b"vvv"
    assert c.cas("py:3", b"new", cas)
    assert c.get("py:3") == b"new"
    stats = c.stats()
    for name in (b"curr_items", b"total_items", b"bytes", b"limit_maxbytes", b"connection_structures"):
        assert name in stats, name
    assert c.stats(b"cachedump", b"62", b"0") == {}


def test_libmemcached_tools_ping_and_read_stats(replicated):
    port, _ = replicated
    if shutil.which("memcping") is None:
        pytest.fail("memcping is missing: make test installs libmemcached-tools")
    servers = f"--servers=127.0.0.1:{port}"
    ping = subprocess.run(["memcping", servers], capture_output=True, text=True, timeout=30)
    assert ping.returncode == 0, ping.stderr
    stat = subprocess.run(["memcstat", servers], capture_output=True, text=True, timeout=30)
    assert stat.returncode == 0, stat.stderr
    assert "curr_items" in stat.stdout and "version" in stat.stdout, stat.stdout


def test_a_binary_protocol_client_fails_at_once(replicated):
    port, _ = replicated
    client = bmemcached.Client((f"127.0.0.1:{port}",), socket_timeout=5)
    started = time.monotonic()
    try:
        answer = client.get("k")
    except Exception:
        answer = "error"
    finally:
        client.disconnect_all()
    took = time.monotonic() - started
    assert answer in (None, "error")
    assert took < 2.0, f"the binary client waited {took:.1f} s: the proxy must close at once"
