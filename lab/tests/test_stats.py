"""The trust checks (mwlab.stats) against series whose truth is known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mwlab import stats
from mwlab.cli import main


def ar1(n: int, phi: float, rng: np.random.Generator, mean: float = 10.0) -> np.ndarray:
    e = rng.normal(size=n)
    x = np.empty(n)
    x[0] = e[0] / math.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x + mean


def mm1_response_times(n: int, lam: float, mu: float, rng: np.random.Generator) -> np.ndarray:
    """FCFS M/M/1 response times in arrival order (Lindley's recursion), from empty."""
    a, s = rng.exponential(1 / lam, n), rng.exponential(1 / mu, n)
    w = np.zeros(n)
    for i in range(1, n):
        w[i] = max(0.0, w[i - 1] + s[i - 1] - a[i])
    return w + s


def test_mser5_cuts_a_known_transient_and_nothing_from_a_steady_series():
    rng = np.random.default_rng(7)
    for length in (20, 60):
        x = np.concatenate([np.linspace(0.0, 100.0, length), 100 + rng.normal(0, 2, 400)])
        cut = stats.mser5(x)
        assert length - 5 <= cut <= length + 100, (length, cut)
        assert abs(np.mean(x[cut:]) - 100) < 1.0
    steady = 100 + rng.normal(0, 2, 400)
    assert stats.mser5(steady) <= 100, "a steady series keeps most of its rows"
    assert stats.mser5([1.0, 2.0, 3.0]) == 0, "too short to judge"


def test_batch_means_cover_the_mean_of_an_ar1_series_where_the_naive_interval_does_not():
    rng = np.random.default_rng(11)
    reps, truth = 300, 10.0
    bm = naive = 0
    for _ in range(reps):
        x = ar1(2000, 0.9, rng, truth)
        bm += stats.batch_means_ci(x).covers(truth)
        naive += stats.naive_ci(x).covers(truth)
    # Measured here: batch means 92%, naive 36% at a nominal 95%.
    assert bm / reps >= 0.88, bm / reps
    assert naive / reps <= 0.6, naive / reps
    iv = stats.batch_means_ci(ar1(2000, 0.9, rng))
    assert iv.method == "batch means" and iv.batch_size >= 8 and iv.batches >= stats.MIN_BATCHES
    # Independent values: batch size 1 and the same interval as Student-t.
    x = rng.normal(5, 1, 400)
    assert stats.batch_size(x) == 1
    assert stats.batch_means_ci(x).half_width == pytest.approx(stats.naive_ci(x).half_width, rel=1e-9)


def test_the_p99_interval_of_mm1_response_times_covers_the_known_p99():
    """M/M/1 at ρ = 0.8: response time is exponential with rate μ − λ, so
    p99 = ln(100)/(μ − λ). Successive response times are strongly
    correlated; the interval with the effective sample size keeps its
    coverage, plain order statistics do not."""
    rng = np.random.default_rng(5)
    lam, mu = 0.8, 1.0
    truth = math.log(100) / (mu - lam)
    reps, n = 100, 50_000
    corrected = plain = 0
    for _ in range(reps):
        x = mm1_response_times(n, lam, mu, rng)[n // 10 :]
        corrected += stats.percentile_ci(x, 0.99).covers(truth)
        plain += stats.percentile_ci(x, 0.99, ordered=False).covers(truth)
    # Measured over 300 runs: 90% corrected, 18% plain, at a nominal 95%.
    assert corrected / reps >= 0.82, corrected / reps
    assert plain / reps <= 0.5, plain / reps
    # Independent exponential samples: plain order statistics are right.
    hits = 0
    for _ in range(200):
        x = rng.exponential(1.0, 5000)
        hits += stats.percentile_ci(x, 0.99, ordered=False).covers(math.log(100))
    assert hits / 200 >= 0.9


def test_the_histogram_interval_matches_the_one_from_values():
    rng = np.random.default_rng(3)
    x = np.round(rng.exponential(100.0, 20_000))
    values, counts = np.unique(x, return_counts=True)
    a = stats.percentile_ci(x, 0.99, ordered=False)
    b = stats.percentile_ci_from_histogram(values, counts, 0.99)
    assert b.estimate == pytest.approx(a.estimate, abs=1.0)
    assert b.lo == pytest.approx(a.lo, abs=2.0) and b.hi == pytest.approx(a.hi, abs=2.0)
    wider = stats.percentile_ci_from_histogram(values, counts, 0.99, tau=10.0)
    assert wider.lo <= b.lo and wider.hi >= b.hi and wider.half_width > b.half_width


def test_stationarity_and_trend_on_known_series():
    rng = np.random.default_rng(2)
    steady = 100 + rng.normal(0, 1, 200)
    assert stats.stationarity(steady).stationary
    assert not stats.trend(steady).trending
    drifting = 100 + np.linspace(0, 10, 200) + rng.normal(0, 1, 200)
    assert not stats.stationarity(drifting).stationary
    t = stats.trend(drifting)
    assert t.trending and t.tau > 0.5
    walk = np.cumsum(rng.normal(0, 1, 300))
    assert not stats.stationarity(walk).stationary, "a random walk has a unit root"
    assert stats.stationarity([1.0, 2.0]).stationary, "too short to test"
    # Repetitions that ran in this order and got slower each time.
    assert stats.trend([100.0, 98.0, 97.0, 95.0, 93.0, 92.0]).trending


def test_the_command_line(tmp_path, capsys):
    rng = np.random.default_rng(9)
    x = np.concatenate([np.linspace(0, 1000, 10), 1000 + rng.normal(0, 10, 200)])
    f = tmp_path / "series.csv"
    f.write_text("tput,other\n" + "".join(f"{v},x\n" for v in x))
    assert main(["stats", "warmup", str(f), "--column", "tput", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 5 <= out["cut"] <= 60 and out["method"].startswith("MSER-5") and out["judged"]
    assert main(["stats", "ci", str(f), "--column", "tput", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "batch means" and out["ci"][0] < out["mean"] < out["ci"][1]
    assert main(["stats", "ci", str(f), "--column", "tput", "--percentile", "99", "--confidence", "0.9"]) == 0
    assert "p99" in capsys.readouterr().out
    assert main(["stats", "stationarity", str(f), "--column", "tput", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stationarity"]["method"].startswith("KPSS") and "trend" in out
    # Bad input gets a message and status 2.
    assert main(["stats", "ci", str(f), "--column", "nope"]) == 2
    assert "no column 'nope'" in capsys.readouterr().err
    assert main(["stats", "ci", str(f), "--column", "other"]) == 2
    assert "has no numbers" in capsys.readouterr().err
    assert main(["stats", "ci", str(tmp_path / "missing.csv"), "--column", "tput"]) == 2
    assert main(["stats", "ci", str(f), "--column", "tput", "--percentile", "120"]) == 2


def _windows(
    tputs: list[float], phases: list[str], scales: list[float] | None = None, seed: int = 0
) -> list[dict]:
    """Client windows of 1 s with `tputs` requests each; response times drawn
    exponential with mean `scales[i]` µs (100 by default) and encoded as
    mwload does."""
    from hdrh.histogram import HdrHistogram

    rng = np.random.default_rng(seed)
    out = []
    for i, (t, ph) in enumerate(zip(tputs, phases, strict=True)):
        h = HdrHistogram(1, 60_000_000, 3)
        scale = scales[i] if scales else 100.0
        for v in rng.exponential(scale, int(t)):
            h.record_value(max(1, int(v)))
        rt = {"mean": h.get_mean_value(), "p99": h.get_value_at_percentile(99), "hdr": h.encode().decode()}
        out.append(
            {
                "start_unix_ms": 1000 * i,
                "duration_ms": 1000,
                "ops": {"all": {"count": int(t), "response_us": rt}},
                "client": {"phase": ph},
            }
        )
    return out


def test_the_p99_interval_of_a_run_from_its_histograms():
    from mwlab.analysis import p99_run_ci

    truth = 100.0 * math.log(100)
    ws = _windows([2000.0] * 30, ["measure"] * 30, seed=1)
    r = p99_run_ci([ws])
    assert r["client_rt_p99_tau"] < 3, "independent response times"
    assert r["client_rt_p99_run_ci_lo_us"] <= truth <= r["client_rt_p99_run_ci_hi_us"]
    # Windows that alternate between fast and slow: the share below the p99
    # varies far more than binomially, and the interval widens with it.
    slow = _windows([2000.0] * 30, ["measure"] * 30, scales=[60.0, 140.0] * 15, seed=2)
    w = p99_run_ci([slow])
    assert w["client_rt_p99_tau"] > 10
    assert (w["client_rt_p99_run_ci_hi_us"] - w["client_rt_p99_run_ci_lo_us"]) > 2 * (
        r["client_rt_p99_run_ci_hi_us"] - r["client_rt_p99_run_ci_lo_us"]
    )


def test_a_run_whose_warm_up_was_too_short_or_that_drifts_is_flagged():
    import pandas as pd

    from mwlab.analysis import add_repetition_trust, trust_metrics
    from mwlab.checks import trust_checks

    rng = np.random.default_rng(4)
    ramp = list(np.linspace(100, 1000, 15)) + list(1000 + rng.normal(0, 10, 45))
    ramp = [round(v) for v in ramp]
    phases = ["warmup"] * 2 + ["measure"] * 58
    every = [_windows(ramp, phases)]
    kept = [[w for w in every[0] if w["client"]["phase"] == "measure"]]
    m = trust_metrics(every, kept)
    assert m["warmup_windows"] == 2 and m["warmup_detected_windows"] >= 10
    assert m["windows_stationary"] == 0.0, "the ramp is inside the measured windows"
    checks = {c.name: c for c in trust_checks(pd.Series(m), "p rep 1")}
    assert not checks["warm-up long enough"].ok and not checks["stationary windows"].ok
    steady = [round(v) for v in 1000 + rng.normal(0, 10, 60)]
    every = [_windows(steady, ["warmup"] * 10 + ["measure"] * 50)]
    kept = [[w for w in every[0] if w["client"]["phase"] == "measure"]]
    m = trust_metrics(every, kept)
    checks = {c.name: c for c in trust_checks(pd.Series(m), "p rep 1")}
    assert checks["warm-up long enough"].ok and checks["stationary windows"].ok
    assert m["client_tput_run_ci_method"] == "batch means"
    assert m["client_tput_run_ci_lo"] < np.mean(steady[10:]) < m["client_tput_run_ci_hi"]
    # Repetitions that got slower in the order they ran.
    summary = pd.DataFrame(
        {
            "point": ["a"] * 6,
            "status": ["ok"] * 6,
            "start_unix_ms": [5, 1, 3, 2, 6, 4],
            "client_tput": [950.0, 1000.0, 980.0, 990.0, 940.0, 960.0],
            "client_rt_p99_us": [100.0] * 6,
        }
    )
    agg = add_repetition_trust(pd.DataFrame({"point": ["a"], "client_tput": [970.0]}), summary)
    assert agg["reps_trend_p"][0] < 0.05
    assert agg["client_tput_ci_lo"][0] < 970.0 < agg["client_tput_ci_hi"][0]
