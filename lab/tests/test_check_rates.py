"""The statistical checks' false-alarm rates on steady series and their power
on series with a transient or a drift (docs/statistics.md lists the rates).
Series of 10, 20, 60 and 300 windows, seeded, so every run sees the same
numbers; a check may raise a false alarm on at most 5% of steady series."""

from __future__ import annotations

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from mwlab import stats
from mwlab.analysis import gap_fit
from mwlab.results import HIST_DIGITS, HIST_HIGHEST, HIST_LOWEST

LENGTHS = (10, 20, 60, 300)
MAX_FALSE_ALARMS = 0.05


def trials(n: int) -> int:
    return 300 if n < 300 else 150


def steady(rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-window throughput of a steady run: mean 100, sd 3, independent."""
    return rng.normal(100, 3, n)


def transient(rng: np.random.Generator, n: int) -> np.ndarray:
    """A warm-up: the first fifth of the windows starts 5 sd low and recovers."""
    a = steady(rng, n)
    k = max(n // 5, 2)
    a[:k] -= np.linspace(15, 3, k)
    return a


def drift(rng: np.random.Generator, n: int) -> np.ndarray:
    """A run that slows down: 3 sd (9%) from first window to last."""
    return steady(rng, n) - np.linspace(0, 9, n)


def rate(check, make, n: int, seed: int) -> tuple[float, int]:
    """The share of series the check flags, and how many it could judge."""
    rng = np.random.default_rng(seed)
    flagged = judged = 0
    for _ in range(trials(n)):
        verdict = check(make(rng, n))
        if verdict is None:
            continue
        judged += 1
        flagged += verdict
    return (flagged / judged if judged else 0.0), judged


def warmup_check(a: np.ndarray) -> bool | None:
    # The run's check: the same windows' throughput and two response-time series.
    w = stats.warmup(
        a, 200 - a, 1.5 * (200 - a) + np.random.default_rng(int(a[0] * 1000)).normal(0, 3, len(a))
    )
    return None if not w.judged else w.cut > 0


def stationary_check(a: np.ndarray) -> bool | None:
    st = stats.stationarity(a)
    if not st.judged:
        return None
    return not (st.stationary and not stats.trend(a).trending)


def drift_check(a: np.ndarray) -> bool | None:
    # Repetitions in run order (the check needs 4).
    return None if len(a) < 4 else stats.trend(a).trending


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize(
    ("name", "check"), [("warm-up", warmup_check), ("stationarity", stationary_check), ("drift", drift_check)]
)
def test_false_alarms_on_steady_series(name, check, n):
    share, judged = rate(check, steady, n, seed=n)
    assert share <= MAX_FALSE_ALARMS, f"{name}: {share:.1%} of {judged} steady series of {n} flagged"


def test_short_series_are_not_judged():
    rng = np.random.default_rng(0)
    w = stats.warmup(steady(rng, 11))
    assert not w.judged and w.cut == 0 and "too short to judge" in w.method
    st = stats.stationarity(steady(rng, 9))
    assert not st.judged and st.stationary and "too short to judge" in st.method


@pytest.mark.parametrize(("n", "power"), [(20, 0.6), (60, 0.95), (300, 0.95)])
def test_the_warm_up_check_finds_a_transient(n, power):
    share, _ = rate(warmup_check, transient, n, seed=100 + n)
    assert share >= power, f"a transient found in {share:.1%} of series of {n}"


@pytest.mark.parametrize(("n", "power"), [(20, 0.5), (60, 0.95), (300, 0.95)])
def test_stationarity_and_drift_find_a_drift(n, power):
    for check in (stationary_check, drift_check):
        share, _ = rate(check, drift, n, seed=200 + n)
        assert share >= power, f"{check.__name__}: a drift found in {share:.1%} of series of {n}"


def gaps_histogram(gaps: np.ndarray) -> HdrHistogram:
    h = HdrHistogram(HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS)
    for g in gaps:
        h.record_value(max(int(g), 1))
    return h


@pytest.mark.parametrize("sends", [200, 2000, 20000])
def test_the_arrivals_check_on_exponential_and_other_gaps(sends):
    rng = np.random.default_rng(sends)
    runs = 100 if sends < 20000 else 40
    false = sum(gap_fit(gaps_histogram(rng.exponential(1000, sends)))[0].rejected for _ in range(runs))
    assert false / runs <= MAX_FALSE_ALARMS, f"{false} of {runs} exponential runs flagged"
    # A generator that sends on a fixed beat with jitter is not Poisson.
    beat = sum(gap_fit(gaps_histogram(rng.uniform(500, 1500, sends)))[0].rejected for _ in range(runs))
    assert beat / runs >= 0.95
