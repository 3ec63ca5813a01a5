"""The answer in the terminal: after `mwlab run` (and `mwlab analyze`) prints
its key numbers, the checks that need a look — one line per check that did
not pass, how many runs or points, an example with its numbers and what to
do — and the CPU other processes took during the runs (interference), from
the result's `checks.csv` and `summary.csv`. When every check passes, one
line says so. The report's Checks section has the same verdicts in full.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mwlab.checks import INTERFERENCE_LIMIT
from mwlab.leaveout import COVERAGE_GOAL

# What to do when a check does not pass, by check name (checks.py). A check
# about a remote host ("no interference on H", "H CPU not saturated") takes
# the advice of its local form.
ADVICE = {
    "runs": "no run finished: the report's Failed runs and each run's logs/ say why",
    "run": "its error is in the report's Failed runs and in the run's logs/; "
    "`mwlab run SPEC --resume DIR` runs the failed runs again",
    "interactive law": "R is not N/X - Z: the clients paused between requests (see the load generator) "
    "or requests went missing (see errors)",
    "client vs middleware throughput": "the clients and the middleware counted different rates: "
    "look at errors and at the middleware's log in the run's logs/",
    "stable across windows": "throughput moved from window to window: run longer (--scale full) "
    "or on a quieter machine",
    "no interference": "those runs measured the neighbours too: run them again on a quiet machine",
    "host CPU not saturated": "every process shares the same cores there: read those points as the "
    "machine's limit as much as the system's (fewer clients, or a machine with more cores)",
    "load generator not saturated": "the load, not the system, set the throughput: more client threads "
    "or instances (tcli, icli)",
    "link delay as configured": "the emulated delay was not what the spec asked: the machine was too "
    "busy for the relay; run on a quieter machine",
    "warm-up long enough": "the first measured windows differ from the rest: a longer run.warmup",
    "stationary windows": "throughput trended during the measurement: a longer run.warmup, or a "
    "quieter machine",
    "load generator kept its schedule": "the load generator fell behind its target rate: a lower rate "
    "per thread, or more client threads",
    "arrivals exponential": "the gaps between sends were not exponential: the generator could not keep "
    "its schedule (see that check)",
    "interactive law in every window": "a window's R was off N/X - Z: something paused the run; see "
    "Throughput over time in the report",
    "errors": "requests failed: the run's logs/ say why",
    "misses": "gets found no value: workload.prefill off, or memcached evicting (keys x value_size "
    "beyond its memory)",
    "empty receives": "receives mostly found no message: the clients wait on each other more than on "
    "the system",
    "stable across repetitions": "repetitions disagree: more of them (--until-ci) or a quieter machine",
    "no drift across repetitions": "throughput trended over the repetitions: the machine changed during "
    "the experiment; run again when it is quiet",
    "emulated link not saturated": "the emulated link, not the system, set the throughput",
    "CPU quota not throttling": "a host's CPU quota, not the system, set the throughput",
}
SEE_REPORT = "see the report's Checks"


def advice(name: str) -> str:
    """What to do about a check named `name` that did not pass."""
    if name in ADVICE:
        return ADVICE[name]
    if name.startswith("no interference on "):
        return ADVICE["no interference"]
    if name.endswith(" CPU not saturated"):
        return ADVICE["host CPU not saturated"]
    return SEE_REPORT


def _judged(checks: pd.DataFrame) -> pd.Series:
    return checks["verdict"] != "too short to judge"


def _ok(checks: pd.DataFrame) -> pd.Series:
    return checks["ok"].astype(str).str.lower() == "true"


def interference(summary: pd.DataFrame) -> tuple[float, float] | None:
    """(most cores other processes took in a finished run, usable cores), or
    None where the runs sampled no CPU."""
    if summary.empty or "cpu_other_cores" not in summary or "cores" not in summary:
        return None
    ok = summary[summary["status"] == "ok"] if "status" in summary else summary
    other, cores = ok["cpu_other_cores"].dropna(), ok["cores"].dropna()
    if other.empty or cores.empty:
        return None
    return float(other.max()), float(cores.max())


def look_lines(checks: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """The lines to print: one saying all is well, or a head line counting
    the checks (by name) that did not pass everywhere, and a line for each
    of them."""
    if checks.empty:
        return []
    judged, ok = _judged(checks), _ok(checks)
    failed = checks[judged & ~ok]
    short = int((~judged).sum())
    other = interference(summary)
    # A check is a name (one line below); checks.csv has a verdict per run or point of each.
    verdicts = f"{len(checks)} verdict{'s' if len(checks) != 1 else ''} in checks.csv"
    if failed.empty:
        n = checks["name"].nunique()
        line = f"All {n} check{'s' if n != 1 else ''} pass ({verdicts}"
        line += f", {short} too short to judge)" if short else ")"
        if other is not None:
            line += f"; other processes took at most {other[0]:.2f} of {other[1]:g} cores"
        return [line]
    n = failed["name"].nunique()
    counts = [f"{len(failed)} not met", f"{len(checks) - len(failed) - short} met"]
    counts += [f"{short} too short to judge"] if short else []
    need = "check needs" if n == 1 else "checks need"
    lines = [f"{n} {need} a look (of {verdicts}: {', '.join(counts)}):"]
    for name, group in failed.groupby("name", sort=False):
        of = int((checks["name"].eq(name) & judged).sum())
        first = group.iloc[0]
        if name == "no interference" and other is not None:
            example = (
                f"other processes took up to {other[0]:.2f} of {other[1]:g} cores "
                f"({other[0] / other[1]:.0%}; the limit is {INTERFERENCE_LIMIT:.0%})"
            )
        else:
            example = f"e.g. {first['where']}: {first['detail']}"
        what = "runs" if all(" rep " in str(w) for w in group["where"]) else "points"
        lines.append(
            f"  {name} — not met in {len(group)} of {of} {what}: {example}. {_capital(advice(str(name)))}."
        )
    if other is not None and "no interference" not in set(failed["name"]):
        lines.append(
            f"  (interference within the limit: other processes took at most {other[0]:.2f} "
            f"of {other[1]:g} cores)"
        )
    return lines


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def result_lines(result: Path) -> list[str]:
    """`look_lines` of a result directory (nothing where it has no checks.csv)."""
    path = result / "checks.csv"
    if not path.exists():
        return []
    checks = pd.read_csv(path)
    summary_path = result / "summary.csv"
    summary = pd.read_csv(summary_path) if summary_path.exists() else pd.DataFrame()
    return look_lines(checks, summary) + left_out_lines(result)


def left_out_lines(result: Path) -> list[str]:
    """How many points, left out in turn, their intervals covered (from
    leave-one-out.csv; nothing where the result has none)."""
    path = result / "leave-one-out.csv"
    if not path.exists():
        return []
    t = pd.read_csv(path)
    if t.empty or "covered" not in t:
        return []
    covered, n = int((t["covered"] == "yes").sum()), len(t)
    verdict = (
        "met" if covered / n >= COVERAGE_GOAL else "not met: the report's Leave one out table says where"
    )
    return [
        f"Left out in turn, {covered} of {n} points lie in their predicted 90% intervals "
        f"(goal {COVERAGE_GOAL:.0%}: {verdict})."
    ]
