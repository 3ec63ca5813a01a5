"""`mwlab compare A B`: two result sets of the same experiment side by side,
with a test of whether each difference is more than noise.

The test is Welch's t-test (unequal variances): over the repetitions of a
point when both sets have at least two, otherwise over the per-window values
of the one run (throughput and mean response time per window; windows are
autocorrelated, so that test is optimistic and is labelled as such). With
fewer than two values on a side the verdict is "not enough data", never a
silent "not significant".
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from scipy import stats

from mwlab.analysis import read_experiment, summarize, trim_client
from mwlab.results import read_windows

COLUMNS = ("client_tput", "client_rt_mean_us", "client_rt_p99_us", "mw_tput", "mw_queue_us")
WINDOW_FIGURES = ("client_tput", "client_rt_mean_us")
ALPHA = 0.05


class CompareError(ValueError):
    """Two result sets that cannot be compared."""


def _tables(result: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    if not (result / "summary.csv").exists() or not (result / "aggregate.csv").exists():
        return summarize(result)
    return pd.read_csv(result / "summary.csv"), pd.read_csv(result / "aggregate.csv")


def window_values(result: Path, point: str, figure: str) -> list[float]:
    """Per-window throughput or mean response time of a point's runs (all clients together)."""
    values: list[float] = []
    for rdir in sorted((result / point).glob("rep-*")):
        per: dict[int, list[float]] = {}
        for cdir in sorted(rdir.glob("cl[0-9]*")):
            for w in trim_client(read_windows(cdir)):
                a = w["ops"]["all"]
                acc = per.setdefault(w["start_unix_ms"], [0.0, 0.0, 0.0])
                acc[0] += a["count"] / (w["duration_ms"] / 1000)
                if a["count"]:
                    acc[1] += a["response_us"]["mean"] * a["count"]
                    acc[2] += a["count"]
        for tput, rt_sum, n in per.values():
            if figure == "client_tput":
                values.append(tput)
            elif n:
                values.append(rt_sum / n)
    return values


def welch(a: list[float], b: list[float]) -> float:
    """The two-sided p-value of Welch's t-test; NaN with fewer than two values on a side."""
    a = [x for x in a if not math.isnan(x)]
    b = [x for x in b if not math.isnan(x)]
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    if pd.Series(a).std() == 0 and pd.Series(b).std() == 0:
        return 0.0 if a[0] != b[0] else 1.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def verdict(p: float) -> str:
    if math.isnan(p):
        return "not enough data"
    return "different" if p < ALPHA else "no significant difference"


def compare(a: Path, b: Path) -> pd.DataFrame:
    """Per point and figure: A, B, B/A, the test's p-value, its basis and the verdict."""
    ma, mb = (read_experiment(r) for r in (a, b))
    if ma.name != mb.name:
        raise CompareError(f"different experiments: {ma.name!r} and {mb.name!r}")
    (sa, da), (sb, db) = _tables(a), _tables(b)
    rows = []
    for _, ra in da.iterrows():
        match = db[db["point"] == ra["point"]]
        if match.empty:
            continue
        rb = match.iloc[0]
        point = str(ra["point"])
        for col in COLUMNS:
            if col not in ra or col not in rb or pd.isna(ra[col]) or pd.isna(rb[col]):
                continue
            reps_a = _reps(sa, point, col)
            reps_b = _reps(sb, point, col)
            if len(reps_a) >= 2 and len(reps_b) >= 2:
                p, basis = welch(reps_a, reps_b), "repetitions"
            elif col in WINDOW_FIGURES:
                p, basis = welch(window_values(a, point, col), window_values(b, point, col)), "windows"
            else:
                p, basis = float("nan"), "-"
            rows.append(
                {
                    "point": point,
                    "figure": col,
                    "A": ra[col],
                    "B": rb[col],
                    "B/A": rb[col] / ra[col] if ra[col] else float("nan"),
                    "p": p,
                    "test": basis,
                    "verdict": verdict(p),
                }
            )
    if not rows:
        raise CompareError("no point appears in both result sets")
    return pd.DataFrame(rows)


def _reps(summary: pd.DataFrame, point: str, col: str) -> list[float]:
    if summary.empty or col not in summary:
        return []
    ok = summary[(summary["point"] == point) & (summary.get("status", "ok") == "ok")]
    return [float(v) for v in ok[col] if not pd.isna(v)]
