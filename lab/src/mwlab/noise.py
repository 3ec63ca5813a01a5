"""The noise floor: how much one run's throughput and mean response time
scatter from run to run on this machine, per configuration (`noise.csv`,
the report's Noise floor table, and the width every prediction carries).

- **From repetitions** (a configuration with points repeated at least
  twice): each point's coefficient of variation across its repetitions (the
  sample standard deviation over the mean), pooled over the configuration's
  points by their degrees of freedom: CV = sqrt(sum (reps - 1) CV_i^2 / sum
  (reps - 1)). Its 90% confidence interval comes from the chi-square
  distribution of the pooled variance with those degrees of freedom (the
  test: a normal model of the runs, a chi-square interval for sigma).
- **From batch means** (every point run once): the windows of each run are
  batches; the standard deviation of the window means over the run's mean,
  divided by the square root of the number of windows, is the standard error
  of that run's mean if the windows are independent. It is a floor, not the
  whole noise: what changes between runs (the machine's other load, where
  the kernel put the threads) does not show inside one run, so it is marked
  as a lower bound.

A point of a configuration measured with r repetitions is a mean of r runs:
its own noise is CV / sqrt(r).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from scipy import stats as sps

from mwlab.fit import num

# Confidence of the interval on the noise itself.
CONFIDENCE = 0.90


@dataclass
class Noise:
    """The run-to-run noise of one configuration."""

    x_cv: float
    r_cv: float
    # Mean repetitions behind a point (its mean has CV / sqrt(reps)).
    reps: float
    # Degrees of freedom of the pooled estimate (0 for batch means).
    df: int
    method: str
    x_cv_lo: float = float("nan")
    x_cv_hi: float = float("nan")
    r_cv_lo: float = float("nan")
    r_cv_hi: float = float("nan")

    @property
    def lower_bound(self) -> bool:
        """Batch means within runs: the run-to-run part is not in it."""
        return self.df == 0

    def point_cv(self, which: str) -> float:
        """The relative standard error of a point (a mean of `reps` runs)."""
        cv = self.x_cv if which == "x" else self.r_cv
        return cv / math.sqrt(max(self.reps, 1.0))


def _chi2_bounds(cv: float, df: int) -> tuple[float, float]:
    if df < 1 or math.isnan(cv):
        return float("nan"), float("nan")
    tail = (1 - CONFIDENCE) / 2
    lo = cv * math.sqrt(df / sps.chi2.ppf(1 - tail, df))
    hi = cv * math.sqrt(df / sps.chi2.ppf(tail, df))
    return lo, hi


def noise_of(rows: list[pd.Series]) -> Noise:
    """The noise of a configuration from its points (rows of aggregate.csv)."""
    reps = [num(r, "reps", 1.0) for r in rows]
    mean_reps = sum(reps) / len(reps) if reps else 1.0
    pooled: dict[str, list[tuple[float, float]]] = {"x": [], "r": []}
    for r, k in zip(rows, reps, strict=True):
        if k < 2:
            continue
        for which, col in (("x", "client_tput"), ("r", "client_rt_mean_us")):
            mean, std = num(r, col), num(r, f"{col}_std")
            if mean > 0 and not math.isnan(std):
                pooled[which].append((k - 1, (std / mean) ** 2))
    # Repetitions identical to the last digit (a copied or synthetic row) say
    # nothing about the noise: the windows' batch means speak instead.
    if pooled["x"] and any(v > 0 for _, v in pooled["x"]):
        df = int(sum(w for w, _ in pooled["x"]))
        cvs = {
            w: math.sqrt(sum(a * b for a, b in v) / sum(a for a, _ in v)) if v else float("nan")
            for w, v in pooled.items()
        }
        x_lo, x_hi = _chi2_bounds(cvs["x"], df)
        r_lo, r_hi = _chi2_bounds(cvs["r"], df)
        return Noise(
            cvs["x"],
            cvs["r"],
            mean_reps,
            df,
            "repetitions: pooled CV, chi-square 90% interval",
            x_lo,
            x_hi,
            r_lo,
            r_hi,
        )
    xs, rs = [], []
    for r in rows:
        windows = num(r, "windows")
        if not windows or math.isnan(windows) or windows < 2:
            continue
        for out, col, wcol in (
            (xs, "client_tput", "client_tput_window_std"),
            (rs, "client_rt_mean_us", "client_rt_window_std_us"),
        ):
            mean, wstd = num(r, col), num(r, wcol)
            if mean > 0 and not math.isnan(wstd):
                out.append(wstd / mean / math.sqrt(windows))
    rms = lambda v: math.sqrt(sum(c * c for c in v) / len(v)) if v else float("nan")  # noqa: E731
    return Noise(rms(xs), rms(rs), mean_reps, 0, "batch means of one run's windows (a lower bound)")


def noise_table(groups: dict[str, list[pd.Series]]) -> pd.DataFrame:
    """One row per configuration: its noise floor and how it was measured."""
    rows = []
    for label, points in groups.items():
        nz = noise_of(points)
        rows.append(
            {
                "configuration": label or "(the only one)",
                "points": len(points),
                "reps": nz.reps,
                "x_cv": nz.x_cv,
                "x_cv_lo": nz.x_cv_lo,
                "x_cv_hi": nz.x_cv_hi,
                "r_cv": nz.r_cv,
                "r_cv_lo": nz.r_cv_lo,
                "r_cv_hi": nz.r_cv_hi,
                "df": nz.df,
                "method": nz.method,
            }
        )
    return pd.DataFrame(rows)
