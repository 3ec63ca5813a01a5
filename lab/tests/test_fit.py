"""Models fitted to measurements, on synthetic measurements with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from mwlab.fit import factorial_fit, fit_sweep, queue_views, sweeps
from mwlab.models.laws import Center
from mwlab.models.mva import mva


def synthetic_sweep():
    """A sweep whose 'measurements' are what the model itself predicts."""
    net, worker, server, lan, z = 2e-6, 20e-6, 50e-6, 30e-6, 0.0
    centers = [
        Center("lan", lan, "delay"),
        Center("net", net, "multi", 1),
        Center("w", worker, "multi", 4),
        Center("s", server, "multi", 2),
    ]
    res = mva(centers, z, 24)
    rows = []
    for n in (1, 4, 8, 16, 24):
        x, r = res.throughput[n - 1], res.response_time[n - 1]
        rows.append(
            {
                "point": f"vcli={n}",
                "vcli": n,
                "tmw": 4,
                "nsvr": 2,
                "nmw": 1,
                "N": float(n),
                "Z_us": 0.0,
                "client_tput": x,
                "client_rt_mean_us": r * 1e6,
                "mw_tput": x,
                "mw_rt_mean_us": (r - lan) * 1e6,
                "mw_net_us": net * 1e6,
                "mw_server_us": server * 1e6,
                "mw_service_us": (worker + server) * 1e6,
                "mw_queue_len": 0.0,
                "mw_queue_us": 0.0,
            }
        )
    return pd.DataFrame(rows)


def test_a_sweep_that_follows_the_model_is_fitted_exactly():
    agg = synthetic_sweep()
    groups = sweeps(agg, ["vcli", "tmw"])
    assert len(groups) == 1
    fit = fit_sweep(*groups[0], settings={})
    assert fit is not None
    assert fit.table["X error"].abs().max() < 1e-9
    assert fit.holds_up_to == 24
    assert fit.bottleneck == "servers"
    assert fit.knee == pytest.approx((2e-6 + 20e-6 + 50e-6 + 30e-6) / 25e-6)


def test_a_sweep_that_saturates_early_shows_where_the_model_stops_holding():
    agg = synthetic_sweep()
    agg.loc[agg["N"] >= 16, "client_tput"] *= 0.5
    agg.loc[agg["N"] >= 16, "client_rt_mean_us"] *= 2
    fit = fit_sweep(*sweeps(agg, ["vcli", "tmw"])[0], settings={})
    assert fit.holds_up_to == 8


def test_single_queue_views_flag_the_saturated_point():
    agg = synthetic_sweep()
    agg["mw_queue_us"] = [1.0, 5.0, 20.0, 60.0, 100.0]
    qv = queue_views(agg, settings={})
    assert len(qv) == 5
    assert math.isinf(qv.iloc[-1]["M/M/1 queue length"]), "at the largest throughput ρ = 1"
    assert qv.iloc[0]["M/M/m utilization"] < 0.5
    assert (qv["M/M/m waiting (us)"].iloc[:-1] <= qv["M/M/1 waiting (us)"].iloc[:-1]).all()


def test_factorial_fit_needs_two_levels_and_repetitions():
    rows = []
    for a, b, ys in ((1, 8, (10, 12)), (3, 8, (30, 32)), (1, 32, (11, 13)), (3, 32, (41, 43))):
        rows += [{"status": "ok", "nsvr": a, "tmw": b, "client_tput": y} for y in ys]
    s = pd.DataFrame(rows)
    f = factorial_fit(s, ["nsvr", "tmw"], "client_tput")
    assert f is not None and f.effects["q0"] == pytest.approx(24.0)
    assert f.effects["A"] == pytest.approx(12.5) and f.factors == {"A": "nsvr", "B": "tmw"}
    assert factorial_fit(s.iloc[::2], ["nsvr", "tmw"], "client_tput") is None, "no repetitions"
