"""The answer in the terminal and the report's tables as a reader sees them:
`mwlab run` prints the checks that need a look (a run whose gets cannot all
hit, since nothing set the keys first) and the interference measured; the
report's counts are integers, its errors percentages, its noise-floor table
has readable headers and no empty column, "too short to judge" is said once
per check; `mwlab --version`."""

from __future__ import annotations

import contextlib
import io
import re
from html.parser import HTMLParser
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest

from mwlab.cli import main
from mwlab.noise import noise_table
from mwlab.render import table

# Nothing prefilled and 100,000 keys: a run's gets mostly miss, so its
# "misses" check fails, whatever the machine's load.
MISSES = (
    "name: misses\n"
    "topology: {servers: 1, middlewares: 1, threads: 1}\n"
    "middleware: {workers: 2}\n"
    "workload: {ratio: '1:10', keys: 100000, value_size: 64, prefill: false}\n"
    "factors: {vcli: [1, 2]}\n"
    "run: {duration: 1.5, warmup: 0.5, cooldown: 0, repetitions: 1, window_ms: 250, reference: false}\n"
)
COUNT = re.compile(r"^-?\d{1,3}(,\d{3})*$")
PERCENT = re.compile(r"^[+-]\d+\.\d%$")


class Tables(HTMLParser):
    """Every <table> of a page as (headers, rows of cell texts)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[list[str], list[list[str]]]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._head = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append(([], []))
        elif tag == "tr":
            self._row, self._head = [], False
        elif tag in ("td", "th"):
            self._cell, self._head = [], self._head or tag == "th"

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self.tables:
            headers, rows = self.tables[-1]
            if self._head and not headers and not rows:
                headers.extend(self._row)
            else:
                rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables_of(html: str) -> list[tuple[list[str], list[list[str]]]]:
    parser = Tables()
    parser.feed(html)
    return [(h, rows) for h, rows in parser.tables if h]


@pytest.fixture(scope="module")
def misses(tmp_path_factory) -> tuple[Path, str]:
    """The spec run by `mwlab run` once for the module: its result directory
    and what the command printed."""
    tmp = tmp_path_factory.mktemp("misses")
    spec = tmp / "misses.yaml"
    spec.write_text(MISSES)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", str(spec), "--results", str(tmp / "r")]) == 0
    (result,) = (tmp / "r" / "misses").iterdir()
    return result, out.getvalue()


def test_the_run_prints_every_check_that_needs_a_look_with_what_to_do(misses):
    result, printed = misses
    checks = pd.read_csv(result / "checks.csv")
    failed = checks[(checks["verdict"] == "CHECK")]
    assert "misses" in set(failed["name"]), "the spec makes the misses check fail"
    lines = printed.splitlines()
    # The head line counts the checks, one line each below it (checks.csv has a verdict per run).
    n = failed["name"].nunique()
    (head,) = [line for line in lines if " a look (of " in line]
    assert head.startswith(f"{n} check") and f"{len(failed)} not met" in head, printed
    assert len([x for x in lines if " — not met in " in x]) == n, printed
    need = "check needs" if n == 1 else "checks need"
    assert f"{n} {need} a look (in brackets," in (result / "report.html").read_text(), "and so does the page"
    for name, group in failed.groupby("name"):
        (line,) = [x for x in lines if x.startswith(f"  {name} — not met in {len(group)} of ")]
        assert line.rstrip().endswith("."), line
    (miss,) = [x for x in lines if x.startswith("  misses — ")]
    assert "workload.prefill" in miss, "says what to do"
    # The CPU other processes took is said, failing or not.
    assert any("other processes took" in x for x in lines), printed
    # After the per-point lines, before the report's path.
    assert lines[-1].startswith("report: ")


def test_when_every_check_passes_one_line_says_so():
    from mwlab.verdict import look_lines

    checks = pd.DataFrame(
        [
            ("errors", "a rep 1", True, "ok", "0 of 10 requests"),
            ("errors", "b rep 1", True, "ok", "0 of 12 requests"),
            ("warm-up long enough", "a rep 1", True, "too short to judge", "6 windows; 20 needed"),
        ],
        columns=["name", "where", "ok", "verdict", "detail"],
    )
    summary = pd.DataFrame({"status": ["ok", "ok"], "cpu_other_cores": [0.01, 0.04], "cores": [2.0, 2.0]})
    assert look_lines(checks, summary) == [
        "All 2 checks pass (3 verdicts in checks.csv, 1 too short to judge); "
        "other processes took at most 0.04 of 2 cores"
    ]
    # Interference: the range measured, against the limit, and what to do.
    busy = ("no interference", "a rep 1", False, "CHECK", "other processes used 0.90 of 2 cores (45%)")
    bad = pd.concat([checks, pd.DataFrame([busy], columns=checks.columns)])
    summary.loc[0, "cpu_other_cores"] = 0.9
    lines = look_lines(bad, summary)
    assert lines[0] == (
        "1 check needs a look (of 4 verdicts in checks.csv: 1 not met, 2 met, 1 too short to judge):"
    )
    assert lines[1].startswith("  no interference — not met in 1 of 1 runs: other processes took up to 0.90")
    assert "quiet machine" in lines[1] and len(lines) == 2


def test_the_head_line_counts_the_checks_it_lists_not_their_failed_runs():
    """Three failed verdicts of two checks: "2 checks need a look", two lines."""
    from mwlab.verdict import look_lines

    checks = pd.DataFrame(
        [
            ("errors", "a rep 1", False, "CHECK", "3 of 10 requests"),
            ("errors", "b rep 1", False, "CHECK", "4 of 12 requests"),
            ("errors", "c rep 1", True, "ok", "0 of 12 requests"),
            ("misses", "a rep 1", False, "CHECK", "90% of gets"),
            ("misses", "b rep 1", True, "ok", "0% of gets"),
        ],
        columns=["name", "where", "ok", "verdict", "detail"],
    )
    lines = look_lines(checks, pd.DataFrame())
    assert lines[0] == "2 checks need a look (of 5 verdicts in checks.csv: 3 not met, 2 met):"
    assert [x.split(" — ")[0] for x in lines[1:]] == ["  errors", "  misses"]
    assert lines[1].startswith("  errors — not met in 2 of 3 runs: e.g. a rep 1: 3 of 10 requests.")


def test_counts_are_integers_errors_percentages_and_empty_columns_left_out():
    df = pd.DataFrame(
        {
            "point": ["a", "b"],
            "N": [2.0, 24.0],
            "repetitions": [1.0, 1.0],
            "errors": [0.0, 3.0],
            "X measured (ops/s)": [25553.75, 31050.0],
            "X error": [-0.121, 0.0449],
            "M/M/1 waiting error": [7.875, "unstable"],
            "R (ms)": [0.3131, 1.0176],
            "± (ops/s)": [float("nan"), float("nan")],
            "U measured": [0.9, 0.172],
        }
    )
    (headers, rows), *_ = tables_of(str(table(df, 3)))
    assert "± (ops/s)" not in headers, "a column empty in every row is left out"
    col = {h: [r[i] for r in rows] for i, h in enumerate(headers)}
    assert col["N"] == ["2", "24"] and col["repetitions"] == ["1", "1"] and col["errors"] == ["0", "3"]
    assert col["X measured (ops/s)"] == ["25,554", "31,050"]
    assert col["X error"] == ["-12.1%", "+4.5%"]
    assert col["M/M/1 waiting error"] == ["+787.5%", "unstable"]
    assert col["R (ms)"] == ["0.313", "1.018"]
    assert col["U measured"] == ["90.0%", "17.2%"]


def _noise_row(reps: int, x_sd: float) -> pd.Series:
    return pd.Series(
        {
            "reps": reps,
            "client_tput": 1000.0,
            "client_tput_std": x_sd if reps > 1 else float("nan"),
            "client_rt_mean_us": 100.0,
            "client_rt_mean_us_std": x_sd / 10 if reps > 1 else float("nan"),
            "windows": 8,
            "client_tput_window_std": 80.0,
            "client_rt_window_std_us": 9.0,
        }
    )


def test_the_noise_floor_table_has_readable_headers_and_no_empty_column():
    once = noise_table({"tmw=2": [_noise_row(1, 0), _noise_row(1, 0)]})
    assert once["x_cv_lo"].isna().all(), "batch means have no interval"
    (headers, rows), *_ = tables_of(str(table(once, 3)))
    assert not any("_" in h for h in headers), headers
    assert {"throughput CV", "response time CV", "repetitions"} <= set(headers)
    assert "90% interval" not in headers
    for i, h in enumerate(headers):
        assert any(r[i] for r in rows), f"column {h!r} is empty in every row"
    repeated = noise_table({"tmw=8": [_noise_row(3, 50.0), _noise_row(3, 70.0)]})
    (headers, rows), *_ = tables_of(str(table(repeated, 3)))
    assert headers.count("90% interval") == 2
    i = headers.index("throughput CV")
    assert re.fullmatch(r"\d+\.\d%", rows[0][i]), rows[0]
    assert re.fullmatch(r"\d+\.\d% \.\. \d+\.\d%", rows[0][i + 1]), rows[0]


def test_the_report_shows_counts_as_integers_and_errors_as_percentages(misses):
    result, _ = misses
    html = (result / "report.html").read_text()
    seen = set()
    for headers, rows in tables_of(html):
        for i, h in enumerate(headers):
            cells = [r[i] for r in rows if i < len(r)]
            assert any(cells), f"column {h!r} is empty in every row"
            if h in ("N", "repetitions", "errors", "points", "workers", "degrees of freedom"):
                seen.add(h)
                assert all(COUNT.match(c) for c in cells if c), (h, cells)
            if re.search(r"\berror$", h) and h != "model's largest error":
                seen.add("error")
                assert all(PERCENT.match(c) for c in cells if c and c != "unstable"), (h, cells)
    assert {"N", "repetitions", "errors", "error"} <= seen, seen


def test_too_short_to_judge_is_said_once_per_check(misses):
    result, _ = misses
    html = (result / "report.html").read_text()
    checks = pd.read_csv(result / "checks.csv")
    short = checks[checks["verdict"] == "too short to judge"]
    assert not short.empty, "runs of 1.5 s are too short to judge a warm-up"
    assert not short["detail"].str.contains("too short").any(), "checks.csv says it in the verdict only"
    for name in set(short["name"]):
        anchor = "check-" + "".join(ch if ch.isalnum() else "-" for ch in name.lower())
        row = html[html.index(f'<tr id="{anchor}">') :]
        row = row[: row.index("</tr>")]
        assert row.count("too short to judge") == 1, row


def test_version(capsys):
    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as done:
            main([flag])
        assert done.value.code == 0
        assert capsys.readouterr().out.strip() == f"mwlab {metadata.version('mwlab')}"


def test_help_is_laid_out_as_the_services_clap_help(capsys):
    """mwproxy, mwmq and mwload print clap's help: "Usage:", "Options:",
    "Commands:", "Print help"; mwlab's argparse help says the same words."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("Usage: mwlab") and "\nOptions:\n" in out and "\nCommands:\n" in out
    assert "-h, --help     Print help" in out and "-V, --version  Print version" in out
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("Usage: mwlab predict") and "\nArguments:\n" in out and "Print help" in out


def test_the_terminal_says_how_many_points_left_out_were_covered(tmp_path):
    from mwlab.verdict import left_out_lines

    assert left_out_lines(tmp_path) == [], "no leave-one-out.csv: nothing to say"
    pd.DataFrame({"covered": ["yes"] * 7 + ["no"]}).to_csv(tmp_path / "leave-one-out.csv", index=False)
    assert left_out_lines(tmp_path) == [
        "Left out in turn, 7 of 8 points lie in their predicted 90% intervals (goal 85%: met)."
    ]
    pd.DataFrame({"covered": ["yes"] * 4 + ["no"] * 2}).to_csv(tmp_path / "leave-one-out.csv", index=False)
    assert "4 of 6" in left_out_lines(tmp_path)[0] and "not met" in left_out_lines(tmp_path)[0]
