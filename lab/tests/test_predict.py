"""`mwlab predict` and the report's Predictions section: synthetic systems
with known demands (predictions exact within the solver's error), a real
calibrate-then-measure run, and refusals with a reason."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from mwlab.cli import main
from mwlab.heldout import predictions
from mwlab.models.laws import Center
from mwlab.models.mva import mva
from mwlab.nearest import predict
from mwlab.predict import PredictError, calibrate, parse_changes
from mwlab.spec import ExperimentInfo

US = 1e-6
HOST, HOLD, SERVER = (
    30.0,
    100.0,
    6.0,
)  # µs per request: host CPU (2 cores), workers' holding time, each server


def truth(n: int, workers: int, offset: float = 0.0, hold: float = HOLD) -> tuple[float, float]:
    """X (ops/s) and R (µs) of the synthetic system at population n."""
    res = mva(
        [Center("host CPU", HOST * US, "multi", 2), Center("workers", hold * US, "multi", workers)], 0.0, n
    )
    r = res.response_time[-1] / US + offset
    return n / (r * US), r


def row(n: int, workers: int, offset: float = 0.0, hold: float = HOLD, **extra) -> dict:
    x, r = truth(n, workers, offset, hold)
    return {
        "point": f"vcli={n},tmw={workers}",
        "vcli": n,
        "tmw": workers,
        "N": n,
        "Z_us": 0.0,
        "client_tput": x,
        "client_rt_mean_us": r,
        "client_rt_p50_us": 0.9 * r,
        "client_rt_p99_us": 3.0 * r,
        "cores": 2.0,
        "cpu_other_cores": 0.0,
        "cpu_lab_us": HOST,
        "cpu_host_us": HOST,
        "cpu_lab_cores": x * HOST * US,
        "cpu_host_cores": x * HOST * US,
        "mw_service_us": hold,
        "mw_util": x * hold * US / workers,
        "cpu_mc0_us": SERVER,
        "cpu_mc0_cores": x * SERVER * US,
        "cpu_mc1_us": SERVER,
        "cpu_mc1_cores": x * SERVER * US,
        **extra,
    }


def result_dir(tmp_path: Path, rows: list[dict], factors: dict, settings: dict | None = None) -> Path:
    settings = settings or {
        "topology": {"servers": 2, "middlewares": 1, "threads": 1},
        "middleware": {"workers": 4},
        "workload": {"ratio": "1:9"},
    }
    (tmp_path / "experiment.json").write_text(
        json.dumps({"name": "synthetic", "settings": settings, "factors": factors})
    )
    pd.DataFrame(rows).to_csv(tmp_path / "aggregate.csv", index=False)
    return tmp_path


def info_of(path: Path) -> ExperimentInfo:
    return ExperimentInfo.model_validate_json((path / "experiment.json").read_text())


NS = [1, 2, 4, 8, 16, 32, 64]
FACTORS = {"topology.virtual_clients": NS, "middleware.workers": [4]}


def test_held_out_populations_of_a_known_system_are_exact(tmp_path):
    # The part no device accounts for grows with ln N, as a network stack's does.
    offset = lambda n: 10 + 5 * math.log(n)  # noqa: E731
    res = result_dir(tmp_path, [row(n, 4, offset(n)) for n in NS], FACTORS)
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    preds = predict(agg, info, clients=[2, 8, 32], only_n={1, 4, 16, 64})
    assert [p.n for p in preds] == [2, 8, 32]
    for p in preds:
        x, r = truth(p.n, 4, offset(p.n))
        assert p.x == pytest.approx(x, rel=1e-6) and p.r_us == pytest.approx(r, rel=1e-6)
        assert p.p99_us == pytest.approx(3.0 * r, rel=1e-6)
    # Saturated at the workers (4 / 100 µs = 40,000/s < 2 / 30 µs).
    assert preds[-1].bottleneck == "workers"
    # The report's section: every held-out point within the goals.
    pr = predictions(res, agg, info)
    assert len(pr.heldout) == 3 and pr.within == 3 and pr.x_worst < 1e-6
    assert (res / "predictions.csv").is_file()
    assert "2 x workers" in " ".join(pr.whatif["what if"])


def test_a_calibration_too_noisy_for_an_interval_predicts_an_unbounded_one(tmp_path):
    """Repetitions that differ by orders of magnitude (a busy machine's
    runs): the prediction stands, its interval is 0 up to the run's own
    capacity bound (cores / the lightest host CPU demand measured, which
    holds whatever the noise), not a crash; R's is unbounded above."""
    rows = []
    for n in NS:
        r = row(n, 4, reps=2)
        r.update(client_tput_std=1e6 * r["client_tput"], client_rt_mean_us_std=1e6 * r["client_rt_mean_us"])
        rows.append(r)
    res = result_dir(tmp_path, rows, FACTORS)
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    (p,) = predict(agg, info, clients=[8], only_n={1, 4, 16, 64})
    assert p.x > 0 and p.x_lo == pytest.approx(0, abs=1e-300)
    assert p.x_hi == pytest.approx(2 / (HOST * US)) and "x" in p.clipped
    assert p.r_hi == math.inf
    assert predictions(res, agg, info).heldout is not None


def test_more_workers_follow_the_fitted_holding_time(tmp_path):
    # Holding time grows with the busy workers k = X S, as on a shared machine:
    # S = 50 + 10 k, solved here as the fixed point the measurement would show.
    def measured(n: int, workers: int) -> dict:
        s = 50.0
        for _ in range(200):
            x, _ = truth(n, workers, 0.0, s)
            s = 0.5 * s + 0.5 * (50 + 10 * x * s * US)
        return row(n, workers, 0.0, s)

    rows = [measured(n, 8) for n in NS]
    res = result_dir(tmp_path, rows, {"topology.virtual_clients": NS, "middleware.workers": [8]})
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    cal = calibrate([r for _, r in agg.iterrows()], info)
    k = (cal.holding[0][0] + cal.holding[-1][0]) / 2
    assert cal.holding_at(k) == pytest.approx(50 + 10 * k, rel=0.01)
    # Fewer workers: every busy level they reach was measured.
    for p in predict(agg, info, parse_changes(["tmw=2"]), clients=[4, 64]):
        want = measured(p.n, 2)
        assert p.x == pytest.approx(want["client_tput"], rel=0.02), p.n
        assert p.config == {"tmw": 2}
        assert any("follows the busy workers" in n for n in p.notes)
    # Beyond the busy levels measured, the holding time is held at the last one.
    assert cal.holding_at(100) == cal.holding[-1][1]


def test_a_setting_the_result_varied_is_interpolated(tmp_path):
    # Demands linear in the value size: 128 B and 1024 B measured, 512 B predicted.
    hold = lambda size: 80 + size / 32  # noqa: E731
    rows = [
        row(n, 4, 0.0, hold(size), value_size=size, point=f"vcli={n},value_size={size}")
        for size in (128, 1024)
        for n in (1, 8, 64)
    ]
    for r in rows:
        r.pop("tmw")
    res = result_dir(
        tmp_path, rows, {"topology.virtual_clients": [1, 8, 64], "workload.value_size": [128, 1024]}
    )
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    preds = predict(agg, info, parse_changes(["workload.value_size=512"]), clients=[8])
    assert len(preds) == 1
    x, r = truth(8, 4, 0.0, hold(512))
    assert preds[0].x == pytest.approx(x, rel=1e-6) and preds[0].r_us == pytest.approx(r, rel=1e-6)


def test_servers_and_replication_move_the_servers_demand(tmp_path):
    res = result_dir(tmp_path, [row(n, 4) for n in NS], FACTORS)
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    more = predict(agg, info, parse_changes(["nsvr=3"]), clients=[8])[0]
    servers = {d.name: d.demand_us for d in more.devices if d.name.startswith("server ")}
    assert servers == pytest.approx({f"server {i}": 2 * SERVER / 3 for i in range(3)})
    rep = predict(agg, info, parse_changes(["middleware.replication=2"]), clients=[8])[0]
    scale = (0.9 + 0.1 * 2) / 1.0  # 1:9 set:get
    assert {d.name: d.demand_us for d in rep.devices}["server 0"] == pytest.approx(SERVER * scale)
    assert any("replication 1 -> 2" in n for n in rep.notes)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (["workload.value_size=4096"], "measured value_size=128 only"),
        (["engine=async"], "change of kind"),
        (["middleware.threads=2"], "no event loops"),
        (["replication=3"], "at least as many servers"),
        (["vcli=8"], "--clients"),
        (["nosuch=1"], "unknown setting"),
        (["tmw"], "KEY=VALUE"),
        (["nmw=0"], "no middleware"),
        (["tmw=4", "middleware.workers=16"], "given twice"),
        (["nsvr=100000"], "at most 128 servers"),
    ],
)
def test_refusals_say_why(tmp_path, changes, reason):
    res = result_dir(tmp_path, [row(n, 4) for n in NS], FACTORS)
    with pytest.raises(PredictError, match=reason):
        predict(pd.read_csv(res / "aggregate.csv"), info_of(res), parse_changes(changes))


def test_the_command_line(tmp_path, capsys):
    res = result_dir(tmp_path, [row(n, 4) for n in NS], FACTORS)
    assert main(["predict", str(res), "--set", "tmw=8", "--clients", "16,128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["N"] for p in out] == [16, 128]
    for p in out:
        assert {"N", "x", "r_us", "bottleneck", "config", "p99_us", "notes"} <= set(p)
        assert p["config"] == {"tmw": 8} and p["x"] > 0
    assert any("outside the calibrated" in n for n in out[1]["notes"])
    assert main(["predict", str(res)]) == 0
    text = capsys.readouterr().out
    assert "bottleneck" in text and "tmw=4" in text
    assert main(["predict", str(res), "--set", "value_size=64", "--json"]) == 2
    assert "value_size" in json.loads(capsys.readouterr().out)["error"]
    assert main(["predict", str(res), "--clients", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
    # A population the exact solution would take minutes and gigabytes for.
    assert main(["predict", str(res), "--clients", "1000000000"]) == 2
    assert "at most 1,000" in capsys.readouterr().err
    assert main(["predict", str(res), "--clients", "8,8,8", "--json"]) == 0
    assert [p["N"] for p in json.loads(capsys.readouterr().out)] == [8]
    assert main(["predict", str(tmp_path / "nowhere")]) == 2
    assert "no such result directory" in capsys.readouterr().err


def test_mq_refuses_what_it_does_not_have(tmp_path):
    settings = {
        "topology": {"system": "mq", "middlewares": 1, "threads": 1},
        "middleware": {"workers": 4},
        "workload": {"ratio": "1:1"},
    }
    rows = [row(n, 4, mw_pool_us=0.0, mw_server_us=40.0) for n in NS]
    res = result_dir(tmp_path, rows, FACTORS, settings)
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    with pytest.raises(PredictError, match=r"no memcached servers|no replication"):
        predict(agg, info, parse_changes(["nsvr=2"]))
    # 8 workers on 4 connections: the wait for one was never observed.
    with pytest.raises(PredictError, match="never observed"):
        predict(agg, info, parse_changes(["tmw=8", "pool=4"]))
    assert predict(agg, info, parse_changes(["tmw=2"]), clients=[8])[0].config == {"tmw": 2}


def test_calibrate_then_measure_with_real_processes(tmp_path, capsys, monkeypatch):
    """A real experiment (memcached, mwproxy, mwload) at N = 1, 2 and 4 load
    threads: the report calibrates on 1 and 4 and predicts the measured 2,
    `mwlab predict` and `mwlab plan` work from the result, and `mwlab run
    --plan` runs the plan. How close the prediction comes is a measurement
    of the machine as much as of the model (three runs one after another
    on a shared machine: one measured 850, 18,600 and 6,100 requests/s at
    N = 1, 2, 4), so it is a figure of `bench/lab.py`, not a
    verdict here; the predictions' accuracy is tested on synthetic systems
    above."""
    from mwlab import plan as planning
    from mwlab.analysis import summarize
    from mwlab.render import write_report
    from mwlab.runner import prepare, run_experiment
    from mwlab.spec import parse

    spec = {
        "name": "predict-real",
        "topology": {"servers": 2, "middlewares": 1, "virtual_clients": 1},
        "middleware": {"workers": 2},
        "factors": {"tcli": [1, 2, 4]},
        "run": {
            "duration": 2,
            "warmup": 1,
            "cooldown": 0,
            "repetitions": 1,
            "window_ms": 500,
            "reference": False,
        },
    }
    exp = parse(spec)
    exp.source = spec
    out = run_experiment(exp, prepare(exp, tmp_path / "results"), progress=lambda *a: None)
    summary, aggregate = summarize(out)
    html = write_report(out, summary, aggregate).read_text()
    assert "held-out points</b>" in html
    held = pd.read_csv(out / "predictions.csv")
    assert list(held["N"]) == [2]
    r = held.iloc[0]
    x, x_measured = r["X predicted (ops/s)"], r["X measured (ops/s)"]
    assert x > 0 and r["R predicted (ms)"] > 0, r.to_dict()
    assert r["X error"] == pytest.approx((x - x_measured) / x_measured), "against the measured N = 2"
    assert r["bottleneck predicted"]
    assert r["covered"] in ("yes", "no") and ".." in r["X 90% interval"]
    # The noise floor (one run per point: batch means, a lower bound), and the predicted surface.
    noise = pd.read_csv(out / "noise.csv")
    assert noise.iloc[0]["df"] == 0 and noise.iloc[0]["x_cv"] > 0
    assert "Noise floor</h3>" in html and "of their 90% intervals" in html
    assert (out / "plots" / "predicted-surface.png").exists() and 'alt="predicted surface"' in html
    assert main(["predict", str(out), "--clients", "8", "--set", "tmw=4", "--json"]) == 0
    (p,) = json.loads(capsys.readouterr().out)
    assert p["N"] == 8 and p["x"] > 0 and p["config"] == {"tmw": 4}
    # (At saturation a bound may end X's interval at the prediction itself,
    # and start R's there.)
    assert p["x_lo"] < p["x"] <= p["x_hi"] and p["r_lo"] <= p["r_us"] < p["r_hi"]
    assert p["uncertainty"]["x"]["rules"] > 0, "a rule carried it to tmw=4"
    # And the plan: from this result, the populations and repetitions for a
    # target — two repetitions at most here: how many the target would take
    # depends on the noise of this machine at this moment (up to 30 runs),
    # and choosing them is tested on synthetic systems (test_plan.py).
    monkeypatch.setattr(planning, "MAX_REPS", 2)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(json.dumps(spec))
    assert main(["plan", str(spec_file), "--from", str(out), "--target", "90%", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    (c,) = plan["configurations"]
    assert c["repetitions"] >= 2 and set(c["N"]) <= {1, 2, 4} and c["runs"] == len(c["N"]) * c["repetitions"]
    # `mwlab run --plan` runs exactly that plan (shorter runs: the plan comes
    # from the result, whatever the durations) and its report draws the
    # spec's populations it did not measure, predicted, beside those it did.
    short = {**spec, "run": {**spec["run"], "duration": 1, "warmup": 0.2}}
    spec_file.write_text(json.dumps(short))
    planned = tmp_path / "planned"
    args = ["run", str(spec_file), "--plan", "--from", str(out), "--target", "90%", "--results", str(planned)]
    assert main(args) == 0
    assert "plan for predict-real" in capsys.readouterr().out
    (result,) = (planned / "predict-real-plan").iterdir()
    assert len(list(result.glob("*/rep-*/run.json"))) == c["runs"]
    info = json.loads((result / "experiment.json").read_text())
    assert info["factors"]["topology.threads"] == [1, 2, 4] and len(info["points"]) == len(c["N"])
    surface = pd.read_csv(result / "plots" / "predicted-surface.csv").fillna({"in spec": ""})
    assert set(surface[surface["in spec"] == "measured"]["N"]) == set(c["N"])
    assert set(surface[surface["in spec"] == "predicted"]["N"]) == {1, 2, 4} - set(c["N"])
    assert main(["run", str(spec_file), "--from", str(out)]) == 2
    assert "give --plan" in capsys.readouterr().err


def test_a_holding_time_that_never_settles_says_so():
    """The workers' holding time is a fixed point of the busy workers; one
    that runs away (each step wants twice the last) stops after 100 steps
    with a note instead of looping or passing silently."""
    from mwlab.fit import Device
    from mwlab.predict import _settle

    pool, notes = Device("workers", 50.0, 8), []
    x, r = _settle(pool, lambda k: 2 * pool.demand_us, lambda: (1e4, 100.0), (1e4, 90.0), notes)
    assert (x, r) == (1e4, 100.0) and len(notes) == 1 and "did not settle in 100 steps" in notes[0]
    settled: list[str] = []
    pool = Device("workers", 50.0, 8)
    _settle(pool, lambda k: 60.0, lambda: (1e4, 100.0), (1e4, 90.0), settled)
    assert settled == [] and pool.demand_us == pytest.approx(60.0, rel=0.002)


def test_cores_others_took_at_one_point_are_said_in_the_prediction(tmp_path):
    """Another process took 0.8 of the 2 cores while N = 16 was measured:
    the host CPU keeps 1.2 there and the predictions around it say why they
    move; a run that kept its cores says nothing of it."""
    ns = [4, 16, 64]
    (tmp_path / "quiet").mkdir()
    (tmp_path / "busy").mkdir()
    quiet = [row(n, 4) for n in ns]
    res = result_dir(tmp_path / "quiet", quiet, {"topology.virtual_clients": ns, "middleware.workers": [4]})
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    assert not any("took part of" in note for p in predict(agg, info, clients=[8, 32]) for note in p.notes)
    busy = [row(n, 4, cpu_other_cores=0.8 if n == 16 else 0.0) for n in ns]
    res = result_dir(tmp_path / "busy", busy, {"topology.virtual_clients": ns, "middleware.workers": [4]})
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    for p in predict(agg, info, clients=[8, 32]):
        (note,) = [note for note in p.notes if "took part of" in note]
        assert "1.20 at N = 16" in note and "2.00 at N = 4" in note


def test_damaged_results_are_refused_with_the_file_named_and_json_stays_json(tmp_path, capsys):
    """A garbled or empty aggregate.csv, a reference.csv with a word for a
    number or without its columns: a message naming the file and what to do,
    never a traceback; `--json` prints strict JSON (no NaN) whatever it says."""
    res = result_dir(tmp_path, [row(n, 4) for n in NS], FACTORS)
    assert main(["predict", str(res), "--json", "--clients", "8"]) == 0
    text = capsys.readouterr().out
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)  # strict: the noise of this result was not measured, its intervals are null
    (res / "aggregate.csv").write_text('point,N\n"1,2\n')
    assert main(["predict", str(res), "--json"]) == 2
    out = capsys.readouterr()
    assert "aggregate.csv is damaged" in json.loads(out.out)["error"] and "mwlab analyze" in out.err
    (res / "aggregate.csv").write_text("")
    assert main(["predict", str(res)]) == 2
    assert "aggregate.csv is damaged" in capsys.readouterr().err
    pd.DataFrame([row(n, 4) for n in NS]).to_csv(res / "aggregate.csv", index=False)
    other = tmp_path / "other"
    other.mkdir()
    result_dir(other, [row(n, 4) for n in NS], FACTORS)
    for d in (res, other):
        (d / "reference.csv").write_text(
            "phase,started_unix,x,x_se,r_us,r_se_us,windows,point\nstart,1,abc,1,100,1,8,p\n"
        )
    assert main(["predict", str(res), "--against", str(other)]) == 2
    assert "reference.csv is damaged: line 2" in capsys.readouterr().err
    (res / "reference.csv").write_text(
        "phase,started_unix,x,x_se,r_us,r_se_us,windows,point\nstart,1,50000,1,100,1,8,p\n"
    )
    (other / "reference.csv").write_text("fase,x\nstart,1\n")
    assert main(["compare", str(res), str(other)]) == 2
    assert "has no column 'phase'" in capsys.readouterr().err


def test_a_point_with_infinite_throughput_calibrates_nothing_and_is_named(tmp_path, capsys):
    rows = [row(n, 4) for n in NS]
    rows[2] = {**rows[2], "client_tput": math.inf, "point": "broken"}
    res = result_dir(tmp_path, rows, FACTORS)
    assert main(["predict", str(res), "--clients", "8"]) == 0
    captured = capsys.readouterr()
    assert "inf" not in captured.out and "left out: broken: no usable throughput" in captured.err
