"""`mwlab compare A B`: two result sets of the same experiment side by side,
with a test of whether each difference is more than noise.

The test is Welch's t-test (unequal variances): over the repetitions of a
point when both sets have at least two, otherwise over the per-window values
of the one run (throughput and mean response time per window; windows are
autocorrelated, so that test is optimistic and is labelled as such). With
fewer than two values on a side the verdict is "not enough data", never a
silent "not significant".

When both results measured the reference point (`mwlab.drift`), each ratio
is also given scaled by the reference ratio (throughputs divided by it,
times multiplied), and a difference the test finds is called "within the
machine's drift" when the scaled ratio lies inside the ratio's 90%
uncertainty (with the error of carrying it to another system).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from scipy import stats

from mwlab.analysis import read_experiment, tables, trim_client
from mwlab.drift import TRANSFER, Z90, DriftError, Ratio, ratio
from mwlab.results import read_windows

COLUMNS = ("client_tput", "client_rt_mean_us", "client_rt_p99_us", "mw_tput", "mw_queue_us")
WINDOW_FIGURES = ("client_tput", "client_rt_mean_us")
ALPHA = 0.05


class CompareError(ValueError):
    """Two result sets that cannot be compared."""


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


def reference_ratio(a: Path, b: Path) -> tuple[Ratio | None, str]:
    """The reference ratio of B to A and a line saying it (or why there is none)."""
    try:
        rho = ratio(a, b)
    except (DriftError, OSError) as e:
        return None, f"reference: not scaled ({e})"
    return rho, "reference: " + rho.text()


def compare(a: Path, b: Path) -> pd.DataFrame:
    """Per point and figure: A, B, B/A, the test's p-value, its basis and the
    verdict; with the reference point in both, B/A scaled by the reference
    ratio and the verdict on it."""
    ma, mb = (read_experiment(r) for r in (a, b))
    if ma.name != mb.name:
        raise CompareError(f"different experiments: {ma.name!r} and {mb.name!r}")
    rho, _ = reference_ratio(a, b)
    (sa, da), (sb, db) = tables(a), tables(b)
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
            ba = rb[col] / ra[col] if ra[col] else math.nan
            rows.append(
                {
                    "point": point,
                    "figure": col,
                    "A": ra[col],
                    "B": rb[col],
                    "B/A": ba,
                    "p": p,
                    "test": basis,
                    "verdict": verdict(p),
                    **({} if rho is None else scaled(col, ba, p, rho)),
                }
            )
    if not rows:
        raise CompareError("no point appears in both result sets")
    return pd.DataFrame(rows)


# Figures that are times (a slower machine makes them longer); the rest are rates.
TIMES = ("client_rt_mean_us", "client_rt_p99_us", "mw_queue_us")


def scaled(col: str, b_over_a: float, p: float, rho: Ratio) -> dict[str, object]:
    """B/A scaled to A's machine by the reference ratio, and its verdict."""
    value = b_over_a * rho.value if col in TIMES else b_over_a / rho.value
    band = Z90 * math.hypot(rho.sigma, TRANSFER)
    if math.isnan(p) or p >= ALPHA or math.isnan(value):
        word = verdict(p)
    elif abs(math.log(value)) <= band:
        # Not told from what the reference ratio allows (the ratio itself
        # is uncertain: this says nothing of which way the machine moved).
        word = f"within the reference's uncertainty (±{math.expm1(band):.0%})"
    else:
        word = "different"
    return {"B/A scaled": value, "scaled verdict": word}


def _reps(summary: pd.DataFrame, point: str, col: str) -> list[float]:
    if summary.empty or col not in summary:
        return []
    ok = summary[(summary["point"] == point) & (summary.get("status", "ok") == "ok")]
    return [float(v) for v in ok[col] if not pd.isna(v)]


def differences(a: Path, b: Path) -> list[str]:
    """The settings and factor levels that differ between two result sets,
    as `key: A -> B` (empty: the same experiment run twice)."""
    from mwlab.spec import flatten

    ma, mb = read_experiment(a), read_experiment(b)
    fa, fb = flatten(ma.settings), flatten(mb.settings)
    out = [f"{k}: {fa.get(k)} -> {fb.get(k)}" for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    for k in sorted(set(ma.factors) | set(mb.factors)):
        if ma.factors.get(k) != mb.factors.get(k):
            out.append(f"factor {k}: {ma.factors.get(k)} -> {mb.factors.get(k)}")
    return out


def write_page(a: Path, b: Path, table: pd.DataFrame, out: Path | None = None) -> Path:
    """A self-contained HTML page: both result sets' curves on common axes with
    their 95% intervals, the verdict per point and figure, and what differs.
    Written to `out` (default: compare.html in B)."""
    from mwlab.plots import axis_and_lines, error_label, line, save_panels
    from mwlab.render import environment

    out = out or b / "compare.html"
    meta = read_experiment(a)
    (_, da), (_, db) = tables(a), tables(b)
    x, lines = axis_and_lines(da, meta.columns)
    xlabel = "clients (N)" if x == "N" else x

    def panel(y: str, ylabel: str, scale: float = 1.0):
        def draw(ax):
            line(ax, da, x, lines, y, "A", scale, "-o")
            line(ax, db, x, lines, y, "B", scale, "--s")
            ax.set_ylabel(ylabel)
            ax.set_title(error_label(da, ci=True))

        return draw

    panels = [
        (title, panel(*how))
        for title, how in (
            ("Throughput", ("client_tput", "throughput (ops/s)")),
            ("Mean response time", ("client_rt_mean_us", "response time (ms)", 1e-3)),
        )
        if how[0] in da and how[0] in db
    ]
    plots = out.parent / f"{out.stem}-plots"
    png, _ = save_panels(plots, "curves", panels, xlabel)
    shown = table.copy()
    shown["p"] = shown["p"].map(lambda v: "" if math.isnan(v) else f"{v:.3g}")
    html = (
        environment()
        .from_string(PAGE)
        .render(
            name=meta.name,
            a=a,
            b=b,
            png=png,
            differs=differences(a, b),
            table=shown,
            counts=table["verdict"].value_counts().to_dict(),
            alpha=ALPHA,
            reference=reference_ratio(a, b)[1],
        )
    )
    out.write_text(html, encoding="utf-8")
    return out


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{{ name }}: A against B</title>
<style>
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
img{max-width:100%}.wide{overflow-x:auto}
.muted{color:#666}
</style></head><body>
<h1>{{ name }}: A against B</h1>
<p class="muted">A: <code>{{ a }}</code><br>B: <code>{{ b }}</code></p>
<h2>What differs</h2>
{% if differs %}<ul>{% for d in differs %}<li><code>{{ d }}</code></li>{% endfor %}</ul>
{% else %}<p>Nothing in the settings: the same experiment run twice
(a difference is the machine's or chance's).</p>{% endif %}
<h2>Verdict</h2>
<p>{% for v, n in counts.items() %}{{ n }} {{ v }}{{ ", " if not loop.last }}{% endfor %}
— Welch's t at {{ alpha }} over the repetitions of a point, or over its windows where a side has one
repetition (optimistic: windows are correlated).</p>
<figure><img alt="curves" src="{{ png | data_uri }}">
<figcaption>A: solid, B: dashed; bars are 95% intervals.</figcaption></figure>
<p>{{ reference }}{% if "B/A scaled" in table %} — <i>B/A scaled</i> is B/A on A's machine
(rates divided by the ratio, times multiplied); a difference the test finds is "within the reference's
uncertainty" when the scaled ratio is inside the ratio's 90% uncertainty.{% endif %}</p>
{{ table | table(2) }}
</body></html>
"""
