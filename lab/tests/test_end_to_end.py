"""A tiny experiment with real memcached, mwproxy and mwload processes: the
files, client against middleware throughput, the interactive law, and the
report rendered in headless Chromium with every image loaded."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from counting import allowed_apart

from mwlab.analysis import common_span, summarize, trim_client, within
from mwlab.checks import LAW_TOLERANCE, THROUGHPUT_TOLERANCE, run_checks
from mwlab.cli import main
from mwlab.render import write_report
from mwlab.results import read_windows
from mwlab.runner import prepare, run_experiment
from mwlab.spec import parse

TINY = {
    "name": "tiny",
    "topology": {"servers": 2, "middlewares": 1, "threads": 1},
    "middleware": {"workers": 2},
    "factors": {"vcli": [1, 4]},
    "run": {"duration": 2, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
}


def assert_same_requests(r: pd.Series, run: Path) -> None:
    """The clients and the middleware counted the same requests in the
    windows of the same seconds, but for those in flight at the span's ends
    and those between the two processes' collections of its end windows'
    counts (counting.py)."""
    clients = [trim_client(read_windows(d)) for d in sorted(run.glob("cl[0-9]*"))]
    span = common_span(clients)
    assert span is not None
    (mw_all,) = [read_windows(d) for d in sorted(run.glob("mw[0-9]*"))]
    cl_all = read_windows(run / "cl0")
    cl_in, mw_in = [w for ws in clients for w in within(ws, span)], within(mw_all, span)
    assert sum(w["duration_ms"] for w in mw_in) == sum(w["duration_ms"] for w in within(clients[0], span))
    allowed = allowed_apart(r["N"], cl_all, span, mw_all, span, cl_in + mw_in)
    counted_cl = sum(w["ops"]["all"]["count"] for w in cl_in)
    counted_mw = sum(w["ops"]["all"]["count"] for w in mw_in)
    assert r["client_tput"] * r["client_seconds"] == pytest.approx(counted_cl)
    assert r["mw_tput"] * r["client_seconds"] == pytest.approx(counted_mw)
    assert abs(counted_mw - counted_cl) <= allowed, (counted_cl, counted_mw, allowed, r.to_dict())


def assert_law_figures(r: pd.Series, run: Path) -> None:
    """The interactive law's figures of a closed-loop run without think time.
    N/X is computed as it is defined; and the requests of a virtual client
    (one outstanding at a time) that completed in the span of T seconds all
    began within it or the longest response time before it, so their mean
    response time is at most N/X (1 + R_max / T). How far below N/X it is
    depends on the load generator's own pauses between requests, which a
    loaded machine lengthens: the "interactive law" check reports it."""
    assert r["Z_us"] == 0
    assert r["law_rt_us"] == pytest.approx(r["N"] / r["client_tput"] * 1e6)
    assert r["law_deviation"] == pytest.approx((r["client_rt_mean_us"] - r["law_rt_us"]) / r["law_rt_us"])
    longest = max(
        w["ops"]["all"]["response_us"].get("max", 0)
        for d in run.glob("cl[0-9]*")
        for w in read_windows(d)
        if (w.get("client") or {}).get("phase", "measure") == "measure"
    )
    assert 0 < r["client_rt_mean_us"] <= r["law_rt_us"] * (1 + longest / 1e6 / r["client_seconds"]), longest


def assert_verdicts_follow_figures(checks: list, summary: pd.DataFrame) -> None:
    """The interactive-law and throughput checks say what their figures say."""
    for c in checks:
        if c.name not in ("interactive law", "client vs middleware throughput"):
            continue
        point, rep = c.where.rsplit(" rep ", 1)
        (r,) = [r for _, r in summary.iterrows() if r["point"] == point and str(r["rep"]) == rep]
        if c.name == "interactive law":
            assert c.ok == (abs(r["law_deviation"]) <= LAW_TOLERANCE), c
        else:
            diff = (r["mw_tput"] - r["client_tput"]) / r["client_tput"]
            assert c.ok == (abs(diff) <= THROUGHPUT_TOLERANCE), c


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> Path:
    """The tiny experiment, run and analysed once for the module (its
    report rendered: what the tests below read)."""
    exp = parse(TINY)
    exp.source = TINY
    seen = []
    out = run_experiment(
        exp, prepare(exp, tmp_path_factory.mktemp("results")), progress=lambda *a: seen.append(a)
    )
    assert seen[-1][0] == seen[-1][1] == 2, "progress reached the end"
    write_report(out, *summarize(out))
    return out


def test_files_of_every_run(result: Path):
    runs = sorted(result.glob("*/rep-1"))
    assert [r.parent.name for r in runs] == ["vcli=1", "vcli=4"]
    for r in runs:
        assert json.loads((r / "run.json").read_text())["status"] == "ok", (r / "run.json").read_text()
        for f in (
            "mw0/windows.jsonl",
            "mw0/summary.json",
            "mw0/trace.csv",
            "cl0/windows.jsonl",
            "cl0/summary.json",
            "resources.csv",
        ):
            assert (r / f).exists(), f
        resources = pd.read_csv(r / "resources.csv")
        assert {"mc0", "mc1", "mw0", "cl0", "host"} <= set(resources["name"])
        cpu = pd.read_csv(r / "cpu.csv")
        threads = set(cpu.loc[cpu["process"] == "mw0", "thread"])
        assert {"*", "net", "worker", "stats"} <= threads, threads
        assert "load" in set(cpu.loc[cpu["process"] == "cl0", "thread"])
        assert {"host", "lab"} <= set(cpu["process"])


def test_client_and_middleware_agree_and_the_law_holds(result: Path):
    summary, aggregate = summarize(result)
    assert (result / "summary.csv").exists() and (result / "aggregate.csv").exists()
    assert len(summary) == 2 and (summary["status"] == "ok").all()
    for _, r in summary.iterrows():
        assert_same_requests(r, result / r["point"] / f"rep-{r['rep']}")
        assert_law_figures(r, result / r["point"] / f"rep-{r['rep']}")
        assert r["client_errors"] == 0
    assert set(aggregate["vcli"]) == {1, 4}
    checks = run_checks(summary, aggregate)
    law = [c for c in checks if c.name == "interactive law"]
    assert len(law) == 2
    assert_verdicts_follow_figures(checks, summary)
    for name in ("no interference", "host CPU not saturated", "load generator not saturated"):
        assert len([c for c in checks if c.name == name]) == 2, name
    for _, r in summary.iterrows():
        # Every request's CPU: the processes' demands add up to the lab's.
        parts = r["cpu_mw0_us"] + r["cpu_mc_us"] + r["cpu_cl_us"]
        assert 0 < parts <= r["cpu_lab_us"] * 1.001
        assert r["cpu_mw_worker_us"] > 0 and r["cpu_mw_net_us"] > 0
        # mwproxy's threads' CPU seconds are parts of its own, at every
        # sample (read before it; three decimals each).
        cpu = pd.read_csv(result / r["point"] / f"rep-{r['rep']}" / "cpu.csv")
        mw = cpu[cpu["process"] == "mw0"]
        for stamp, rows in mw.groupby("unix_ms"):
            threads = rows[rows["thread"] != "*"]["cpu_s"]
            assert threads.sum() <= rows[rows["thread"] == "*"]["cpu_s"].sum() + 0.0005 * len(threads), stamp


def test_the_model_files_and_a_bottleneck_that_agrees_with_the_measurements(result: Path):
    from mwlab.analysis import read_experiment
    from mwlab.fit import bottleneck_agrees, fit_experiment

    _, aggregate = summarize(result)
    model = pd.read_csv(result / "model.csv")
    util = pd.read_csv(result / "utilization.csv")
    assert list(model.columns[:3]) == ["sweep", "point", "N"]
    assert {"x_measured", "x_model", "r_measured_us", "r_model_us", "bottleneck"} <= set(model.columns)
    assert {"point", "device", "demand_us", "u_predicted", "u_measured"} <= set(util.columns)
    assert {"host CPU", "workers", "net thread", "server 0", "server 1", "load generator"} <= set(
        util["device"]
    )
    assert (util["demand_us"] > 0).all()
    meta = read_experiment(result)
    fit = fit_experiment(aggregate, meta.columns, meta.settings)
    for p in fit.points:
        assert bottleneck_agrees(p), (p.point, p.bottleneck, [(d.name, d.u_measured) for d in p.devices])


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError("Chromium is not installed (make test installs Debian's chromium package)")


def test_report_renders_with_every_image(result: Path, tmp_path: Path):
    report = result / "report.html"
    text = report.read_text()
    assert "Interactive law" in text or "interactive law" in text
    assert text.count("<img") >= 6
    assert "Closed network of every point" in text and "Operational laws per point" in text
    assert "Noise and saturation" in text
    # The answer first: the summary, then plots, tables, models, predictions, checks.
    order = [text.index(f'<h2 id="{s}"') for s in ("plots", "results", "models", "predictions", "checks")]
    assert text.index('id="summary"') < order[0] and order == sorted(order)
    assert "The highest throughput is" in text and "model's largest error" in text
    assert (result / "plots" / "throughput.csv").is_file() and 'href="plots/throughput.csv"' in text
    profile = tmp_path / "profile"
    browser = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'shot-profile'}",
        "--window-size=1280,900",
    ]
    shot = tmp_path / "report.png"
    subprocess.run(
        [*browser, f"--screenshot={shot}", report.as_uri()], capture_output=True, timeout=120, check=True
    )
    assert shot.stat().st_size > 10_000, "a screenshot of the page as a reader first sees it"
    dom = subprocess.run(
        [
            chromium(),
            "--window-size=1280,900",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
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
    assert m, "the page's load handler ran"
    loaded, total = int(m.group(1)), int(m.group(2))
    assert total >= 5 and loaded == total, f"{loaded} of {total} images loaded"
    bottom = re.search(r'data-summary-bottom="(\d+)"', dom)
    assert bottom and int(bottom.group(1)) <= 900, "the summary is above the fold of a 1280 x 900 window"


def test_cli_analyze_and_compare(result: Path, capsys):
    assert main(["analyze", str(result)]) == 0
    assert "report:" in capsys.readouterr().out
    assert main(["compare", str(result), str(result)]) == 0
    out = capsys.readouterr().out
    assert "client_tput" in out and "1.00" in out
    assert main(["run", "no-such-experiment"]) == 2
    assert "no spec" in capsys.readouterr().err


def test_resume_reruns_only_unfinished_runs(result: Path):
    exp = parse(TINY)
    exp.source = TINY
    keep = result / "vcli=1" / "rep-1" / "run.json"
    redo = result / "vcli=4" / "rep-1" / "run.json"
    before = keep.stat().st_mtime_ns
    redo.unlink()
    assert run_experiment(exp, prepare(exp, result.parent, resume=result)) == result
    assert keep.stat().st_mtime_ns == before, "a finished run is kept"
    assert json.loads(redo.read_text())["status"] == "ok", "the unfinished run ran again"


def test_a_failed_run_is_recorded_and_the_experiment_goes_on(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MWPROXY_BIN", str(tmp_path / "no-such-binary"))
    exp = parse(TINY)
    exp.source = TINY
    out = run_experiment(exp, prepare(exp, tmp_path))
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*/rep-*/run.json"))]
    assert len(records) == 2
    assert all(r["status"] == "failed" and "no-such-binary" in r["error"] for r in records)
    summary, aggregate = summarize(out)
    assert aggregate.empty
    report = write_report(out, summary, aggregate).read_text()
    assert "no-such-binary" in report
