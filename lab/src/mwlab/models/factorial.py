"""2^k r factorial designs (Jain ch. 17-18): sign table, effects, allocation of
variation, confidence intervals for effects, and the design generator."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from mwlab.models.errors import ModelError

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def design(levels: dict[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The 2^k combinations of two-level factors, in standard (Yates) order:
    the first factor changes fastest. Feed it to the lab's factor lists."""
    for name, lv in levels.items():
        if len(lv) != 2:
            raise ModelError(f"factor {name} needs exactly two levels, not {list(lv)}")
    names = list(levels)
    rows = []
    for signs in itertools.product((0, 1), repeat=len(names)):
        signs = signs[::-1]
        rows.append({n: levels[n][s] for n, s in zip(names, signs, strict=True)})
    return rows


def _effect_names(k: int) -> list[tuple[str, tuple[int, ...]]]:
    """('q0', ()), ('A', (0,)), ('B', (1,)), ('AB', (0, 1)), ('C', (2,)), ... in Yates order."""
    out = [("q0", ())]
    for mask in range(1, 2**k):
        idx = tuple(i for i in range(k) if mask >> i & 1)
        out.append(("".join(LETTERS[i] for i in idx), idx))
    return out


LOW = {"-", "-1", "low", "lo", "off", "false", "no"}


def _sorted_levels(values: list[Any]) -> list[Any]:
    """Low level first: numbers by value, -/+ and low/high by meaning, other labels by name."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) == 2 and any(str(v).strip().lower() in LOW for v in distinct):
        return sorted(distinct, key=lambda v: str(v).strip().lower() not in LOW)
    try:
        return sorted(distinct, key=float)
    except (TypeError, ValueError):
        return sorted(distinct, key=_natural)


def _natural(v: Any) -> list[Any]:
    """Sort key that orders 4M before 16M and 1K before 2K."""
    return [(0, float(p)) if p and p[0].isdigit() else (1, p) for p in re.split(r"(\d+(?:\.\d+)?)", str(v))]


@dataclass(frozen=True)
class FactorialResult:
    factors: dict[str, str]
    levels: dict[str, list[Any]]
    replications: int
    effects: dict[str, float]
    variation: dict[str, float]
    ci: dict[str, list[float]] | None
    confidence: float
    effect_std: float | None = None
    dof: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "factors": self.factors,
            "levels": self.levels,
            "replications": self.replications,
            "effects": self.effects,
            "variation": self.variation,
            "ci": self.ci,
            "confidence": self.confidence,
            "effect_std": self.effect_std,
        }

    def contrast(self, weights: dict[str, float]) -> tuple[float, list[float] | None]:
        """A contrast Σ h_i q_i of effects (weights summing to 0) and its interval."""
        if abs(sum(weights.values())) > 1e-9:
            raise ModelError("the weights of a contrast must sum to zero")
        unknown = set(weights) - set(self.effects)
        if unknown:
            raise ModelError(f"no such effects: {sorted(unknown)}")
        u = sum(h * self.effects[n] for n, h in weights.items())
        if self.effect_std is None:
            return u, None
        s_u = self.effect_std * math.sqrt(sum(h * h for h in weights.values()))
        t = stats.t.ppf(1 - (1 - self.confidence) / 2, self.dof)
        return u, [u - t * s_u, u + t * s_u]


def analyze(
    names: list[str], rows: list[Sequence[Any]], y: list[float], confidence: float = 0.90
) -> FactorialResult:
    """2^k r analysis of observations `y`, one per row of factor levels."""
    k = len(names)
    if k < 1 or k > len(LETTERS):
        raise ModelError("a factorial design needs 1 to 26 factors")
    if len(rows) != len(y) or not rows:
        raise ModelError("one observation per row is needed")
    if not 0 < confidence < 1:
        raise ModelError("confidence must be between 0 and 1")
    levels = {}
    for i, n in enumerate(names):
        lv = _sorted_levels([r[i] for r in rows])
        if len(lv) != 2:
            raise ModelError(f"factor {n} must have exactly two levels, found {lv}")
        levels[n] = lv
    cells: dict[tuple[int, ...], list[float]] = {}
    for r, v in zip(rows, y, strict=True):
        key = tuple(1 if levels[n].index(r[i]) == 1 else -1 for i, n in enumerate(names))
        cells.setdefault(key, []).append(float(v))
    if len(cells) != 2**k:
        raise ModelError(f"a full 2^{k} design needs all {2**k} combinations; found {len(cells)}")
    reps = {len(v) for v in cells.values()}
    if len(reps) != 1:
        raise ModelError(f"every combination needs the same number of replications, found {sorted(reps)}")
    r = reps.pop()
    means = {key: sum(v) / r for key, v in cells.items()}
    effects: dict[str, float] = {}
    for label, idx in _effect_names(k):
        total = sum(m * math.prod(key[i] for i in idx) for key, m in means.items())
        effects[label] = total / 2**k
    grand = effects["q0"]
    sst = sum((v - grand) ** 2 for vs in cells.values() for v in vs)
    sse = sum((v - means[key]) ** 2 for key, vs in cells.items() for v in vs)
    variation = {
        label: 2**k * r * q**2 / sst if sst else 0.0 for label, q in effects.items() if label != "q0"
    }
    variation["error"] = sse / sst if sst else 0.0
    ci = None
    s_q = None
    dof = 2**k * (r - 1)
    if r > 1:
        s_q = math.sqrt(sse / dof) / math.sqrt(2**k * r)
        t = stats.t.ppf(1 - (1 - confidence) / 2, dof)
        ci = {label: [q - t * s_q, q + t * s_q] for label, q in effects.items()}
    factors = {LETTERS[i]: n for i, n in enumerate(names)}
    return FactorialResult(factors, levels, r, effects, variation, ci, confidence, s_q, dof)
