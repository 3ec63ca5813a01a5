"""Reading the results format (docs/results-format.md): windows, summaries,
traces and their HDR histograms.

Nothing damaged is skipped: a line of ``windows.jsonl`` that is not a whole
record raises :class:`ResultsFormatError` naming the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

FORMAT = "mwlab/1"
# The bounds every mwlab component uses: 1 us to 60 s, 3 significant digits.
HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS = 1, 60_000_000, 3


class ResultsFormatError(ValueError):
    """A results file that is not in the results format."""


def _check(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ResultsFormatError(f"{where}: not a JSON object")
    fmt = record.get("format")
    if fmt != FORMAT:
        raise ResultsFormatError(f"{where}: format is {fmt!r}, this reader knows {FORMAT!r}")
    for field in ("source", "start_unix_ms", "duration_ms", "ops"):
        if field not in record:
            raise ResultsFormatError(f"{where}: missing field {field!r}")
    return record


def read_windows(directory: str | Path) -> list[dict[str, Any]]:
    """Every window record of ``directory/windows.jsonl``, in order."""
    path = Path(directory) / "windows.jsonl"
    text = path.read_text(encoding="utf-8")
    records = []
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        if not line.endswith("\n"):
            raise ResultsFormatError(f"{where}: truncated line (no newline at end)")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ResultsFormatError(f"{where}: not valid JSON ({e.msg})") from e
        records.append(_check(record, where))
    return records


def read_summary(directory: str | Path) -> dict[str, Any]:
    """The ``summary.json`` record of ``directory``."""
    path = Path(directory) / "summary.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ResultsFormatError(f"{path}: not valid JSON ({e.msg})") from e
    return _check(record, str(path))


@dataclass(frozen=True)
class TraceRow:
    """One sampled request of ``trace.csv`` (times in ns, one monotonic clock)."""

    request_id: int
    op: str
    keys: int
    worker: int
    t_recv: int
    t_parsed: int
    t_enqueue: int
    t_dequeue: int
    t_send: int
    t_backend_done: int
    t_reply: int
    servers: int
    status: str

    @property
    def response_ns(self) -> int:
        return self.t_reply - self.t_recv


def read_trace(directory: str | Path) -> list[TraceRow]:
    """The rows of ``directory/trace.csv``."""
    path = Path(directory) / "trace.csv"
    rows = []
    with path.open(newline="", encoding="utf-8") as f:
        for number, row in enumerate(csv.DictReader(f), start=2):
            try:
                rows.append(TraceRow(**{k: (v if k in ("op", "status") else int(v)) for k, v in row.items()}))
            except (TypeError, ValueError) as e:
                raise ResultsFormatError(f"{path}:{number}: bad trace row ({e})") from e
    return rows


def decode_hist(encoded: str) -> HdrHistogram:
    """An HDR histogram from its V2 compressed, base64 form."""
    h = HdrHistogram(HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS)
    h.decode_and_add(encoded)
    return h


def merge_hists(encoded: Iterable[str]) -> HdrHistogram:
    """The exact merge of several encoded histograms."""
    h = HdrHistogram(HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS)
    for e in encoded:
        h.decode_and_add(e)
    return h
