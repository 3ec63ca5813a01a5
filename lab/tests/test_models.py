"""Queueing models against textbook values, closed forms and a seeded simulation."""

from __future__ import annotations

import math
import random

import pytest

from mwlab.models import ModelError
from mwlab.models.factorial import analyze, design
from mwlab.models.laws import Center, bounds, interactive_response_time, little
from mwlab.models.mva import jackson, mva, mva_multiclass, schweitzer
from mwlab.models.queues import mg1, mm1, mmm, mmmb
from mwlab.models.sim import simulate_closed, simulate_mmm


def test_mm1_gateway_example():
    # Jain, Example 31.1: packets at 125/s, 2 ms each.
    r = mm1(125, 500)
    assert r.utilization == pytest.approx(0.25)
    assert r.mean_jobs == pytest.approx(1 / 3)
    assert r.mean_response_time == pytest.approx(1 / 375)
    assert r.mean_queue_length == pytest.approx(0.25**2 / 0.75)
    assert little(125, r.mean_response_time) == pytest.approx(r.mean_jobs)


def test_erlang_c_known_values_and_mm1_as_a_special_case():
    r = mmm(1, 1, 2)
    assert r.prob_queueing == pytest.approx(1 / 3)
    assert r.mean_waiting_time == pytest.approx(1 / 3)
    one, single = mmm(3, 5, 1), mm1(3, 5)
    for f in ("mean_jobs", "mean_queue_length", "mean_response_time", "mean_waiting_time", "var_jobs"):
        assert getattr(one, f) == pytest.approx(getattr(single, f)), f


@pytest.mark.parametrize(("lam", "mu", "m"), [(3.0, 1.2, 3), (7.0, 1.0, 8), (0.5, 1.0, 1)])
def test_mmm_against_simulation(lam, mu, m):
    exact = mmm(lam, mu, m)
    sim = simulate_mmm(lam, mu, m, customers=200_000, seed=3)
    assert sim.mean_response_time == pytest.approx(exact.mean_response_time, rel=0.04)
    assert sim.mean_waiting_time == pytest.approx(exact.mean_waiting_time, rel=0.10, abs=0.01)


def test_mmmb_limits():
    # One server, no waiting room: Erlang B loss a / (1 + a).
    r = mmmb(2, 1, 1, 1)
    assert r.loss_probability == pytest.approx(2 / 3)
    # A huge buffer behaves like M/M/m.
    assert mmmb(3, 1.2, 3, 400).mean_queue_length == pytest.approx(mmm(3, 1.2, 3).mean_queue_length, rel=1e-6)
    # Finite buffers are stable even when overloaded.
    assert mmmb(10, 1, 2, 10).utilization < 1


def test_mg1_pollaczek_khinchine():
    assert mg1(4, 5, 1.0).mean_waiting_time == pytest.approx(mm1(4, 5).mean_waiting_time)
    assert mg1(4, 5, 0.0).mean_waiting_time == pytest.approx(mm1(4, 5).mean_waiting_time / 2)


@pytest.mark.parametrize(
    "call",
    [
        lambda: mm1(5, 5),
        lambda: mmm(10, 1, 3),
        lambda: mg1(6, 5, 1),
        lambda: mm1(-1, 5),
        lambda: mmmb(1, 1, 3, 2),
    ],
)
def test_unstable_or_impossible_inputs_raise(call):
    with pytest.raises(ModelError):
        call()


def repairman_throughput(d: float, z: float, n: int) -> float:
    """Closed form of the machine-repairman (finite-source M/M/1) model."""
    terms = [math.factorial(n) / math.factorial(n - k) * (d / z) ** k for k in range(n + 1)]
    p0 = 1 / sum(terms)
    return (1 - p0) / d


def test_mva_matches_the_machine_repairman_closed_form():
    res = mva([Center("cpu", 0.2)], think=1.0, users=10)
    for n in range(1, 11):
        assert res.throughput[n - 1] == pytest.approx(repairman_throughput(0.2, 1.0, n))
    assert res.throughput[0] == pytest.approx(1 / 1.2)
    x, r = res.throughput[-1], res.response_time[-1]
    assert interactive_response_time(10, x, 1.0) == pytest.approx(r)


def test_multiserver_centers_against_simulation():
    centers = [Center("net", 0.002), Center("workers", 0.010, "multi", 4), Center("server", 0.003)]
    exact = mva(centers, think=0.005, users=12)
    sim = simulate_closed([0.002, 0.010, 0.003], [1, 4, 1], [False, False, False], 0.005, 12, 60_000, seed=5)
    assert sim.throughput == pytest.approx(exact.throughput[-1], rel=0.03)
    assert sim.mean_response_time == pytest.approx(exact.response_time[-1], rel=0.04)
    # A multi-server center with at least as many servers as users is a delay.
    wide = mva([Center("w", 0.01, "multi", 50)], think=0.02, users=20)
    delay = mva([Center("w", 0.01, "delay")], think=0.02, users=20)
    assert wide.throughput == pytest.approx(delay.throughput)


def test_mva_stays_exact_beside_a_saturated_queue_with_many_servers():
    """baseline-1mw's write-only tmw=32 at N = 48, its host CPU left to the
    requests outside the workers' hold: a saturated queue beside 32 workers.
    The load-dependent recursion gave 31,837 ops/s; the product form, summed
    in exact fractions, gives 43,695."""
    from fractions import Fraction

    delay, cpu, hold, workers, users = (
        Fraction(120, 10**6),
        Fraction(2288, 10**8),
        Fraction(50311, 10**8),
        32,
        48,
    )

    def factors(demand: Fraction, servers) -> list[Fraction]:
        out = [Fraction(1)]
        for j in range(1, users + 1):
            out.append(out[-1] * demand / servers(j))
        return out

    g = [Fraction(1)] + [Fraction(0)] * users
    for f in (
        factors(delay, lambda j: j),
        factors(cpu, lambda j: 1),
        factors(hold, lambda j: min(j, workers)),
    ):
        g = [sum(g[k] * f[n - k] for k in range(n + 1)) for n in range(users + 1)]
    exact = float(g[users - 1] / g[users])
    centers = [
        Center("delay", float(delay), "delay"),
        Center("cpu", float(cpu)),
        Center("w", float(hold), "multi", 32),
    ]
    res = mva(centers, think=0.0, users=users)
    assert res.throughput[-1] == pytest.approx(exact, rel=1e-9)
    assert res.response_time[-1] == pytest.approx(users / exact, rel=1e-9)
    assert sum(res.centers[c.name]["queue_length"][-1] for c in centers) == pytest.approx(users, rel=1e-9)


def test_schweitzer_is_close_to_exact():
    centers = [Center("a", 0.01), Center("b", 0.02), Center("c", 0.015), Center("d", 0.005, "delay")]
    exact = mva(centers, think=0.1, users=30)
    approx = schweitzer(centers, think=0.1, users=30)
    for e, a in zip(exact.throughput, approx.throughput, strict=True):
        assert a == pytest.approx(e, rel=0.05)


def test_multiclass_mva_reduces_to_single_class():
    single = mva(
        [Center("cpu", 0.05), Center("disk", 0.08), Center("lan", 0.01, "delay")], think=0.5, users=6
    )
    multi = mva_multiclass(
        {"c": {"cpu": 0.05, "disk": 0.08, "lan": 0.01}},
        {"cpu": "queue", "disk": "queue", "lan": "delay"},
        {"c": 0.5},
        {"c": 6},
    )
    assert multi.throughput["c"] == pytest.approx(single.throughput[-1])
    two = mva_multiclass(
        {"a": {"cpu": 0.05}, "b": {"cpu": 0.05}}, {"cpu": "queue"}, {"a": 0.5, "b": 0.5}, {"a": 3, "b": 3}
    )
    merged = mva([Center("cpu", 0.05)], think=0.5, users=6)
    assert two.throughput["a"] + two.throughput["b"] == pytest.approx(merged.throughput[-1])


def test_jackson_tandem_is_the_sum_of_its_queues():
    res = jackson([2.0, 0.0], [[0.0, 1.0], [0.0, 0.0]], [5.0, 4.0])
    assert res.system_response_time == pytest.approx(
        mm1(2, 5).mean_response_time + mm1(2, 4).mean_response_time
    )
    feedback = jackson([1.0], [[0.5]], [5.0])
    assert feedback.arrival_rates[0] == pytest.approx(2.0)
    with pytest.raises(ModelError):
        jackson([1.0], [[0.9]], [5.0])


def test_exact_throughput_lies_within_the_bounds():
    rng = random.Random(9)
    for _ in range(30):
        centers = [Center(f"c{i}", rng.uniform(0.001, 0.05)) for i in range(rng.randint(1, 5))]
        z = rng.uniform(0, 0.5)
        n = rng.randint(1, 40)
        x = mva(centers, z, n).throughput[-1]
        b = bounds(centers, z, n)
        assert b.throughput_lower - 1e-9 <= x <= b.throughput_upper + 1e-9
        assert b.bjb_throughput_lower - 1e-9 <= x <= b.bjb_throughput_upper + 1e-9
    b = bounds([Center("cpu", 0.02), Center("disk", 0.05)], think=0.5, users=10)
    assert b.bottleneck == "disk" and b.knee == pytest.approx((0.07 + 0.5) / 0.05)


def test_jain_2k_r_example(jain_18_1):
    # Jain, Example 18.1 / Table 18.1: a 2^2 3 design (memory size x cache size).
    rows, y = jain_18_1
    res = analyze(["memory", "cache"], rows, y, confidence=0.90)
    assert res.effects == pytest.approx({"q0": 41.0, "A": 21.5, "B": 9.5, "AB": 5.0})
    assert res.variation["A"] == pytest.approx(5547 / 7032)
    assert res.variation["B"] == pytest.approx(1083 / 7032)
    assert res.variation["AB"] == pytest.approx(300 / 7032)
    assert res.variation["error"] == pytest.approx(102 / 7032)
    lo, hi = res.ci["q0"]
    assert (lo, hi) == pytest.approx((39.08, 42.92), abs=0.01)
    assert res.factors == {"A": "memory", "B": "cache"}


def test_design_generator_is_in_standard_order():
    rows = design({"servers": [1, 3], "workers": [8, 32]})
    assert rows == [
        {"servers": 1, "workers": 8},
        {"servers": 3, "workers": 8},
        {"servers": 1, "workers": 32},
        {"servers": 3, "workers": 32},
    ]
    with pytest.raises(ModelError):
        analyze(["a"], [(1,), (2,), (3,)], [1, 2, 3])


def test_waiting_and_response_quantiles():
    from mwlab.models.queues import mm1_response_quantile, mmm_waiting_quantile

    # P(W > t) at the quantile equals 1 - q.
    lam, mu, m = 3.0, 1.2, 3
    t = mmm_waiting_quantile(lam, mu, m, 0.9)
    r = mmm(lam, mu, m)
    assert r.prob_queueing * math.exp(-m * mu * (1 - r.utilization) * t) == pytest.approx(0.1)
    assert t == pytest.approx(r.waiting_time_p90)
    assert mmm_waiting_quantile(0.1, 1.0, 4, 0.5) == 0.0
    assert mm1_response_quantile(125, 500, 0.9) == pytest.approx(math.log(10) / 375)


def test_contrasts_of_effects(jain_18_1):
    rows, y = jain_18_1
    res = analyze(["A", "B"], rows, y, confidence=0.90)
    u, ci = res.contrast({"A": 1, "B": -1})
    assert u == pytest.approx(12.0)
    s_q = math.sqrt(102 / 8) / math.sqrt(12)
    half = (ci[1] - ci[0]) / 2
    assert half == pytest.approx(1.86 * s_q * math.sqrt(2), rel=0.01)
    with pytest.raises(ModelError):
        res.contrast({"A": 1})


def test_operational_laws():
    from mwlab.models.laws import forced_flow, general_response_time, utilization

    # A disk visited 20 times per request, 25 ms per visit, 1.5 requests/s (Jain, Example 33.1-like numbers).
    x_disk = forced_flow(1.5, 20)
    assert x_disk == pytest.approx(30)
    assert utilization(x_disk, 0.025) == pytest.approx(0.75)
    assert general_response_time([20, 1], [0.05, 0.2]) == pytest.approx(1.2)
    assert little(30, 0.05) == pytest.approx(1.5)
    with pytest.raises(ModelError):
        interactive_response_time(10, 0, 1)
