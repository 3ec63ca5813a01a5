"""Trimming, merging and aggregation on synthetic windows with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hdrh.histogram import HdrHistogram

from mwlab.analysis import (
    aggregate_runs,
    client_metrics,
    common_span,
    cpu_metrics,
    host_metrics,
    merge_op,
    middleware_metrics,
    trim_client,
    within,
)
from mwlab.checks import noise_checks, run_checks


def hist(values):
    h = HdrHistogram(1, 60_000_000, 3)
    for v in values:
        h.record_value(v)
    n = len(values)
    return {"count": n, "mean": sum(values) / n if n else 0.0, "hdr": h.encode().decode()}


def op(count, values, hits=0, misses=0, errors=0):
    return {
        "count": count,
        "errors": errors,
        "hits": hits,
        "misses": misses,
        "keys": hits + misses,
        "response_us": hist(values),
    }


def window(start, count, values, phase="measure", dur=1000, conns=2, think=0.0, mw=None):
    ops = {"get": op(count, values, hits=count), "all": op(count, values, hits=count)}
    w = {
        "start_unix_ms": start,
        "duration_ms": dur,
        "ops": ops,
        "client": {"phase": phase, "connections": conns, "virtual_clients": 1, "think_time_us": think},
    }
    if mw is not None:
        w["middleware"] = mw
        del w["client"]
    return w


def test_trimming_keeps_the_measure_phase_minus_extra_windows():
    ws = (
        [window(0, 1, [1], "warmup")]
        + [window(1000 * i, 1, [1]) for i in range(1, 6)]
        + [window(6000, 1, [1], "cooldown")]
    )
    assert [w["start_unix_ms"] for w in trim_client(ws)] == [1000, 2000, 3000, 4000, 5000]
    assert [w["start_unix_ms"] for w in trim_client(ws, 1, 2)] == [2000, 3000]
    assert trim_client(ws, 3, 3) == []


def test_common_span_and_middleware_windows_within_it():
    a = [window(1000 * i, 1, [1]) for i in range(1, 5)]
    b = [window(1000 * i, 1, [1]) for i in range(2, 6)]
    assert common_span([a, b]) == (2000, 5000)
    mw = [window(1000 * i, 1, [1]) for i in range(0, 7)]
    assert [w["start_unix_ms"] for w in within(mw, (2000, 5000))] == [2000, 3000, 4000]
    assert common_span([a, []]) is None


def test_merging_is_exact_for_counts_means_and_percentiles():
    ws = [window(0, 4, [100, 100, 100, 100]), window(1000, 1, [1000])]
    m = merge_op(ws, "get")
    assert (m.count, m.hits) == (5, 5)
    assert m.mean_us == pytest.approx(280.0)
    assert m.p50_us == 100
    assert m.p99_us == pytest.approx(1000, rel=0.001)


def test_client_figures_and_the_interactive_law():
    # 2 clients x 2 connections, 1000 requests/s each, 3 windows, R = 1 ms, Z = 1 ms:
    # X = 2000/s and N / X - Z = 4 / 2000 s - 1 ms = 1 ms = R.
    c1 = [window(1000 * i, 1000, [1000] * 1000, think=1000.0) for i in range(3)]
    c2 = [window(1000 * i, 1000, [1000] * 1000, think=1000.0) for i in range(3)]
    m = client_metrics([c1, c2])
    assert m["client_tput"] == pytest.approx(2000)
    assert m["N"] == 4 and m["Z_us"] == pytest.approx(1000)
    assert m["law_rt_us"] == pytest.approx(4 / 2000 * 1e6 - 1000)
    assert m["law_deviation"] == pytest.approx(0.0, abs=1e-9)
    assert m["client_window_cv"] == pytest.approx(0.0)


def test_open_loop_counters_and_the_errors_check():
    c1 = [window(1000 * i, 10, [100] * 10) for i in range(2)]
    c1[1]["client"].update(late_sends=3, unsent=7)
    c2 = [window(1000 * i, 10, [100] * 10) for i in range(2)]
    c2[0]["client"].update(late_sends=1)
    m = client_metrics([c1, c2])
    assert (m["client_late"], m["client_unsent"]) == (4, 7)
    row = {"point": "p", "rep": 1, "status": "ok", **m}
    errors = [c for c in run_checks(pd.DataFrame([row]), pd.DataFrame()) if c.name == "errors"]
    assert len(errors) == 1 and not errors[0].ok
    assert "7 arrivals not sent" in errors[0].detail
    row["client_unsent"] = 0
    errors = [c for c in run_checks(pd.DataFrame([row]), pd.DataFrame()) if c.name == "errors"]
    assert errors[0].ok and errors[0].detail == "0 of 40 requests"


def mw_block(qlen, util, queue_values):
    return {
        "queue_length_mean": qlen,
        "worker_utilisation": util,
        "net_us": hist([1]),
        "queue_us": hist(queue_values),
        "server_us": hist([50]),
        "service_us": hist([60]),
    }


def test_middleware_figures_are_time_weighted():
    ws = [
        window(0, 10, [100] * 10, dur=1000, mw=mw_block(2.0, 0.5, [10] * 10)),
        window(1000, 10, [100] * 10, dur=3000, mw=mw_block(6.0, 0.9, [30] * 10)),
    ]
    m = middleware_metrics([ws])
    assert m["mw_queue_len"] == pytest.approx((2.0 * 1000 + 6.0 * 3000) / 4000)
    assert m["mw_util"] == pytest.approx((0.5 * 1000 + 0.9 * 3000) / 4000)
    assert m["mw_queue_us"] == pytest.approx(20.0)
    assert m["mw_tput"] == pytest.approx(20 / 4.0)


def test_aggregation_over_repetitions():
    summary = pd.DataFrame(
        [
            {"point": "a", "rep": 1, "status": "ok", "vcli": 1, "client_tput": 100.0, "N": 2.0},
            {"point": "a", "rep": 2, "status": "ok", "vcli": 1, "client_tput": 120.0, "N": 2.0},
            {"point": "b", "rep": 1, "status": "ok", "vcli": 4, "client_tput": 300.0, "N": 8.0},
            {"point": "b", "rep": 2, "status": "failed", "vcli": 4, "client_tput": math.nan, "N": 8.0},
        ]
    )
    agg = aggregate_runs(summary, ["vcli"])
    a = agg[agg["point"] == "a"].iloc[0]
    assert a["client_tput"] == pytest.approx(110.0)
    assert a["client_tput_std"] == pytest.approx(math.sqrt(200))
    assert a["reps"] == 2
    b = agg[agg["point"] == "b"].iloc[0]
    assert b["reps"] == 1 and math.isnan(b["client_tput_std"])
    assert list(agg["point"]) == ["a", "b"]


def test_a_directory_that_is_not_a_result_is_refused(tmp_path, capsys):
    from mwlab.cli import main

    assert main(["analyze", str(tmp_path)]) == 2
    assert "is not a result directory of `mwlab run`" in capsys.readouterr().err
    (tmp_path / "experiment.json").write_text("{not json")
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "experiment.json is damaged" in capsys.readouterr().err


def test_the_timeline_adds_clients_per_window_and_marks_failures(tmp_path):
    import json

    from mwlab.plots import client_timeline

    for name, counts in (("cl0", [5, 100, 100, 80]), ("cl1", [5, 100, 100, 100])):
        d = tmp_path / name
        d.mkdir()
        lines = []
        for i, n in enumerate(counts):
            # A 100 ms partial window, then whole seconds.
            w = window(900 if i == 0 else 1000 * i, n, [100] * n, dur=100 if i == 0 else 1000)
            w.update(format="mwlab/1", source="mwload")
            if name == "cl0" and i == 3:
                w["ops"]["all"]["errors"] = 2
                w["client"]["unsent"] = 3
            lines.append(json.dumps(w) + "\n")
        (d / "windows.jsonl").write_text("".join(lines))
    df = client_timeline(tmp_path)
    # Times count from the first window, which is itself left out as too short.
    assert list(df["t"]) == pytest.approx([0.1, 1.1, 2.1])
    assert list(df["tput"]) == [200.0, 200.0, 180.0]
    assert list(df["failed"]) == [0, 0, 5]


def test_cpu_of_remote_hosts_counts_where_it_ran():
    """cl0 and mw0 ran on SSH hosts (sampled there): they count as themselves
    and their roles, not as this machine's; each remote host has its busy
    share, its other processes and the cores left to the lab's."""

    def line(start, rate):  # cumulative seconds at 0 s and 10 s
        return [(0, start), (10_000, start + 10 * rate)]

    samples = {
        ("lab", "*"): line(1, 0.1),
        ("mc0", "*"): line(5, 0.3),
        ("cl0", "*"): line(7, 0.5),
        ("cl0", "load"): line(7, 0.45),
        ("mw0", "*"): line(2, 0.6),
        ("mw0", "worker"): line(1, 0.4),
        ("host", "busy"): line(100, 0.5),
        ("host:client0", "busy"): line(100, 0.8),
        ("host:mw0", "busy"): line(100, 0.7),
    }
    remote = frozenset({"cl0", "mw0"})
    m = cpu_metrics(samples, (0, 10_000), 10_000, 2.0, remote)
    assert m["cpu_lab_cores"] == pytest.approx(0.4)  # the lab's own process once, and mc0
    assert m["cpu_other_cores"] == pytest.approx(0.1)
    assert m["cpu_cl0_cores"] == pytest.approx(0.5) and m["cpu_mw_worker_cores"] == pytest.approx(0.4)
    assert m["cpu_cl_load_us"] == pytest.approx(450)
    assert m["host_util"] == pytest.approx(0.25)
    assert not any(k.startswith("cpu_host:") for k in m)
    placement = {
        "emulation": "ssh",
        "hosts": {
            "client0": {"cores": 4, "sampled": True},
            "mw0": {"cores": 2, "sampled": True},
            "gone": {"cores": 8, "sampled": False},
        },
        "processes": {"mc0": "server0", "cl0": "client0", "mw0": "mw0"},
    }
    h = host_metrics(samples, (0, 10_000), 10_000, placement)
    assert h["host_util_client0"] == pytest.approx(0.2) and h["cores_client0"] == 4
    assert h["cpu_other_client0_cores"] == pytest.approx(0.3)
    assert h["cpu_host_client0_quota"] == pytest.approx(3.7)
    assert h["cpu_host_mw0_us"] == pytest.approx(600)
    assert h["cpu_other_mw0_cores"] == pytest.approx(0.1)
    assert not any("gone" in k for k in h)
    checks = {c.name: c for c in noise_checks(pd.Series({**m, **h}), "p")}
    assert checks["client0 CPU not saturated"].ok
    assert checks["no interference on mw0"].ok
    busy = noise_checks(pd.Series({**m, **h, "host_util_mw0": 0.99, "cpu_other_mw0_cores": 1.5}), "p")
    assert not {c.name: c for c in busy}["mw0 CPU not saturated"].ok
    assert not {c.name: c for c in busy}["no interference on mw0"].ok


def test_the_generator_checks_judge_by_the_rate_and_the_lateness():
    """An open-loop generator kept its schedule when it sent at least 95% of
    its target rate with at most 1% of its sends over 1 ms late; the
    arrivals are exponential when the Anderson-Darling test says so."""
    from mwlab.checks import generator_checks

    def verdicts(**row) -> dict[str, bool]:
        base = {"gen_target_rate": 4000.0, "gen_late_p99_us": 300.0, "gen_gap_ad": 0.5}
        return {c.name: c.ok for c in generator_checks(pd.Series({**base, **row}), "p")}

    kept = "load generator kept its schedule"
    assert verdicts(gen_rate_ratio=0.999, gen_late_share=0.001)[kept]
    assert verdicts(gen_rate_ratio=0.95, gen_late_share=0.01)[kept], "the limits themselves pass"
    assert not verdicts(gen_rate_ratio=0.90, gen_late_share=0.0)[kept], "too few sent"
    assert not verdicts(gen_rate_ratio=1.0, gen_late_share=0.05)[kept], "too many late"
    exponential = "arrivals exponential"
    assert verdicts(gen_rate_ratio=1.0, gen_late_share=0.0, gen_gap_exponential=1.0)[exponential]
    assert not verdicts(gen_rate_ratio=1.0, gen_late_share=0.0, gen_gap_exponential=0.0)[exponential]
    assert exponential not in verdicts(gen_rate_ratio=1.0, gen_late_share=0.0)
    assert verdicts() == {}, "a closed-loop run has no schedule to keep"
