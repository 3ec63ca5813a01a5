"""mwproxy's results files and /metrics, read from Python as the lab reads them:
HDR histograms decode with the `hdrhistogram` package and merge exactly, the
Prometheus page parses with `prometheus_client`, damaged files are refused."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mwlab.results import ResultsFormatError, merge_hists, read_summary, read_trace, read_windows


def call(sock: socket.socket, request: bytes, buf: bytearray) -> bytes:
    sock.sendall(request)
    while True:
        for end in (b"END\r\n", b"STORED\r\n", b"DELETED\r\n", b"NOT_FOUND\r\n"):
            if buf.endswith(end):
                reply = bytes(buf)
                buf.clear()
                return reply
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf.extend(chunk)


def load(port: int, clients: int, requests: int) -> None:
    def one(c: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            buf = bytearray()
            for i in range(requests):
                key = f"k{(c * 31 + i) % 50}"
                if i % 5 == 0:
                    call(s, f"set {key} 0 0 3\r\nabc\r\n".encode(), buf)
                elif i % 7 == 0:
                    call(s, f"get {key} k1 k2\r\n".encode(), buf)
                else:
                    call(s, f"get {key}\r\n".encode(), buf)

    threads = [threading.Thread(target=one, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def raw_quantile(sorted_values: list[int], q: float) -> int:
    """The value of the rank HdrHistogram uses for a percentile (rounded, at least 1)."""
    rank = max(1, math.floor(q * len(sorted_values) + 0.5))
    return sorted_values[rank - 1]


@pytest.fixture
def run(tmp_path: Path, memcached: int, start_proxy):
    out = tmp_path / "mw"
    proxy = start_proxy(
        [
            "-m",
            f"127.0.0.1:{memcached}",
            "--out",
            str(out),
            "--trace-every",
            "1",
            "--window-ms",
            "200",
            "-t",
            "2",
        ]
    )
    load(proxy.port, clients=4, requests=400)
    # The page counts closed windows: wait until the open one holds none of
    # the (finished) load's requests, however late the window closes.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.admin_port}/stats", timeout=5) as r:
            current = json.loads(r.read())["current"]
        if current["ops"].get("all", {}).get("count", 0) == 0:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the load's requests never left the open window")
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.admin_port}/metrics", timeout=5) as r:
        page = r.read().decode()
    assert proxy.stop() == 0
    return out, page


def test_merged_window_histograms_equal_the_raw_samples(run):
    out, _ = run
    windows = read_windows(out)
    trace = read_trace(out)
    assert len(windows) >= 2
    merged = merge_hists(w["ops"]["all"]["response_us"]["hdr"] for w in windows)
    raw = sorted(max(1, row.response_ns // 1000) for row in trace)
    assert merged.get_total_count() == len(raw) == 1600
    for q in (0.5, 0.9, 0.99, 0.999, 1.0):
        expected = raw_quantile(raw, q)
        got = merged.get_value_at_percentile(q * 100)
        # Three significant digits: a value and its bucket's highest equivalent differ by < 0.1%.
        assert abs(got - expected) <= max(1, expected * 0.002), (q, got, expected)
    summary = read_summary(out)
    assert summary["ops"]["all"]["count"] == 1600
    total = merge_hists([summary["ops"]["all"]["response_us"]["hdr"]])
    assert total.get_total_count() == merged.get_total_count()
    assert total.get_value_at_percentile(99) == merged.get_value_at_percentile(99)


def test_prometheus_page_parses_and_matches_the_summary(run):
    out, page = run
    summary = read_summary(out)
    families = {f.name: f for f in text_string_to_metric_families(page)}
    requests = {
        s.labels["op"]: s.value for s in families["mwproxy_requests"].samples if s.name.endswith("_total")
    }
    for op in ("get", "multiget", "set", "delete", "other"):
        assert requests[op] == summary["ops"][op]["count"], op
    hist = families["mwproxy_response_seconds"]
    counts = {s.labels["op"]: s.value for s in hist.samples if s.name.endswith("_count")}
    assert counts["get"] == summary["ops"]["get"]["response_us"]["count"]
    buckets = [s for s in hist.samples if s.name.endswith("_bucket") and s.labels["op"] == "get"]
    values = [s.value for s in buckets]
    assert values == sorted(values), "cumulative buckets"
    assert families["mwproxy_backend_up"].samples[0].value == 1.0


def test_damaged_windows_are_reported_not_skipped(run, tmp_path: Path):
    out, _ = run
    text = (out / "windows.jsonl").read_text()
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "windows.jsonl").write_text(text[: len(text) - 40])
    n = text.count("\n")
    with pytest.raises(ResultsFormatError, match=rf"windows.jsonl:{n}: truncated"):
        read_windows(damaged)
    lines = text.splitlines(keepends=True)
    lines[1] = '{"format": "mwlab/1", "oops": \n'
    (damaged / "windows.jsonl").write_text("".join(lines))
    with pytest.raises(ResultsFormatError, match=r"windows.jsonl:2: not valid JSON"):
        read_windows(damaged)
    lines[1] = '{"format": "other/3"}\n'
    (damaged / "windows.jsonl").write_text("".join(lines))
    with pytest.raises(ResultsFormatError, match=r"windows.jsonl:2: format is 'other/3'"):
        read_windows(damaged)
