"""Predictions start from the nearest measured configuration (or the two
around it), and every measured point is checked by leaving it out: synthetic
systems with known demands (the holding time grows with the busy workers, as
on a shared machine), no processes."""

from __future__ import annotations

import pandas as pd
import pytest
from test_predict import US, info_of, result_dir, row, truth

from mwlab.heldout import predictions
from mwlab.leaveout import leave_one_out
from mwlab.models.laws import Center
from mwlab.models.mva import mva
from mwlab.nearest import predict
from mwlab.predict import parse_changes

NS = [1, 2, 4, 8, 16, 32, 64]


def measured(n: int, workers: int) -> dict:
    """A point whose holding time is 50 + 10 k µs with k busy workers,
    solved as the fixed point a measurement shows, repeated twice with a
    spread of 1%."""
    s = 50.0
    for _ in range(200):
        x, _ = truth(n, workers, 0.0, s)
        s = 0.5 * s + 0.5 * (50 + 10 * x * s * US)
    x, r = truth(n, workers, 0.0, s)
    return row(n, workers, 0.0, s, reps=2, client_tput_std=0.01 * x, client_rt_mean_us_std=0.01 * r)


def two_pools(tmp_path, workers=(2, 8), ns=NS):
    rows = [measured(n, w) for w in workers for n in ns]
    factors = {"topology.virtual_clients": ns, "middleware.workers": list(workers)}
    res = result_dir(tmp_path, rows, factors)
    return pd.read_csv(res / "aggregate.csv"), info_of(res), res


def test_more_workers_than_measured_start_from_the_nearest_pool(tmp_path):
    """tmw=2 and tmw=8 measured: tmw=16 is carried from tmw=8 (one doubling),
    not from tmw=2 (three), says so, and is at least what tmw=8 measured."""
    agg, info, _ = two_pools(tmp_path)
    (p,) = predict(agg, info, parse_changes(["tmw=16"]), clients=[32])
    assert p.basis == "tmw=8"
    assert "nearest measured configuration" in p.notes[0] and "past the largest" in p.notes[0]
    eight = measured(32, 8)["client_tput"]
    assert p.x_hi >= eight and p.x >= 0.98 * eight
    # One doubling by rule: 10%; three doublings would be 30%.
    assert p.uncertainty["x"]["rules"] == pytest.approx(0.10)


def test_a_pool_between_two_measured_ones_is_interpolated_from_both(tmp_path):
    agg, info, _ = two_pools(tmp_path)
    (p,) = predict(agg, info, parse_changes(["tmw=4"]), clients=[16])
    assert p.basis == "tmw=2 and tmw=8"
    assert "between tmw=2 and tmw=8" in p.notes[0] and "weights 0.50 and 0.50" in p.notes[0]
    want = measured(16, 4)["client_tput"]
    assert p.x_lo <= want <= p.x_hi
    assert "between" in p.uncertainty["x"]


def test_no_interval_passes_the_capacity_the_run_measured(tmp_path):
    """Past the largest population measured, and with more workers than
    measured: no interval's top passes the capacity of the lightest demands
    measured (at most 2 cores / 30 µs of host CPU, less a point's noise)."""
    agg, info, _ = two_pools(tmp_path)
    preds = predict(agg, info, clients=[64, 128, 256]) + predict(
        agg, info, parse_changes(["tmw=32"]), clients=[64, 256]
    )
    for p in preds:
        # 2 workers: their 2 / lightest holding time; more: the host CPU.
        assert p.bounds.x_max_by == ("workers" if p.config == {"tmw": 2} else "host CPU")
        assert p.bounds.x_top <= 1.03 * 2 / 30e-6
        assert p.x_hi <= p.bounds.x_top * (1 + 1e-9)
        assert p.r_lo >= p.bounds.r_floor * (1 - 1e-9)


def test_every_point_is_left_out_in_turn_and_covered(tmp_path):
    agg, info, res = two_pools(tmp_path, workers=(2, 8), ns=[2, 4, 8, 16, 32])
    loo = leave_one_out(agg, info)
    assert len(loo.table) == 10 and not loo.refused
    assert set(loo.table["N"]) == {2, 4, 8, 16, 32}
    # A known system with 1% noise: carried past the ends (the busy workers'
    # line) the predictions hold; between the populations the holding time
    # is a straight line in ln N while the system's bends at its knee, and
    # the 90% intervals there may miss, by less than 10%.
    assert loo.covered >= 8
    misses = loo.table[loo.table["covered"] == "no"]
    assert (misses["X error"].abs() < 0.10).all() and (misses["R error"].abs() < 0.10).all()
    assert set(misses["N"]) <= {4, 8, 16}
    pr = predictions(res, agg, info)
    assert pr.loo.covered == loo.covered
    assert (res / "leave-one-out.csv").is_file()


def test_a_configuration_measured_once_is_left_out_from_its_neighbour(tmp_path):
    rows = [measured(n, 8) for n in (2, 8, 32)] + [measured(8, 4)]
    res = result_dir(tmp_path, rows, {"topology.virtual_clients": [2, 8, 32], "middleware.workers": [4, 8]})
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    t = leave_one_out(agg, info).table
    alone = t[t["configuration"] == "tmw=4"].iloc[0]
    assert alone["calibrated on"] == "tmw=8" and alone["covered"] == "yes"


def test_a_point_without_throughput_or_response_time_is_left_out_with_the_reason(tmp_path):
    """A run that completed no request (X 0, R missing) and one whose mean
    response time is 0: neither calibrates or is predicted, and the
    leave-one-out table says why instead of crashing."""
    rows = [measured(n, 8) for n in (2, 8, 32)]
    rows.append({**measured(4, 8), "client_tput": 0.0, "client_rt_mean_us": float("nan"), "point": "dead"})
    rows.append({**measured(16, 8), "client_rt_mean_us": 0.0, "point": "zero"})
    res = result_dir(
        tmp_path, rows, {"topology.virtual_clients": [2, 4, 8, 16, 32], "middleware.workers": [8]}
    )
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    loo = leave_one_out(agg, info)
    assert sorted(loo.table["N"]) == [2, 8, 32]
    assert any(r.startswith("dead:") for r in loo.refused) and any(r.startswith("zero:") for r in loo.refused)
    assert predictions(res, agg, info).loo.covered == loo.covered
    assert {p.n for p in predict(agg, info)} == {2, 8, 32}


def batched(n: int, workers: int, host: float) -> dict:
    """A point whose host CPU needs `host` µs per request (the work batches
    as load grows, so heavier populations need less), its pool holding 20
    µs, solved exactly, repeated twice with a spread of 1%."""
    res = mva(
        [Center("host CPU", host * US, "multi", 2), Center("workers", 20 * US, "multi", workers)], 0.0, n
    )
    r = res.response_time[-1] / US
    x = n / (r * US)
    return row(
        n,
        workers,
        0.0,
        20.0,
        reps=2,
        client_tput=x,
        client_rt_mean_us=r,
        client_rt_p50_us=0.9 * r,
        client_rt_p99_us=3.0 * r,
        cpu_lab_us=host,
        cpu_host_us=host,
        cpu_lab_cores=x * host * US,
        cpu_host_cores=x * host * US,
        mw_util=x * 20 * US / workers,
        cpu_mc0_cores=x * 6 * US,
        cpu_mc1_cores=x * 6 * US,
        client_tput_std=0.01 * x,
        client_rt_mean_us_std=0.01 * r,
    )


def test_the_host_cpus_bound_is_the_lightest_any_configuration_of_the_run_needed(tmp_path):
    """The cores are the same whatever the pool. tmw=8 needs 45, 38 and 30
    µs of host CPU at N = 4, 16 and 64; tmw=2 needed 28 µs at N = 64. Left
    out, tmw=8's N = 64 is bounded by the 28 µs the run measured (a bound
    from its own N = 4 and 16 alone, 2 cores / 38 µs = 52,632 ops/s, is
    below the 66,667 it measured); the full run's bound is the same 28 µs."""
    falls = {4: 45.0, 16: 38.0, 64: 30.0}
    rows = [batched(n, 8, h) for n, h in falls.items()] + [batched(n, 2, 28.0) for n in (4, 16, 64)]
    res = result_dir(tmp_path, rows, {"topology.virtual_clients": [4, 16, 64], "middleware.workers": [2, 8]})
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    measured_x = rows[2]["client_tput"]
    assert measured_x > 1.2 * 2 / 38e-6
    t = leave_one_out(agg, info).table
    out = t[(t["configuration"] == "tmw=8") & (t["N"] == 64)].iloc[0]
    top = float(out["X 90% interval"].split("..")[1].replace(",", "").rstrip("*"))
    assert top >= measured_x and out["covered"] == "yes", out.to_dict()
    (p,) = predict(agg, info, parse_changes(["tmw=8"]), clients=[256])
    assert p.bounds.x_max_by == "host CPU"
    assert p.bounds.by_demand_us == pytest.approx(28.0, rel=0.05) and p.bounds.by_demand_us <= 28.0
    assert "2.00 cores / 2" in p.bounds.limit()


def test_fewer_workers_than_measured_are_not_bounded_by_the_busier_pools_holding(tmp_path):
    """One point of 8 workers, predicted for 2: 8 workers contending for 2
    cores hold a request longer than 2 would, so their holding time bounds
    nothing for the smaller pool (it had cut off the 2 workers' truth)."""
    res = result_dir(tmp_path, [measured(8, 8)], {"topology.virtual_clients": [8], "middleware.workers": [8]})
    agg, info = pd.read_csv(res / "aggregate.csv"), info_of(res)
    (p,) = predict(agg, info, parse_changes(["tmw=2"]), clients=[8])
    assert p.bounds.x_max_by != "workers"
    assert p.bounds.x_top >= measured(8, 2)["client_tput"]


def test_a_change_that_changes_nothing_reproduces_the_measurement(tmp_path):
    """replication=none is the one copy the run measured: the prediction is
    the measured configuration's own, not one carried by the rules."""
    agg, info, _ = two_pools(tmp_path)
    plain = {(p.config["tmw"], p.n): (p.x, p.x_hi) for p in predict(agg, info, clients=[4, 16])}
    same = predict(agg, info, parse_changes(["replication=none"]), clients=[4, 16])
    assert len(same) == len(plain) == 4
    for p in same:
        assert (p.x, p.x_hi) == pytest.approx(plain[(p.config["tmw"], p.n)], rel=1e-9)
        assert not any("carried by the rules" in note for note in p.notes), p.notes


def test_a_pool_between_two_measured_is_interpolated_whatever_else_changes(tmp_path):
    """tmw=4 lies between tmw=2 and tmw=8: with nsvr=3 as well, it is still
    interpolated between both (each carried to three servers), not carried
    from whichever came first in a tie of distances."""
    agg, info, _ = two_pools(tmp_path)
    (p,) = predict(agg, info, parse_changes(["tmw=4", "nsvr=3"]), clients=[16])
    assert p.basis == "tmw=2 and tmw=8"
    assert "between tmw=2 and tmw=8" in p.notes[0] and "nsvr=3 carried by the rules" in p.notes[0]
