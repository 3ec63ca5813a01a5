"""What report.html shows, computed: the checks, the fits and their files
(`checks.csv`, `model.csv`, `utilization.csv`), the plots (PNG and SVG under
`plots/`) and every table, gathered in a [`Report`]. Turning it into the page
is `render.py`'s business (a Jinja2 template; `render.write_report` does
both), so the numbers and the words about them live apart."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mwlab.analysis import read_experiment
from mwlab.checks import INTERFERENCE_LIMIT, SATURATION_LIMIT, Check, run_checks, to_frame
from mwlab.drift import View
from mwlab.drift import view as drift_view
from mwlab.fit import (
    HANDOFFS_IN_HOLD,
    HANDOFFS_OUTSIDE,
    HOLDS,
    ExperimentFit,
    bottleneck_agrees,
    factorial_fit,
    fit_experiment,
    handoffs,
    law_table,
    model_table,
    queue_views,
    utilization_table,
)
from mwlab.heldout import Predictions, predictions
from mwlab.plots import make_plots, model_vs_measured, save_figure, variation_chart
from mwlab.route_report import RouteTables
from mwlab.route_report import tables as route_tables
from mwlab.spec import Settings


@dataclass
class Note:
    """A sentence about the runs, good news or a warning."""

    ok: bool
    text: str


@dataclass
class Miss:
    """A point where the model is off by more than HOLDS, and why it may be."""

    point: str
    x_error: str
    r_error: str
    why: str


@dataclass
class Models:
    """The Models section: the closed network of every point, the operational
    laws, the single-queue views and a 2^k r analysis, where they apply."""

    fit: ExperimentFit | None = None
    points: pd.DataFrame = field(default_factory=pd.DataFrame)
    misses: list[Miss] = field(default_factory=list)
    laws: pd.DataFrame = field(default_factory=pd.DataFrame)
    bounds: pd.DataFrame = field(default_factory=pd.DataFrame)
    figures: list[Path] = field(default_factory=list)
    worker_views: pd.DataFrame = field(default_factory=pd.DataFrame)
    pool_views: pd.DataFrame = field(default_factory=pd.DataFrame)
    factorial: pd.DataFrame = field(default_factory=pd.DataFrame)
    factorial_title: str = ""
    factorial_figure: Path | None = None
    holds: float = HOLDS

    @property
    def delays(self) -> str:
        """The fitted delay(s) in words."""
        if self.fit is None:
            return ""
        if len(self.fit.delays) > 1:
            each = ", ".join(f"{e} {d:.1f} µs" for e, d in self.fit.delays.items())
            return f"The delay is the one fitted parameter, fitted for each engine ({each})"
        return f"The delay, {self.fit.delay_us:.1f} µs, is the one fitted parameter"

    @property
    def empty(self) -> bool:
        return (
            self.points.empty and self.worker_views.empty and self.pool_views.empty and self.factorial.empty
        )


@dataclass
class CheckGroup:
    """One check over every run or point: how many passed, the ones that did
    not, spelled out, and the rest (folded away on the page)."""

    name: str
    anchor: str
    passed: int
    judged: int
    not_judged: int
    failed: list[Check]
    rest: list[Check]

    @property
    def line(self) -> str:
        """How the group did, "too short to judge" said once."""
        short = [c for c in self.rest if not c.judged]
        why = {c.detail for c in short}
        reason = f" ({why.pop()})" if len(why) == 1 else ""
        if not self.judged:
            return f"too short to judge in all {self.not_judged}{reason}"
        text = f"passed {self.passed} of {self.judged}"
        if self.not_judged:
            text += f"; {self.not_judged} too short to judge{reason}"
        return text

    @property
    def rest_lines(self) -> list[str]:
        """The checks that passed, each with its numbers, and those too short
        to judge where they were not all short by the same amount (`line`
        says that once)."""
        short = [c for c in self.rest if not c.judged]
        same = len({c.detail for c in short}) == 1
        return [
            f"{c.where} — {c.verdict}: {c.detail}" if c.judged else f"{c.where} — {c.detail}"
            for c in self.rest
            if c.judged or not same
        ]


def group_checks(checks: list[Check]) -> list[CheckGroup]:
    """The checks by name, the groups with failures first."""
    names: dict[str, list[Check]] = {}
    for c in checks:
        names.setdefault(c.name, []).append(c)
    groups = []
    for name, cs in names.items():
        failed = [c for c in cs if c.judged and not c.ok]
        judged = [c for c in cs if c.judged]
        groups.append(
            CheckGroup(
                name=name,
                anchor="check-" + "".join(ch if ch.isalnum() else "-" for ch in name.lower()),
                passed=len(judged) - len(failed),
                judged=len(judged),
                not_judged=len(cs) - len(judged),
                failed=failed,
                rest=[c for c in cs if c not in failed],
            )
        )
    return sorted(groups, key=lambda g: (not g.failed, g.name))


def best_points(
    aggregate: pd.DataFrame, factors: list[str], whole: str
) -> list[tuple[str, pd.DataFrame, pd.Series]]:
    """Per configuration (the factors other than the client counts): its
    label (`whole` when there is one), its points, and the point of largest
    throughput."""
    from mwlab.fit import CLIENT_FACTORS

    others = [f for f in factors if f in aggregate and f not in CLIENT_FACTORS]
    groups = [((), aggregate)] if not others else list(aggregate.groupby(others, sort=True))
    out = []
    for key, g in groups:
        if g["client_tput"].isna().all():
            continue
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{f}={v}" for f, v in zip(others, key, strict=False)) or whole
        out.append((label, g, g.loc[g["client_tput"].idxmax()]))
    return out


def summary_table(aggregate: pd.DataFrame, factors: list[str], fit: ExperimentFit | None) -> pd.DataFrame:
    """Per configuration: the maximum throughput, where it is reached, the
    response time there, what limits it, and how far the model is off."""
    if aggregate.empty or "client_tput" not in aggregate:
        return pd.DataFrame()
    points = {p.point: p for p in fit.points} if fit else {}
    rows = []
    for label, g, best in best_points(aggregate, factors, "as measured"):
        p = points.get(str(best.get("point")))
        errs = [
            (max(abs(q.x_error), abs(q.r_error)), q)
            for q in (points.get(str(pt)) for pt in g["point"])
            if q is not None
        ]
        worst = max(errs, key=lambda e: e[0]) if errs else None
        rows.append(
            {
                "configuration": label,
                "max throughput (ops/s)": best["client_tput"],
                "at N": int(best["N"]) if not pd.isna(best.get("N")) else "",
                "mean R there (ms)": _ms(best.get("client_rt_mean_us", float("nan"))),
                "p99 there (ms)": _ms(best.get("client_rt_p99_us", float("nan"))),
                "bottleneck": p.bottleneck if p else "",
                "model's largest error": f"{worst[0]:.1%} (N={worst[1].n})" if worst else "",
            }
        )
    return pd.DataFrame(rows)


def headline(summary: pd.DataFrame) -> str:
    """The answer in one sentence."""
    if summary.empty:
        return "No point was measured."
    best = summary.loc[summary["max throughput (ops/s)"].idxmax()]
    where = "" if best["configuration"] == "as measured" else f" with {best['configuration']}"
    limit = f", limited by the {best['bottleneck']}" if best["bottleneck"] else ""
    return (
        f"The highest throughput is {best['max throughput (ops/s)']:,.0f} ops/s{where}, reached at "
        f"N = {best['at N']} clients with a mean response time of {best['mean R there (ms)']:.2f} ms{limit}."
    )


@dataclass
class Report:
    """Everything report.html shows."""

    result: Path
    name: str
    description: str
    scale: str
    runs: int
    noise: list[Note]
    noise_table: pd.DataFrame
    checks: list[Check]
    check_groups: list[CheckGroup]
    summary: pd.DataFrame
    headline: str
    points: pd.DataFrame
    max_throughput: pd.DataFrame
    stages: pd.DataFrame
    links: pd.DataFrame
    plots: list[tuple[str, Path, Path, Path | None]]
    models: Models
    predictions: Predictions
    failed: pd.DataFrame
    environment: dict[str, Any]
    spec: str
    # The reference point: how far the machine moved within the run and
    # since an earlier result (None: neither measured nor asked for).
    drift: View | None = None
    # Which pool served what (None: no run had pools and a route).
    routes: RouteTables | None = None


def compute(
    result: Path, summary: pd.DataFrame, aggregate: pd.DataFrame, since: Path | None = None
) -> Report:
    """Runs the checks and fits, writes checks.csv, model.csv, utilization.csv
    and the plots into `result`, and gathers what the report shows (the
    drift since the result `since`, when named)."""
    meta = read_experiment(result)
    factors = meta.columns
    checks = run_checks(summary, aggregate)
    to_frame(checks).to_csv(result / "checks.csv", index=False)
    noise, noise_table = noise_notes(summary)
    failed = summary[summary.get("status", "ok") != "ok"] if "status" in summary else summary.iloc[0:0]
    empty = aggregate.empty
    fitted = models(result, summary, aggregate, factors, meta.settings)
    table = summary_table(aggregate, factors, fitted.fit)
    return Report(
        result=result,
        name=meta.name,
        description=meta.description,
        scale=meta.scale,
        runs=len(summary),
        noise=noise,
        noise_table=noise_table,
        checks=sorted(checks, key=lambda c: (c.ok, c.name, c.where)),
        check_groups=group_checks(checks),
        summary=table,
        headline=headline(table),
        points=readable_points(aggregate, factors),
        max_throughput=aggregate if empty else max_throughput_table(aggregate, factors),
        stages=aggregate if empty else stage_table(aggregate),
        links=pd.DataFrame() if empty else link_table(aggregate),
        plots=make_plots(result, aggregate, factors),
        models=fitted,
        predictions=predictions(result, aggregate, meta),
        failed=failed[[c for c in ("point", "rep", "error") if c in failed]],
        environment=environment(result),
        spec=(result / "spec.yaml").read_text() if (result / "spec.yaml").exists() else "",
        drift=drift_view(result, since),
        routes=route_tables(result),
    )


def noise_notes(summary: pd.DataFrame) -> tuple[list[Note], pd.DataFrame]:
    """How far the runs measured the system under test rather than the machine:
    other processes' CPU, the host's and the load generator's saturation."""
    if summary.empty or "host_util" not in summary:
        return [Note(True, "(no CPU samples)")], pd.DataFrame()
    ok = summary[summary.get("status", "ok") == "ok"]
    if ok.empty:
        return [Note(True, "(no run finished)")], pd.DataFrame()
    cores = ok["cores"].max() if "cores" in ok else float("nan")
    other = ok.get("cpu_other_cores", pd.Series(dtype=float))
    host = ok["host_util"]
    gen = ok.get("cl_load_thread_util", pd.Series(dtype=float))
    notes = []
    busy = int((other > INTERFERENCE_LIMIT * cores).sum()) if not other.empty else 0
    if busy:
        notes.append(
            Note(
                False,
                f"In {busy} of {len(ok)} runs other processes took more than {INTERFERENCE_LIMIT:.0%} of the "
                f"{cores:g} cores (up to {other.max():.2f}): those results measure the neighbours too; run "
                "them again on a quiet machine.",
            )
        )
    sat = int((host >= SATURATION_LIMIT).sum())
    if sat:
        notes.append(
            Note(
                False,
                f"In {sat} of {len(ok)} runs the host CPU was at least {SATURATION_LIMIT:.0%} busy (up to "
                f"{host.max():.0%}): every process shares the same {cores:g} cores, so the throughput there "
                "is the machine's as much as the system's.",
            )
        )
    gsat = int((gen >= SATURATION_LIMIT).sum()) if not gen.empty else 0
    if gsat:
        notes.append(
            Note(
                False,
                f"In {gsat} runs the load generator's threads were saturated: the load, not the "
                "system, set the throughput.",
            )
        )
    remote = sorted(c[len("host_util_") :] for c in ok if c.startswith("host_util_"))
    for h in remote:
        # Hosts reached over SSH, sampled there.
        util, n = ok[f"host_util_{h}"], ok.get(f"cores_{h}", pd.Series(dtype=float)).max()
        theirs = ok.get(f"cpu_other_{h}_cores", pd.Series(dtype=float))
        if (util >= SATURATION_LIMIT).any() or (theirs > INTERFERENCE_LIMIT * n).any():
            notes.append(
                Note(
                    False,
                    f"On {h} ({n:g} cores) the CPU was up to {util.max():.0%} busy and other processes "
                    f"took up to {theirs.max():.2f} cores: its processes' results are that host's too.",
                )
            )
    if not notes:
        notes.append(
            Note(
                True,
                f"No run was disturbed by other processes (at most {other.max():.2f} cores), none saturated "
                f"the host (at most {host.max():.0%})"
                + "".join(f", {h} (at most {ok[f'host_util_{h}'].max():.0%})" for h in remote)
                + " or the load generator.",
            )
        )
    names = {
        "host_util": "host CPU busy",
        "cpu_other_cores": "other processes (cores)",
        **{f"host_util_{h}": f"{h} CPU busy" for h in remote},
        **{f"cpu_other_{h}_cores": f"others on {h} (cores)" for h in remote},
        "cl_load_thread_util": "load thread busy",
        "client_window_cv": "throughput CV over windows",
    }
    cols = [c for c in ("point", "rep", *names) if c in ok]
    return notes, ok[cols].rename(columns=names)


def environment(result: Path) -> dict[str, Any]:
    """The machine and versions, from the first summary.json with metadata."""
    for summary in sorted(result.glob("*/rep-*/mw0/summary.json")) + sorted(
        result.glob("*/rep-*/cl0/summary.json")
    ):
        meta = json.loads(summary.read_text()).get("metadata", {})
        return {k: meta.get(k) for k in ("host", "cpu_model", "cpu_count", "version", "git_revision")}
    return {}


def _ms(v: float) -> float:
    return v / 1e3


def readable_points(aggregate: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """The per-point table with units in the headers and errors as percentages."""
    if aggregate.empty:
        return aggregate
    a = aggregate
    out = pd.DataFrame({f: a[f] for f in factors if f in a})
    out["reps"] = a.get("reps")
    out["N"] = a.get("N")

    def put(name: str, col: str, f=lambda v: v) -> None:
        if col in a:
            out[name] = a[col].map(f)

    put("X clients (ops/s)", "client_tput")
    put("± (ops/s)", "client_tput_std")
    put("R clients (ms)", "client_rt_mean_us", _ms)
    put("R p99 (ms)", "client_rt_p99_us", _ms)
    put("X middleware (ops/s)", "mw_tput")
    put("R middleware (ms)", "mw_rt_mean_us", _ms)
    put("queue length", "mw_queue_len")
    put("queue time (ms)", "mw_queue_us", _ms)
    put("server time (ms)", "mw_server_us", _ms)
    put("workers busy", "mw_util", _pct_plain)
    put("host CPU busy", "host_util", _pct_plain)
    put("interactive law", "law_deviation", _pct)
    if "client_keys" in a and "client_misses" in a:
        out["miss rate"] = (a["client_misses"] / a["client_keys"].where(a["client_keys"] > 0)).map(_pct_plain)
    if "client_errors" in a:
        out["errors"] = a["client_errors"]
    return out


def _pct_plain(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


STAGES = (
    ("net thread", "mw_net"),
    ("queue", "mw_queue"),
    ("server", "mw_server"),
    ("service", "mw_service"),
    ("middleware response", "mw_rt"),
)


def stage_table(aggregate: pd.DataFrame) -> pd.DataFrame:
    """Per point and stage: mean, standard deviation, CV, p25 and p90 (seed 000, section 1.7)."""
    rows = []
    for _, r in aggregate.iterrows():
        for name, col in STAGES:
            mean = r.get(f"{col}_us" if col != "mw_rt" else "mw_rt_mean_us")
            if mean is None or (isinstance(mean, float) and math.isnan(mean)):
                continue
            sd = r.get(f"{col}_sd_us", float("nan"))
            rows.append(
                {
                    "point": r["point"],
                    "stage": name,
                    "mean (us)": mean,
                    "std (us)": sd,
                    "CV": sd / mean if mean else float("nan"),
                    "p25 (us)": r.get(f"{col}_p25_us", float("nan")),
                    "p90 (us)": r.get(f"{col}_p90_us", float("nan")),
                }
            )
        if "client_rt_sd_us" in r:
            mean, sd = r["client_rt_mean_us"], r["client_rt_sd_us"]
            rows.append(
                {
                    "point": r["point"],
                    "stage": "client response",
                    "mean (us)": mean,
                    "std (us)": sd,
                    "CV": sd / mean if mean else float("nan"),
                    "p25 (us)": r.get("client_rt_p25_us"),
                    "p90 (us)": r.get("client_rt_p90_us"),
                }
            )
    return pd.DataFrame(rows)


def _count(v) -> str:
    return "" if v is None or pd.isna(v) else f"{round(v):,}"


def link_table(aggregate: pd.DataFrame) -> pd.DataFrame:
    """Emulated hosts: per point and shaped link direction, the rate achieved
    against the configured one, bytes per request, and the shaping's drops and
    overlimits (from `tc -s`: packets that waited for tokens)."""
    rows = []
    cols = [c for c in aggregate.columns if c.startswith("link_") and c.endswith("_rate_mbit")]
    for _, r in aggregate.iterrows():
        for col in cols:
            key = col[: -len("_rate_mbit")]
            if pd.isna(r.get(col)):
                continue
            _, host, direction = key.split("_", 2)
            rows.append(
                {
                    "point": r["point"],
                    "link": f"{host} {'sends' if direction == 'up' else 'receives'}",
                    "rate (Mbit/s)": r[col],
                    "achieved (Mbit/s)": r.get(f"{key}_mbit"),
                    "utilisation": _pct_plain(r.get(f"{key}_util")),
                    "bytes/request": r.get(f"{key}_bytes_per_req"),
                    "drops": _count(r.get(f"{key}_drops")),
                    "overlimits": _count(r.get(f"{key}_overlimits")),
                }
            )
    return pd.DataFrame(rows)


def max_throughput_table(aggregate: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """Per configuration (the factors other than the client counts), the point
    of largest throughput, measured on the clients and on the middleware (seed 001)."""
    rows = []
    for label, _, best in best_points(aggregate, factors, "all"):
        row = {"configuration": label}
        row.update(
            {
                "N": best.get("N"),
                "X clients (ops/s)": best.get("client_tput"),
                "X middleware (ops/s)": best.get("mw_tput", float("nan")),
                "R clients (ms)": _ms(best.get("client_rt_mean_us", float("nan"))),
                "R middleware (ms)": _ms(best.get("mw_rt_mean_us", float("nan"))),
                "queue time (ms)": _ms(best.get("mw_queue_us", float("nan"))),
                "miss rate": _pct_plain(best["client_misses"] / best["client_keys"])
                if best.get("client_keys")
                else "",
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _pct(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:+.1f}%"


def _why_not(p, row: pd.Series) -> str:
    """A reason the model misses a point, from the point's own measurements."""
    reasons = []
    other = row.get("cpu_other_cores", 0.0)
    if isinstance(other, float) and other > 0.1 * max(row.get("cores", 1.0), 1.0):
        reasons.append(f"other processes took {other:.2f} cores")
    if row.get("cl_load_thread_util", 0.0) >= 0.9:
        reasons.append("the load generator's threads were saturated")
    link = any(d.in_network and d.name.startswith("link ") for d in p.devices)
    if link and p.n <= p.knee and p.r_error > 0:
        reasons.append(
            "below the knee a reply's packets cross the emulated link while the hosts' CPUs handle the ones "
            "before: processing and transmission overlap, which a network visited one center after the "
            "other counts twice"
        )
    devs = {d.name: d for d in p.devices}
    top = devs.get(p.bottleneck.split(" = ")[0])
    if (
        top is not None
        and p.x_error > HOLDS
        and not math.isnan(top.u_measured)
        and top.u_predicted - top.u_measured > 0.05
    ):
        reasons.append(
            f"the model runs the {top.name} at {top.u_predicted:.0%} of its capacity where the run reached "
            f"{top.u_measured:.0%}: it could not be driven as busy as a queueing center would be "
            "(with more threads than cores, a request's hand-offs between threads leave cores idle)"
        )
    hand = handoffs(p)
    waited = hand is not None and p.r_error < -HOLDS and hand.left_out_us > 0
    if hand is not None and waited:
        r_hand = p.r_model_us + hand.left_out_us
        reasons.append(
            f"outside the workers' hold a request spent {HANDOFFS_OUTSIDE * hand.outside_us:.0f} µs off the "
            f"CPU, {hand.outside_us:.0f} µs at each of its {HANDOFFS_OUTSIDE} hand-offs between threads "
            f"(client to net thread to worker, worker to client), where the network gives each "
            f"{hand.model_us:.0f} µs (the host CPU center's queue and the delay): a woken thread waits for a "
            "core at every hand-off, a wait that a center of CPU time holds in proportion to the request's "
            f"CPU, not to its hand-offs. Had those {HANDOFFS_OUTSIDE} waited as long as the "
            f"{HANDOFFS_IN_HOLD} inside the hold ({hand.inside_us:.0f} µs each, in the measured holding "
            f"time), R would be {r_hand / 1e3:.3f} ms ({(r_hand - p.r_measured_us) / p.r_measured_us:+.1%}): "
            f"{hand.left_out_us / (p.r_measured_us - p.r_model_us):.0%} of the miss"
        )
    # The general sentences, where no measured wait above says it.
    util = row.get("host_util", 0.0)
    if not waited and util >= 0.9:
        reasons.append(
            f"the host CPU was {100 * util:.0f}% busy: scheduling many threads on few cores costs more "
            "than an M/M/m center predicts"
        )
    elif not waited and p.knee < p.n:
        reasons.append(
            "between the knee and saturation, where waiting for the shared CPU (wake-ups, processor sharing "
            "among many threads) grows faster than in an M/M/m center"
        )
    if row.get("reps", 1) < 2:
        reasons.append("one repetition: run-to-run noise on this machine is of the same size")
    return "; ".join(reasons) or "no measured cause"


def models(
    result: Path, summary: pd.DataFrame, aggregate: pd.DataFrame, factors: list[str], settings: Settings
) -> Models:
    """Fits every model that applies and writes model.csv and utilization.csv."""
    out = Models()
    fit = fit_experiment(aggregate, factors, settings)
    if fit is not None and fit.points:
        out.fit = fit
        model_table(fit).to_csv(result / "model.csv", index=False)
        utilization_table(fit).to_csv(result / "utilization.csv", index=False)
        rows = {str(r["point"]): r for _, r in aggregate.iterrows()}
        out.points = pd.DataFrame(
            [
                {
                    "point": p.point,
                    "N": p.n,
                    "X measured (ops/s)": p.x_measured,
                    "X model (ops/s)": p.x_model,
                    "X error": _pct(p.x_error),
                    "R measured (ms)": p.r_measured_us / 1e3,
                    "R model (ms)": p.r_model_us / 1e3,
                    "R error": _pct(p.r_error),
                    "bottleneck": p.bottleneck,
                    "agrees with measured utilisation": {True: "yes", False: "NO", None: "?"}[
                        bottleneck_agrees(p)
                    ],
                }
                for p in fit.points
            ]
        )
        out.misses = [
            Miss(
                p.point,
                _pct(p.x_error),
                _pct(p.r_error),
                _why_not(p, rows.get(p.point, pd.Series(dtype=float))),
            )
            for p in fit.points
            if not p.holds
        ]
        laws = []
        for p in fit.points:
            t = law_table(p)
            t.insert(0, "point", p.point)
            laws.append(t)
        out.laws = pd.concat(laws, ignore_index=True)
        out.bounds = pd.DataFrame(
            [
                {
                    "point": p.point,
                    "N": p.n,
                    "D (us)": p.total_demand_us,
                    "Dmax (us)": p.max_demand_us,
                    "N*": p.knee,
                    "X bound (ops/s)": p.x_bound,
                    "R bound (ms)": p.r_bound_us / 1e3,
                    "X measured (ops/s)": p.x_measured,
                }
                for p in fit.points
            ]
        )
        by_sweep: dict[str, list] = {}
        for p in fit.points:
            by_sweep.setdefault(p.sweep, []).append(p)
        for i, (label, points) in enumerate(by_sweep.items()):
            if len({p.n for p in points}) < 2:
                continue
            draw = lambda ax, points=points, label=label: model_vs_measured(points, ax, label)  # noqa: E731
            out.figures.append(save_figure(result / "plots", f"model-{i}", draw)[0])
    out.worker_views = queue_views(aggregate, settings)
    out.pool_views = queue_views(aggregate, settings, center="pool")
    fact = factorial_fit(summary, factors, "client_tput")
    if fact is not None:
        out.factorial = pd.DataFrame(
            [
                {
                    "effect": n,
                    "factors": "·".join(fact.factors.get(ch, ch) for ch in n) if n != "q0" else "mean",
                    "value (ops/s)": q,
                    "variation": fact.variation.get(n, float("nan")),
                    "interval low": fact.ci[n][0] if fact.ci else float("nan"),
                    "interval high": fact.ci[n][1] if fact.ci else float("nan"),
                }
                for n, q in fact.effects.items()
            ]
        )
        out.factorial_title = (
            f"2^{len(fact.factors)} r factorial analysis of throughput "
            f"(r = {fact.replications}, {int(fact.confidence * 100)}% intervals)"
        )
        draw = lambda ax: variation_chart(fact.variation, fact.factors, ax)  # noqa: E731
        out.factorial_figure = save_figure(result / "plots", "variation", draw)[0]
    return out
