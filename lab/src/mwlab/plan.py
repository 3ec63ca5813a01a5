"""`mwlab plan SPEC --target 10%`: which populations to measure, and how
many repetitions, so that predictions over the spec's whole range of clients
have 90% intervals no wider than the target — the fewest runs first. The
target bounds both figures a prediction gives, throughput X and mean
response time R (the half-width relative to the prediction); the plan says
which of the two is the widest and where.

The width of a prediction's interval (`mwlab.predict.uncertainty`) depends on
what is not known before measuring: the noise floor of the machine and how
much the demands change between populations. So a plan starts from a result:

- **with `--from RESULT`** (a run of the same system, typically the pilot):
  each configuration's demand curves and noise floor stand in for the truth.
  For every number of repetitions r from 2 up, populations are added greedily
  — the lowest and the highest of the spec's range first, then always the
  one that narrows the widest interval most — until every population of the
  spec is predicted within the target (or every one is measured); the plan
  with the fewest runs (populations x r) wins, fewer repetitions on a tie;
- **without one**: the pilot — each configuration at its lowest, middle and
  highest population with 3 repetitions, the least that measures a noise
  floor (two repetitions or more) and a demand curve with a leave-one-out
  error (three populations) — to run first and plan from.

A configuration that the result did not measure is planned as the pilot. The
plan is written as a spec (`--write FILE`: the spec with a `points:` list,
each configuration's chosen populations with its repetitions), which
`mwlab run FILE` runs — or `mwlab run SPEC --plan` plans and runs in one
step; the report predicts the spec's other populations, drawn with their
intervals beside the points measured.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mwlab.curves import Curve
from mwlab.noise import Noise
from mwlab.predict import Calibration, PredictError, calibrations, predict_one
from mwlab.procs import LabError
from mwlab.spec import Experiment, SpecError, column_name, load, parse, run_seconds

# Client factors (their canonical keys): the population a plan chooses.
POPULATION_KEYS = (
    "topology.virtual_clients",
    "topology.threads",
    "topology.instances",
    "topology.client_machines",
)
MAX_REPS = 10
PILOT_REPS = 3
FIGURES = {"X": "throughput X", "R": "response time R"}


@dataclass
class ConfigPlan:
    """What to measure of one configuration."""

    label: str
    levels: list[Any]
    ns: list[int]
    reps: int
    # The widest predicted 90% half-width over the spec's populations
    # (relative), of X or R, whichever is wider.
    worst: float = float("nan")
    basis: str = ""
    widths: dict[int, float] = field(default_factory=dict)
    # Which figure the widest is ("X" throughput, "R" response time) and at which N.
    worst_figure: str = ""
    worst_n: int | None = None

    @property
    def runs(self) -> int:
        return len(self.levels) * self.reps


def population_factor(exp: Experiment) -> str:
    """The one client factor the spec varies (its canonical key)."""
    varied = [k for k in exp.factors if k in POPULATION_KEYS and len(exp.factors[k]) > 1]
    if len(varied) != 1:
        found = ", ".join(column_name(k) for k in varied) or "none"
        raise PredictError(
            f"a plan chooses the populations of one client factor (vcli, tcli, icli or ncli); "
            f"this spec varies {found}"
        )
    return varied[0]


def _configurations(exp: Experiment, key: str) -> dict[str, dict[str, Any]]:
    """The spec's configurations (levels of its other factors, by column
    name) and, per configuration, N for each level of the population factor."""
    out: dict[str, dict[str, Any]] = {}
    for p in exp.all_points():
        levels = {column_name(k): v for k, v in p.factors.items() if k != key}
        label = ",".join(f"{k}={v}" for k, v in levels.items())
        c = out.setdefault(label, {"levels": levels, "n_of": {}})
        c["n_of"][p.factors[key]] = p.total_clients
    return out


def _virtual(prior: Calibration, ns: list[int], reps: int) -> Calibration:
    """The calibration a plan would give if the prior's curves were the truth."""
    # (The prior's leave-one-out error stays known where the plan has too
    # few populations to measure its own: fewer knots must not look surer.)
    at = lambda c: Curve([(n, c.at(n)) for n in ns], floor=c.error)  # noqa: E731
    nz = prior.noise
    return Calibration(
        sweep=prior.sweep,
        levels=prior.levels,
        settings=prior.settings,
        ns=sorted(ns),
        think_us=prior.think_us,
        curves={k: at(c) for k, c in prior.curves.items()},
        servers=prior.servers,
        in_network=prior.in_network,
        offset=at(prior.offset),
        tails=prior.tails,
        holding=prior.holding,
        noise=Noise(nz.x_cv, nz.r_cv, float(reps), nz.df, nz.method),
    )


def _half_widths(p) -> dict[str, float]:
    """A prediction's relative 90% half-widths: throughput X, response time R."""
    return {"X": (p.x_hi - p.x_lo) / 2 / p.x, "R": (p.r_hi - p.r_lo) / 2 / p.r_us}


def _widths(prior: Calibration, ns: list[int], reps: int, targets: list[int]) -> dict[int, float]:
    cal = _virtual(prior, ns, reps)
    return {n: max(_half_widths(predict_one(cal, n)).values()) for n in targets}


def _widest_figure(prior: Calibration, plan: ConfigPlan) -> tuple[str, int]:
    """Which figure ("X" or "R") is the plan's widest interval, and at which N."""
    n = max(plan.widths, key=lambda k: (plan.widths[k], -k))
    w = _half_widths(predict_one(_virtual(prior, plan.ns, plan.reps), n))
    return max(w, key=lambda k: w[k]), n


def plan_configuration(prior: Calibration, n_of: dict[Any, int], target: float) -> ConfigPlan:
    """The fewest runs that predict every population of `n_of` within `target`."""
    level_of = {n: lvl for lvl, n in n_of.items()}
    targets = sorted(level_of)
    best: ConfigPlan | None = None
    for reps in range(2, MAX_REPS + 1):
        chosen = sorted({targets[0], targets[-1]})
        widths = _widths(prior, chosen, reps, targets)
        while max(widths.values()) > target and len(chosen) < len(targets):
            options = []
            for n in targets:
                if n in chosen:
                    continue
                w = _widths(prior, sorted([*chosen, n]), reps, targets)
                options.append((max(w.values()), n, w))
            _, n, widths = min(options, key=lambda o: (o[0], o[1]))
            chosen = sorted([*chosen, n])
        plan = ConfigPlan(
            prior.sweep,
            [level_of[n] for n in chosen],
            chosen,
            reps,
            max(widths.values()),
            f"curves and noise of {prior.sweep or 'the measured configuration'}",
            widths,
        )
        met = plan.worst <= target
        if best is None:
            best = plan
        elif met:
            if best.worst > target or plan.runs < best.runs:
                best = plan
        elif best.worst > target and plan.worst < best.worst:
            # Out of reach so far: the plan that comes closest.
            best = plan
        if met and len(chosen) == 2:
            break
    assert best is not None
    best.worst_figure, best.worst_n = _widest_figure(prior, best)
    return best


def pilot(label: str, n_of: dict[Any, int]) -> ConfigPlan:
    """Lowest, middle and highest population, PILOT_REPS repetitions."""
    ordered = sorted(n_of, key=lambda lvl: n_of[lvl])
    picks = sorted({0, len(ordered) // 2, len(ordered) - 1})
    levels = [ordered[i] for i in picks]
    return ConfigPlan(
        label, levels, [n_of[lvl] for lvl in levels], PILOT_REPS, basis="pilot (nothing measured yet)"
    )


def make_plan(exp: Experiment, target: float, prior_agg=None, prior_info=None) -> list[ConfigPlan]:
    """A plan per configuration of the spec."""
    if not 0 < target < 1:
        raise PredictError(f"--target {target:.0%}: give a width between 0 and 100%, e.g. 10%")
    key = population_factor(exp)
    configs = _configurations(exp, key)
    cals: dict[str, Calibration] = {}
    if prior_agg is not None:
        for cal in calibrations(prior_agg, prior_info):
            cals[",".join(f"{k}={v}" for k, v in sorted(cal.levels.items()))] = cal
    out = []
    for label, c in configs.items():
        match = ",".join(f"{k}={v}" for k, v in sorted(c["levels"].items()))
        prior = cals.get(match)
        if prior is None or len(prior.ns) < 2 or math.isnan(prior.noise.x_cv):
            out.append(pilot(label, c["n_of"]))
            continue
        p = plan_configuration(prior, c["n_of"], target)
        p.label = label
        out.append(p)
    return out


def plan_spec(exp: Experiment, plans: list[ConfigPlan]) -> dict[str, Any]:
    """The plan as a spec: the factors as they were (the range predictions
    cover), `points:` naming each configuration's chosen populations with its
    repetitions."""
    doc = copy.deepcopy(exp.source) if exp.source else {"name": exp.name}
    key = population_factor(exp)
    doc.pop("scales", None)
    doc.pop("points", None)
    doc["name"] = f"{exp.name}-plan"
    doc["factors"] = {column_name(k): v for k, v in exp.factors.items()}
    run = exp.settings.run.model_dump(mode="json")
    run["repetitions"] = max(p.reps for p in plans)
    doc["run"] = {k: run[k] for k in ("duration", "warmup", "cooldown", "repetitions") if k in run}
    configs = _configurations(exp, key)
    picks = []
    for p in plans:
        levels = configs[p.label]["levels"]
        for lvl in p.levels:
            picks.append({**levels, column_name(key): lvl, "repetitions": p.reps})
    doc["points"] = picks
    everything = ", ".join(map(str, exp.factors[key]))
    rest = (
        "; the report predicts the others with their intervals" if len(picks) < len(exp.all_points()) else ""
    )
    doc["description"] = (
        f"{exp.description.strip()} Planned by mwlab plan: {len(picks)} of the {len(exp.all_points())} "
        f"points ({column_name(key)} of {everything}){rest}."
    ).strip()
    return doc


def describe(exp: Experiment, plans: list[ConfigPlan], target: float) -> list[str]:
    """The plan as lines to print: per configuration its populations,
    repetitions and widest predicted interval; the runs and the time."""
    head = (
        f"plan for {exp.name} (scale {exp.scale}): 90% intervals of throughput X and mean response "
        f"time R within ±{target:.0%}"
    )
    out = [f"{head} over every population"]
    for p in plans:
        worst = "unknown until the pilot ran" if math.isnan(p.worst) else f"±{p.worst:.1%}"
        if p.worst_figure:
            worst += f" ({FIGURES[p.worst_figure]} at N = {p.worst_n})"
        reached = math.isnan(p.worst) or p.worst <= target
        met = (
            ""
            if reached
            else f"  (the target is not reached even with every population and {MAX_REPS} repetitions: "
            "this is the closest)"
        )
        out.append(
            f"  {p.label or '(one configuration)'}: N = {', '.join(map(str, p.ns))} "
            f"x {p.reps} repetitions = {p.runs} runs; widest predicted {worst}{met}  [{p.basis}]"
        )
    runs = sum(p.runs for p in plans)
    full = len(exp.all_points()) * max(exp.settings.run.repetitions, 1)
    minutes = runs * run_seconds(exp.settings) / 60
    out.append(f"{runs} runs, about {minutes:.0f} min (the spec as written: {full} runs)")
    return out


def _prior(prior: str | None) -> tuple[Any, Any]:
    """(aggregate, experiment info) of the result a plan starts from, or (None, None)."""
    from mwlab.analysis import read_experiment
    from mwlab.predict_cli import aggregate_of

    if not prior:
        return None, None
    result = Path(prior)
    if not result.is_dir():
        raise LabError(f"{result}: no such result directory")
    return aggregate_of(result), read_experiment(result)


def planned(exp: Experiment, target_text: str, prior: str | None) -> tuple[Experiment, list[str]]:
    """`mwlab run SPEC --plan`: the spec's plan (from `prior`, a result, or
    the pilot) as the experiment to run, and the plan's description."""
    target = _target(target_text)
    plans = make_plan(exp, target, *_prior(prior))
    doc = plan_spec(exp, plans)
    out = parse(doc, exp.scale, f"the plan of {exp.name}")
    out.source = doc
    return out, describe(exp, plans, target)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="the fewest runs whose predictions meet a target interval width")
    p.add_argument("spec", help="a spec file or the name of one in experiments/")
    p.add_argument(
        "--target",
        default="10%",
        help="widest 90%% half-width allowed, of throughput X and of mean response time R alike "
        "(relative to the prediction), e.g. 10%% (default)",
    )
    p.add_argument("--from", dest="prior", metavar="RESULT", help="a result of the same system to plan from")
    p.add_argument("--scale", default="quick", help="the spec's scale (quick or full)")
    p.add_argument("--write", metavar="FILE", help="write the plan as a spec that mwlab run runs")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def _target(text: str) -> float:
    try:
        v = float(text.strip().rstrip("%"))
    except ValueError:
        raise PredictError(f"--target {text!r}: expected a percentage such as 10%") from None
    return v / 100 if text.strip().endswith("%") or v >= 1 else v


def main(args: argparse.Namespace, spec_path) -> int:
    try:
        exp = load(spec_path(args.spec), args.scale)
        target = _target(args.target)
        plans = make_plan(exp, target, *_prior(args.prior))
    except (PredictError, SpecError, LabError, OSError) as e:
        print(f"mwlab plan: {e}", file=sys.stderr)
        return 2
    seconds = run_seconds(exp.settings)
    runs = sum(p.runs for p in plans)
    if args.json:
        print(
            json.dumps(
                {
                    "target": target,
                    "configurations": [
                        {
                            "configuration": p.label,
                            "levels": p.levels,
                            "N": p.ns,
                            "repetitions": p.reps,
                            "runs": p.runs,
                            "widest": None if math.isnan(p.worst) else p.worst,
                            "widest_figure": p.worst_figure or None,
                            "widest_at_N": p.worst_n,
                            "basis": p.basis,
                        }
                        for p in plans
                    ],
                    "runs": runs,
                    "seconds": runs * seconds,
                },
                default=str,
            )
        )
    else:
        print("\n".join(describe(exp, plans, target)))
    if args.write:
        doc = plan_spec(exp, plans)
        Path(args.write).write_text(yaml.safe_dump(doc, sort_keys=False))
        written = len(parse(doc).runs())
        print(f"wrote {args.write} ({written} runs): mwlab run {args.write}", file=sys.stderr)
    return 0
