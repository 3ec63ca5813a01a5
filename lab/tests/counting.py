"""How far apart two processes' counts of the same requests may be.

A client and a middleware count each request once, in the window whose
counts their collecting thread had not yet taken when the request completed.
Over the windows of the same seconds they differ by the requests in flight
at the two ends (one per virtual client at each) and by those that completed
between the moments the two processes collected the counts of the windows
at the ends; each window record says how late after its end that was
(`collected_late_us`), which a loaded machine stretches. Those requests are
taken at twice the fastest window's rate, far above what N clients with one
request outstanding each keep up over a few milliseconds: a lost or doubly
counted window still breaks the bound, whatever the machine's load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Window = dict[str, Any]


def late_us(windows: Sequence[Window], end_ms: float) -> int:
    """How late the counts of the window ending at `end_ms` (on the windows'
    own clock) were collected; 0 when no window ends there (the process
    began then, and counted nothing before)."""
    ending = (w for w in windows if w["start_unix_ms"] + w["duration_ms"] == end_ms)
    return next((w.get("collected_late_us", 0) for w in ending), 0)


def allowed_apart(
    n: float,
    a: Sequence[Window],
    a_edges: tuple[float, float],
    b: Sequence[Window],
    b_edges: tuple[float, float],
    compared: Sequence[Window],
) -> float:
    """The most two processes' counts over the compared windows may differ:
    `a` and `b` are all their windows, `a_edges` and `b_edges` the start and
    end of the compared span on each one's own clock, `n` the virtual clients."""
    skew = sum(abs(late_us(a, ta) - late_us(b, tb)) for ta, tb in zip(a_edges, b_edges, strict=True))
    fastest = max(w["ops"]["all"]["count"] * 1000 / w["duration_ms"] for w in compared)
    return 2 * n + 2 * fastest * skew / 1e6 + 1
