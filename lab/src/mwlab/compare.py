"""`mwlab compare A B`: two result sets of the same experiment side by side."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from mwlab.analysis import read_experiment, summarize

COLUMNS = ("client_tput", "client_rt_mean_us", "client_rt_p99_us", "mw_tput", "mw_queue_us")


class CompareError(ValueError):
    """Two result sets that cannot be compared."""


def _aggregate(result: Path) -> pd.DataFrame:
    path = result / "aggregate.csv"
    if not path.exists():
        summarize(result)
    return pd.read_csv(path)


def compare(a: Path, b: Path) -> pd.DataFrame:
    """Per point and figure: A, B, B/A, and whether the difference exceeds the two spreads."""
    ma, mb = (read_experiment(r) for r in (a, b))
    if ma["name"] != mb["name"]:
        raise CompareError(f"different experiments: {ma['name']!r} and {mb['name']!r}")
    da, db = _aggregate(a), _aggregate(b)
    rows = []
    for _, ra in da.iterrows():
        match = db[db["point"] == ra["point"]]
        if match.empty:
            continue
        rb = match.iloc[0]
        for col in COLUMNS:
            if col not in ra or col not in rb or pd.isna(ra[col]) or pd.isna(rb[col]):
                continue
            sa = ra.get(f"{col}_std", float("nan"))
            sb = rb.get(f"{col}_std", float("nan"))
            spread = (0 if math.isnan(sa) else sa) + (0 if math.isnan(sb) else sb)
            diff = rb[col] - ra[col]
            rows.append(
                {
                    "point": ra["point"],
                    "figure": col,
                    "A": ra[col],
                    "B": rb[col],
                    "B/A": rb[col] / ra[col] if ra[col] else float("nan"),
                    "significant": bool(spread) and abs(diff) > spread,
                }
            )
    if not rows:
        raise CompareError("no point appears in both result sets")
    return pd.DataFrame(rows)
