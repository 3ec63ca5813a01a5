"""The prediction intervals hold: on synthetic systems whose demands and
noise are known, at least 85% of the 90% intervals cover the truth, and they
stay narrow where the calibration is dense; the noise floor is measured from
repetitions (with a chi-square interval) or from batch means of one run."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from mwlab.curves import Curve
from mwlab.fit import Device
from mwlab.noise import noise_of, noise_table
from mwlab.predict import Calibration, _solve, _total, predict_one

CALIBRATED = (2, 8, 32)
HELD_OUT = (1, 3, 4, 6, 12, 16, 24, 48, 64, 128)


class System:
    """Two centres (a 2-core host CPU and a pool of 4 workers) whose demands
    change with the population as real ones do (contention, batching): each
    demand is base * shape(N) with a random shape, and every run measures
    throughput, response time and demands with multiplicative noise."""

    def __init__(self, rng: random.Random, noise: float):
        self.rng = rng
        self.noise = noise
        self.base = {"host CPU": rng.uniform(20, 80), "workers": rng.uniform(40, 200)}
        self.servers = {"host CPU": 2.0, "workers": 4.0}
        kind = rng.choice(["log", "saturating", "flat", "bend"])
        a = rng.uniform(-0.08, 0.15)

        def shape(n: float) -> float:
            ln = math.log(n)
            if kind == "log":
                return 1 + a * ln
            if kind == "saturating":
                return 1 + 3 * a * (1 - math.exp(-n / 16))
            if kind == "bend":
                return 1 + a * max(ln - math.log(8), 0.0)
            return 1.0

        self.shape = {name: shape for name in self.base}
        self.offset = rng.uniform(0, 30)  # µs outside the devices (network stack)

    def devices(self, n: float, jitter: float = 0.0) -> list[Device]:
        return [
            Device(
                name,
                b * self.shape[name](n) * (1 + jitter * self.rng.gauss(0, 1)),
                self.servers[name],
                in_network=True,
            )
            for name, b in self.base.items()
        ]

    def truth(self, n: int) -> tuple[float, float]:
        return _solve(self.devices(n), n, 0.0, self.offset)

    def measure(self, n: int, reps: int) -> tuple[pd.Series, dict[str, float]]:
        """A point as aggregate.csv has it (means and standard deviations over
        `reps` runs) and its mean measured demands."""
        x, r = self.truth(n)
        xs = [x * (1 + self.noise * self.rng.gauss(0, 1)) for _ in range(reps)]
        rs = [r * (1 + self.noise * self.rng.gauss(0, 1)) for _ in range(reps)]
        demands = {
            name: sum(d.demand_us for d in (self.devices(n, self.noise)[i] for _ in range(reps))) / reps
            for i, name in enumerate(self.base)
        }
        sd = lambda v: pd.Series(v).std() if len(v) > 1 else float("nan")  # noqa: E731
        row = pd.Series(
            {
                "N": n,
                "reps": reps,
                "client_tput": sum(xs) / reps,
                "client_tput_std": sd(xs),
                "client_rt_mean_us": sum(rs) / reps,
                "client_rt_mean_us_std": sd(rs),
            }
        )
        return row, demands

    def calibration(self, reps: int) -> Calibration:
        rows, per, offsets = [], {name: [] for name in self.base}, []
        for n in CALIBRATED:
            row, demands = self.measure(n, reps)
            rows.append(row)
            for name, d in demands.items():
                per[name].append((n, d))
            devs = [Device(name, d, self.servers[name], in_network=True) for name, d in demands.items()]
            _, r_model = _solve(devs, n, 0.0, 0.0)
            offsets.append((n, row["client_rt_mean_us"] - r_model))
        return Calibration(
            sweep="synthetic",
            levels={},
            settings=None,
            ns=list(CALIBRATED),
            think_us=0.0,
            curves={name: Curve.fit(pairs) for name, pairs in per.items()},
            servers=dict(self.servers),
            in_network={name: True for name in self.base},
            offset=Curve.fit(offsets),
            tails=[(n, 1.0, 3.0) for n in CALIBRATED],
            noise=noise_of(rows),
        )


@pytest.mark.parametrize("noise", [0.02, 0.05, 0.10])
def test_ninety_percent_intervals_cover_the_truth_on_synthetic_systems(noise):
    rng = random.Random(int(noise * 1000))
    covered = total = 0
    widths = []
    for _ in range(60):
        system = System(rng, noise)
        cal = system.calibration(reps=3)
        for n in HELD_OUT:
            p = predict_one(cal, n)
            x, r = system.truth(n)
            total += 2
            covered += int(p.x_lo <= x <= p.x_hi) + int(p.r_lo <= r <= p.r_hi)
            if n in (4, 16):
                widths.append((p.x_hi - p.x_lo) / 2 / p.x)
    share = covered / total
    assert share >= 0.85, f"{share:.1%} of the 90% intervals cover the truth at noise {noise:.0%}"
    median = sorted(widths)[len(widths) // 2]
    # Inside the calibrated range they stay useful: well under +-20% at 5% noise.
    assert median < 0.04 + 2.5 * noise, f"median half-width {median:.1%} at noise {noise:.0%}"


def test_the_noise_floor_from_repetitions_and_from_batch_means():
    rng = random.Random(7)
    system = System(rng, 0.05)
    rows = [system.measure(n, 5)[0] for n in (2, 4, 8, 16, 32, 64)]
    nz = noise_of(rows)
    assert nz.df == 6 * 4 and nz.method.startswith("repetitions")
    assert nz.x_cv_lo < 0.05 < nz.x_cv_hi, nz
    assert 0.03 < nz.x_cv < 0.08 and 0.03 < nz.r_cv < 0.08
    # One run per point: the windows' batch means, marked as a lower bound.
    single = pd.Series(
        {
            "N": 4,
            "reps": 1,
            "client_tput": 1000.0,
            "client_rt_mean_us": 400.0,
            "windows": 25,
            "client_tput_window_std": 50.0,
            "client_rt_window_std_us": 40.0,
        }
    )
    nz1 = noise_of([single])
    assert nz1.lower_bound and math.isclose(nz1.x_cv, 0.05 / 5) and math.isclose(nz1.r_cv, 0.1 / 5)
    table = noise_table({"tmw=4": rows, "tmw=8": [single]})
    assert list(table["configuration"]) == ["tmw=4", "tmw=8"]
    assert table.iloc[1]["df"] == 0


def test_intervals_widen_past_the_calibrated_range_and_with_rules():
    rng = random.Random(3)
    system = System(rng, 0.05)
    cal = system.calibration(reps=3)
    inside = predict_one(cal, 8)
    far = predict_one(cal, 512)
    # The width before the bounds clip it (far past the knee X's top is the
    # capacity).
    width = lambda p: _total(p.uncertainty["x"])  # noqa: E731
    assert inside.x_lo < inside.x < inside.x_hi and inside.r_lo < inside.r_us < inside.r_hi
    assert inside.p99_lo < inside.p99_us < inside.p99_hi
    assert width(far) >= width(inside)
    assert "x" in far.clipped and far.x_hi == far.bounds.x_top
    assert set(inside.to_dict()) >= {"x_lo", "x_hi", "r_lo", "r_hi", "uncertainty"}


def test_intervals_are_clipped_by_the_bounds_and_still_cover_the_truth():
    """Noisy calibrations of known systems: wherever an interval would pass
    the capacity the lightest measured demands give (X <= c / D) or fall
    below R >= N / X_max, it is clipped there, and the clipped intervals
    still cover the simulated truth at the stated rate."""
    rng = random.Random(11)
    clipped = covered = 0
    for _ in range(40):
        system = System(rng, 0.10)
        cal = system.calibration(reps=2)
        for n in HELD_OUT:
            p = predict_one(cal, n)
            b = p.bounds
            # The bound is what the lightest demand measured per device
            # allows, less a point's noise.
            lightest = min(
                cal.servers[name] / (min(v for _, v in c.knots) * 1e-6) for name, c in cal.curves.items()
            )
            assert b.x_max >= lightest * (1 - 1e-9) and b.x_max <= lightest * 1.5
            assert p.x_hi <= b.x_top * (1 + 1e-9) and p.r_lo >= b.r_floor * (1 - 1e-9)
            if "x" not in p.clipped:
                continue
            assert (
                _total(p.uncertainty["x"]) > 0
                and p.x * math.exp(1.6448 * _total(p.uncertainty["x"])) > b.x_top
            )
            x, r = system.truth(n)
            clipped += 1
            covered += int(p.x_lo <= x <= p.x_hi and p.r_lo <= r <= p.r_hi)
    assert clipped >= 40, f"only {clipped} intervals reached a bound"
    assert covered / clipped >= 0.85, f"{covered} of {clipped} clipped intervals cover the truth"


def test_repetitions_identical_to_the_last_digit_measure_no_noise():
    """Three repetitions with a standard deviation of 0 (a copied row): not a
    noise of 0 — which would make every interval a point — but no measure
    of it from repetitions at all."""
    rows = [
        pd.Series(
            {
                "N": n,
                "reps": 3,
                "client_tput": 1000.0,
                "client_tput_std": 0.0,
                "client_rt_mean_us": 400.0,
                "client_rt_mean_us_std": 0.0,
            }
        )
        for n in (1, 2)
    ]
    nz = noise_of(rows)
    assert not nz.method.startswith("repetitions") and nz.x_cv != 0
