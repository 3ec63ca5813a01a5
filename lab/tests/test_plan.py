"""`mwlab plan`: the pilot when nothing was measured, the fewest runs that
meet the target when a result says how noisy the machine is and how the
demands change, and a plan written as a spec that `mwlab run` accepts."""

from __future__ import annotations

import random

import pytest
import yaml
from test_predict_intervals import System

from mwlab.cli import main
from mwlab.plan import _virtual, describe, pilot, plan_configuration, plan_spec
from mwlab.predict import predict_one
from mwlab.procs import REPO
from mwlab.spec import load, parse


def test_without_a_result_the_plan_is_the_pilot(capsys, tmp_path):
    out = tmp_path / "plan.yaml"
    assert main(["plan", "quickstart", "--target", "10%", "--write", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pilot" in text and "3 repetitions" in text, text
    planned = load(out)
    assert planned.settings.run.repetitions == 3
    p = pilot("x", {1: 2, 2: 4, 4: 8, 8: 16, 16: 32})
    assert p.ns == [2, 8, 32] and p.runs == 9


def test_the_fewest_runs_that_meet_the_target():
    rng = random.Random(11)
    system = System(rng, 0.04)
    prior = system.calibration(reps=3)
    n_of = {v: 2 * v for v in (1, 2, 4, 8, 16, 32, 64)}
    loose = plan_configuration(prior, n_of, 0.20)
    tight = plan_configuration(prior, n_of, 0.08)
    assert loose.worst <= 0.20 and tight.worst <= 0.08, (loose, tight)
    assert loose.runs <= tight.runs
    assert {2, 128} <= set(loose.ns), "the ends of the range are always measured"
    assert all(w <= 0.08 for w in tight.widths.values())
    # Too tight to reach: the plan measures everything and says how close it gets.
    impossible = plan_configuration(prior, n_of, 0.001)
    assert impossible.worst > 0.001 and len(impossible.ns) == len(n_of)


def test_a_plan_is_a_spec(tmp_path):
    exp = load(REPO / "experiments" / "quickstart.yaml")
    plans = [pilot("tmw=2", {1: 2, 4: 8, 12: 24}), pilot("tmw=8", {1: 2, 4: 8, 12: 24})]
    plans[0].levels, plans[0].reps = [1, 12], 4
    doc = plan_spec(exp, plans)
    again = parse(yaml.safe_load(yaml.safe_dump(doc)))
    # The factors stay (the range the report predicts); each configuration
    # runs its own populations with its own repetitions.
    assert again.factors == exp.factors
    vcli, tmw = "topology.virtual_clients", "middleware.workers"
    runs = sorted((r.point.factors[tmw], r.point.factors[vcli], r.rep) for r in again.runs())
    wanted = [(2, v, r) for v in (1, 12) for r in range(1, 5)]
    wanted += [(8, v, r) for v in (1, 4, 12) for r in range(1, 4)]
    assert runs == sorted(wanted)


def test_a_spec_without_a_population_factor_is_refused(capsys, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nfactors: {tmw: [2, 4]}\n")
    assert main(["plan", str(spec)]) == 2
    assert "client factor" in capsys.readouterr().err


def test_the_plan_says_which_figure_its_widest_interval_is(capsys):
    """The target bounds throughput X and response time R alike; the plan
    names the figure whose interval is the widest, and where, and so do the
    help and the first line."""
    rng = random.Random(5)
    prior = System(rng, 0.04).calibration(reps=3)
    n_of = {v: 2 * v for v in (1, 2, 4, 8, 16, 32, 64)}
    plan = plan_configuration(prior, n_of, 0.10)
    p = predict_one(_virtual(prior, plan.ns, plan.reps), plan.worst_n)
    x, r = (p.x_hi - p.x_lo) / 2 / p.x, (p.r_hi - p.r_lo) / 2 / p.r_us
    assert plan.worst == max(plan.widths.values()) == max(x, r)
    assert plan.worst_figure == ("X" if x >= r else "R")
    plan.label = "tmw=8"
    exp = load(REPO / "experiments" / "quickstart.yaml")
    lines = describe(exp, [plan], 0.10)
    assert "throughput X and mean response time R within ±10%" in lines[0], lines
    figure = "throughput X" if plan.worst_figure == "X" else "response time R"
    assert f"widest predicted ±{plan.worst:.1%} ({figure} at N = {plan.worst_n})" in lines[1], lines
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "response time R" in " ".join(capsys.readouterr().out.split())
