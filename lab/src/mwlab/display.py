"""How the lab's tables look where people read them (the report page; the
terminal uses the same number formats). The CSV files keep every digit: they
are data; this is presentation, decided once here by a column's name and its
values rather than by each table's producer:

- a raw column name the page has a word for gets it (`x_cv` → "throughput
  CV"); a column `c` with `c_lo` and `c_hi` beside it shows them as one
  "lo .. hi" column (the lab's intervals on such columns are 90%);
- an error (a header with the word "error") is a signed percentage, "+4.2%";
  a coefficient of variation, a utilisation ("U ...", "busy"), a share
  ("share ...") or a share of variation or an interval's half-width a plain
  one, "18.7%";
- a column whose values are all whole numbers (N, repetitions, counts) shows
  integers, never "2.00";
- any other number shows three significant digits of the column's typical
  (median) value, the same decimals down the column (at most three); a
  column without a unit in its header at most the decimals the template
  asks for;
- a column empty in every row is left out.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Callable

import pandas as pd

from mwlab.noise import CONFIDENCE

# Raw column names (as the CSV files have them) and what a table calls them.
HEADERS = {
    "x_cv": "throughput CV",
    "r_cv": "response time CV",
    "reps": "repetitions",
    "df": "degrees of freedom",
    "calls_for_clients": "calls for clients' requests",
}
INTERVAL = f"{CONFIDENCE:.0%} interval"
SIGNIFICANT = 3
MAX_DECIMALS = 3

_SIGNED = re.compile(r"\berror\b", re.IGNORECASE)
_SHARE = re.compile(r"\bCV\b|^U |\bbusy\b|utili[sz]ation|^variation$|half-width|^share\b")
_UNIT = re.compile(r"\([^()]+\)$")


def is_number(v: object) -> bool:
    """A real number that is not missing (booleans are not numbers here)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(v)


def pct(v: float, signed: bool = False) -> str:
    """A fraction as a percentage with one decimal ("+4.2%" when signed)."""
    return f"{100 * v:+.1f}%" if signed else f"{100 * v:.1f}%"


def decimals_for(values: list[float], significant: int = SIGNIFICANT) -> int:
    """Decimals that give the column's median magnitude `significant` digits
    (at most MAX_DECIMALS: a column spanning many orders of magnitude does
    not show its tiniest values to the last digit)."""
    sizes = sorted(abs(v) for v in values if v)
    if not sizes:
        return 0
    median = sizes[(len(sizes) - 1) // 2]
    return min(MAX_DECIMALS, max(0, significant - 1 - math.floor(math.log10(median))))


def formatter(header: str, values: pd.Series, digits: int) -> Callable[[object], str]:
    """How the cells of one column are written (see the module's rules)."""
    nums = [float(v) for v in values if is_number(v)]
    if _SIGNED.search(header):
        number = lambda v: pct(v, signed=True)  # noqa: E731
    elif _SHARE.search(header):
        number = pct
    elif nums and all(v == round(v) for v in nums):
        number = lambda v: f"{round(v):,}"  # noqa: E731
    else:
        places = decimals_for(nums)
        if not _UNIT.search(header):
            places = min(places, digits)
        number = lambda v: f"{v:,.{places}f}"  # noqa: E731

    def cell(v: object) -> str:
        if is_number(v):
            return number(float(v))
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
            return ""
        return str(v)

    return cell


def readable(df: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """`df` as the strings a reader sees: headers, intervals merged, numbers
    formatted, columns empty in every row left out."""
    paired = {f"{c}_{end}" for c in df.columns for end in ("lo", "hi") if f"{c}_lo" in df and f"{c}_hi" in df}
    headers: list[str] = []
    columns: list[list[str]] = []
    for c in df.columns:
        if c in paired:
            continue
        header = HEADERS.get(str(c), str(c))
        cell = formatter(header, df[c], digits)
        headers.append(header)
        columns.append([cell(v) for v in df[c]])
        if f"{c}_lo" in df and f"{c}_hi" in df:
            lo, hi = (df[f"{c}_{end}"] for end in ("lo", "hi"))
            headers.append(INTERVAL)
            columns.append(
                [
                    f"{cell(a)} .. {cell(b)}" if is_number(a) and is_number(b) else ""
                    for a, b in zip(lo, hi, strict=True)
                ]
            )
    keep = [i for i, col in enumerate(columns) if any(s.strip() for s in col)]
    out = pd.DataFrame({i: columns[i] for i in keep}, index=range(len(df)))
    out.columns = [headers[i] for i in keep]
    return out


def json_text(obj: object) -> str:
    """`obj` as strict JSON: a number that is not finite (NaN, ±inf: an
    interval with no end, a figure not measured) becomes null, since JSON has
    no such numbers and other parsers refuse Python's NaN."""

    def clean(v: object) -> object:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, numbers.Real) and not isinstance(v, (bool, int)):
            f = float(v)
            return f if math.isfinite(f) else None
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            return int(v)
        return v

    return json.dumps(clean(obj), allow_nan=False)
