#!/usr/bin/env python3
"""How often the predictions' 90% intervals cover the truth, and how wide
they are, on synthetic systems (those of lab/tests/test_predict_intervals.py)
at 2%, 5% and 10% run-to-run noise: 200 systems each, calibrated on N = 2, 8,
32 with 3 repetitions, predicted at ten populations from 1 to 128.

Usage: .venv/bin/python bench/intervals.py [systems]   (default 200)
"""

import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab" / "tests"))
from mwlab.predict import predict_one
from test_predict_intervals import CALIBRATED, HELD_OUT, System

systems = int(sys.argv[1]) if len(sys.argv) > 1 else 200
print(f"{'noise':>6} {'where':>8} {'covered':>8} {'median ±':>9} {'widest ±':>9}")
for noise in (0.02, 0.05, 0.10):
    rng = random.Random(1000 + int(noise * 1000))
    cov = {"inside": [0, 0], "outside": [0, 0]}
    width = {"inside": [], "outside": []}
    for _ in range(systems):
        s = System(rng, noise)
        cal = s.calibration(3)
        for n in HELD_OUT:
            p = predict_one(cal, n)
            x, r = s.truth(n)
            where = "inside" if CALIBRATED[0] <= n <= CALIBRATED[-1] else "outside"
            cov[where][0] += int(p.x_lo <= x <= p.x_hi) + int(p.r_lo <= r <= p.r_hi)
            cov[where][1] += 2
            width[where].append(
                max((p.x_hi - p.x_lo) / 2 / p.x, (p.r_hi - p.r_lo) / 2 / p.r_us)
            )
    for where, (c, t) in cov.items():
        w = width[where]
        print(
            f"{noise:>6.0%} {where:>8} {c / t:>8.1%} {statistics.median(w):>9.1%} {max(w):>9.1%}"
        )
