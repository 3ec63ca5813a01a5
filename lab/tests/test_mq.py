"""The message-queue system end to end: a tiny `system: mq` experiment with a
throwaway PostgreSQL, mwmq and `mwload -P mq` clients — the files, PostgreSQL's
CPU by role, the checks, the model tables and the report in headless Chromium;
and what the specs accept and refuse (levels taken together, mq settings)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from test_end_to_end import assert_law_figures, assert_same_requests, assert_verdicts_follow_figures, chromium

from mwlab.analysis import summarize
from mwlab.checks import run_checks
from mwlab.render import write_report
from mwlab.runner import prepare, run_experiment
from mwlab.spec import SpecError, load, parse

ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "name": "mq-tiny",
    "system": "mq",
    "topology": {"middlewares": 1, "threads": 2},
    "middleware": {"workers": 2, "db_pool": 1},
    "workload": {"ratio": "1:1", "value_size": 200, "receive": "recv"},
    "factors": {"together": {"vcli": [1, 3], "tmw": [1, 2]}},
    "run": {"duration": 2, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
}


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> Path:
    """The tiny experiment, run and analysed once for the module (its
    report rendered: what the tests below read)."""
    exp = parse(TINY)
    exp.source = TINY
    out = run_experiment(exp, prepare(exp, tmp_path_factory.mktemp("results")))
    write_report(out, *summarize(out))
    return out


def test_runs_keep_every_file_and_postgres_cpu(result: Path):
    runs = sorted(result.glob("*/rep-1"))
    assert [r.parent.name for r in runs] == ["vcli=1,tmw=1", "vcli=3,tmw=2"]
    for r in runs:
        record = json.loads((r / "run.json").read_text())
        assert record["status"] == "ok", record
        assert record["placement"]["processes"]["pg0"] == "server0"
        for f in (
            "mw0/windows.jsonl",
            "mw0/summary.json",
            "mw0/trace.csv",
            "cl0/summary.json",
            "logs/pg-server.log",
        ):
            assert (r / f).exists(), f
        cl = json.loads((r / "cl0/summary.json").read_text())
        assert {"send", "recv", "ack"} <= {k for k, v in cl["ops"].items() if v["count"] > 0}
        mw = json.loads((r / "mw0/summary.json").read_text())
        assert mw["middleware"]["pool_us"]["count"] > 0
        cpu = pd.read_csv(r / "cpu.csv")
        pg = cpu[cpu["process"] == "pg0"]
        assert {"*", "backend", "walwriter"} <= set(pg["thread"]), set(pg["thread"])
        total = pg[pg["thread"] == "*"]["cpu_s"]
        assert total.is_monotonic_increasing, "exited backends keep counting"


def test_checks_and_model_tables(result: Path):
    summary, aggregate = summarize(result)
    assert len(summary) == 2 and (summary["status"] == "ok").all()
    for _, r in summary.iterrows():
        assert_same_requests(r, result / r["point"] / f"rep-{r['rep']}")
        assert_law_figures(r, result / r["point"] / f"rep-{r['rep']}")
        assert r["client_errors"] == 0
        # In pairs each SEND is answered by a receive, and what came is
        # acknowledged: counts of the same virtual clients, apart by those
        # between the two at the ends of the span.
        secs, n = r["client_seconds"], r["N"]
        assert abs(r["client_send_tput"] - r["client_recv_tput"]) * secs <= 2 * n, r.to_dict()
        assert (r["client_ack_tput"] - r["client_recv_tput"]) * secs <= 2 * n, r.to_dict()
        assert r["cpu_pg0_cores"] > 0 and r["cpu_pg_backend_cores"] > 0
        assert r["mw_pool_us"] >= 0 and r["mw_server_us"] > 0
    checks = run_checks(summary, aggregate)
    names = {c.name for c in checks}
    assert {"interactive law", "client vs middleware throughput", "errors", "empty receives"} <= names
    assert all(c.ok for c in checks if c.name == "errors")
    assert_verdicts_follow_figures(checks, summary)
    model = pd.read_csv(result / "model.csv")
    assert len(model) == 2 and {"x_measured", "x_model", "bottleneck"} <= set(model.columns)
    util = pd.read_csv(result / "utilization.csv")
    assert {"workers", "database connections", "PostgreSQL CPU", "host CPU"} <= set(util["device"])
    from mwlab.analysis import read_experiment
    from mwlab.fit import bottleneck, bottleneck_agrees, fit_experiment

    meta = read_experiment(result)
    # One database connection for two workers: the pool is what limits the
    # busier point, among the system's own centers (the host's and
    # PostgreSQL's CPU have what other processes left of the machine: on a
    # loaded machine they may come first).
    (busy,) = [
        p for p in fit_experiment(aggregate, meta.columns, meta.settings).points if p.point == "vcli=3,tmw=2"
    ]
    own = [d for d in busy.devices if d.name not in ("host CPU", "PostgreSQL CPU")]
    assert "database connections" in bottleneck(own).split(" = "), [(d.name, d.per_server_us) for d in own]
    from mwlab.fit import queue_views

    pool = queue_views(aggregate, meta.settings, center="pool")
    assert list(pool["point"]) == ["vcli=3,tmw=2"], "only where workers outnumber connections"
    assert pool.iloc[0]["connections"] == 1 and pool.iloc[0]["measured waiting (us)"] > 0
    assert "Single-queue views of the database pool" in (result / "report.html").read_text()
    fit = fit_experiment(aggregate, meta.columns, meta.settings)
    for p in fit.points:
        assert bottleneck_agrees(p), (p.point, p.bottleneck, [(d.name, d.u_measured) for d in p.devices])


def test_report_renders(result: Path, tmp_path: Path):
    report = result / "report.html"
    dom = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    m = re.search(r'data-images="(\d+)/(\d+)"', dom)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 3, m and m.groups()
    assert "empty receives" in dom


def test_specs_of_the_mq_experiments_and_refusals():
    names = [
        "mq-service-time",
        "mq-speedup",
        "mq-scaleup",
        "mq-scaleout",
        "mq-message-size",
        "mq-pool-size",
        "mq-factorial-2k",
        "mq-stability",
    ]
    for name in names:
        for scale in ("quick", "full"):
            exp = load(ROOT / "experiments" / f"{name}.yaml", scale)
            assert all(p.settings.mq for p in exp.points())
    full = load(ROOT / "experiments" / "mq-scaleup.yaml", "full")
    assert [(p.get("tmw"), p.get("vcli")) for p in full.points()] == [(1, 5), (2, 10), (4, 20), (8, 40)]
    scaleout = load(ROOT / "experiments" / "mq-scaleout.yaml", "full")
    assert {p.settings.hosts.emulation for p in scaleout.points()} == {"netns"}, "seed 004's hosts"
    crossed = load(ROOT / "experiments" / "mq-factorial-2k.yaml", "full")
    assert len(crossed.points()) == 8
    base = {"name": "x", "system": "mq", "topology": {"middlewares": 1, "threads": 2}}
    for extra, needle in [
        ({"topology": {"servers": 2, "middlewares": 1}}, "one database"),
        ({"topology": {"middlewares": 0}}, "at least one middleware"),
        ({"workload": {"receive": "peek"}}, "workload.receive: Input should be 'pop', 'recv' or 'stream'"),
        ({"middleware": {"db_pool": 0}}, "db_pool"),
        ({"topology": {"middlewares": 1, "threads": 1, "virtual_clients": 3}}, "even number"),
        ({"factors": {"together": {"tmw": [1, 2], "vcli": [1]}}}, "as many levels"),
        ({"system": "redis"}, "topology.system: Input should be 'memcached' or 'mq'"),
        (
            {"hosts": {"emulation": "ssh", "ssh": {"server0": "db.example"}}},
            "leave server0 \\(the database host\\) out of hosts.ssh",
        ),
    ]:
        with pytest.raises(SpecError, match=needle):
            parse({**base, **extra})


ENGINES = {
    "name": "mq-engines",
    "system": "mq",
    "topology": {"middlewares": 1, "threads": 2},
    "middleware": {"workers": 2, "threads": 1},
    "workload": {"ratio": "1:1", "value_size": 200, "receive": "recv"},
    "factors": {"engine": ["pool", "async"], "vcli": [4]},
    "run": {"duration": 1, "warmup": 0.5, "cooldown": 0, "repetitions": 1, "window_ms": 500},
}


def test_the_engine_is_a_factor_and_both_are_modelled(tmp_path: Path):
    """mwmq's two engines as a factor: the async one runs on its event
    loops (their threads' CPU is measured), and the model has a center for
    the loops where the pool engine has its workers."""
    exp = parse(ENGINES)
    exp.source = ENGINES
    result = run_experiment(exp, prepare(exp, tmp_path))
    summary, aggregate = summarize(result)
    assert len(summary) == 2 and (summary["status"] == "ok").all(), summary
    for _, r in summary.iterrows():
        assert r["client_errors"] == 0 and r["client_tput"] > 0
        assert_same_requests(r, result / r["point"] / f"rep-{r['rep']}")
    rows = {r["engine"]: r for _, r in summary.iterrows()}
    assert rows["async"]["cpu_mw_loop_cores"] > 0, "the loops' threads are sampled"
    from mwlab.analysis import read_experiment
    from mwlab.fit import fit_experiment

    meta = read_experiment(result)
    fit = fit_experiment(aggregate, meta.columns, meta.settings)
    devices = {p.point: {d.name for d in p.devices} for p in fit.points}
    assert "event loops" in devices["engine=async,vcli=4"], devices
    assert "workers" in devices["engine=pool,vcli=4"], devices


STANDBY = {
    "name": "mq-standby",
    "system": "mq",
    "topology": {"middlewares": 1, "threads": 2},
    "middleware": {"engine": "async", "threads": 1},
    "workload": {"ratio": "1:0", "value_size": 200},
    "factors": {"standby": [0, 1], "vcli": [4]},
    "run": {"duration": 1, "warmup": 0.5, "cooldown": 0, "repetitions": 1, "window_ms": 500},
}


def test_a_synchronous_standby_is_a_factor_and_its_round_trip_is_modelled(tmp_path: Path):
    """`database: {standby: 1}` puts a synchronous standby behind the primary
    (scripts/pg-ha.sh): its processes are sampled (pg1), its flush lag is
    measured, and the model lists that round trip inside the database time."""
    exp = parse(STANDBY)
    exp.source = STANDBY
    result = run_experiment(exp, prepare(exp, tmp_path))
    summary, aggregate = summarize(result)
    assert len(summary) == 2 and (summary["status"] == "ok").all(), summary
    rows = {int(r["standby"]): r for _, r in summary.iterrows()}
    for r in rows.values():
        assert r["client_errors"] == 0 and r["client_tput"] > 0
    assert rows[1]["cpu_pg1_cores"] > 0, "the standby's processes are sampled"
    assert rows[1]["standby_lag_us"] > 0, "the standby's round trip is measured"
    assert "cpu_pg1_cores" not in rows[0] or math.isnan(rows[0]["cpu_pg1_cores"])
    from mwlab.analysis import read_experiment
    from mwlab.fit import fit_experiment

    meta = read_experiment(result)
    fit = fit_experiment(aggregate, meta.columns, meta.settings)
    devices = {p.point: {d.name: d for d in p.devices} for p in fit.points}
    with_standby = devices["standby=1,vcli=4"]
    trip = with_standby["standby round trip (in the database time)"]
    assert trip.delay and not trip.in_network and trip.demand_us == pytest.approx(rows[1]["standby_lag_us"])
    alone = devices["standby=0,vcli=4"]
    assert not any(name.startswith("standby") for name in alone)
    # What the standby adds to the database time is a figure, not a verdict:
    # `bench/lab.py standby`. (Held here against the point without one, run
    # just before or after it, the lower quartiles once came out the other
    # way round, 1,430 against 1,972 us, while a build ran beside the test.)
    # That commits wait for the standby is the failover drill's to prove
    # (crates/mwmq/tests/failover.rs).


def test_a_stream_workload_runs_through_the_lab(tmp_path: Path):
    """`receive: stream`: the clients' queues are Redis streams with a
    consumer group (XADD; XREADGROUP of one entry, then its XACK)."""
    spec = {
        **TINY,
        "name": "mq-streams-tiny",
        "workload": {"ratio": "1:1", "value_size": 200, "receive": "stream"},
        "factors": {"vcli": [2]},
        # (The assertion counts what was sent, read and acknowledged: a second is plenty.)
        "run": {**TINY["run"], "duration": 1, "warmup": 0.5},
    }
    exp = parse(spec)
    exp.source = spec
    out = run_experiment(exp, prepare(exp, tmp_path))
    [summary] = list(out.glob("*/rep-1/cl0/summary.json"))
    ops = json.loads(summary.read_text())["ops"]
    assert ops["all"]["errors"] == 0
    assert ops["send"]["count"] > 0
    assert ops["recv"]["hits"] >= 0.9 * ops["recv"]["count"], "XREADGROUP found what XADD added"
    # (Each entry read is acknowledged; at the measured phase's edges a read
    # and its XACK may fall on either side: at most one per virtual client.)
    assert abs(ops["ack"]["count"] - ops["recv"]["hits"]) <= 2 * 2, "each entry read was acknowledged"
