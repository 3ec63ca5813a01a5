"""report.html from a computed [`Report`](mwlab.report.Report): a Jinja2
template (`templates/report.html.j2`) with the page's words, and the filters
that turn tables (formatted by `mwlab.display`) and images into one
self-contained page (images embedded, so it opens offline)."""

from __future__ import annotations

import base64
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from mwlab.display import readable
from mwlab.report import Report, compute


def table(df: pd.DataFrame, digits: int = 1) -> Markup:
    """A DataFrame as an HTML table that scrolls sideways when it is wide,
    its headers and numbers as `mwlab.display.readable` writes them (`digits`:
    the most decimals of a column without a unit)."""
    if df is None or df.empty:
        return Markup("<p class='muted'>(none)</p>")
    html = readable(df, digits).to_html(index=False, border=0)
    return Markup(f"<div class='wide'>{html}</div>")


def data_uri(path: Path) -> str:
    """A PNG as a data: URI."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def environment() -> Environment:
    """The template environment (autoescaping, undefined names are errors)."""
    env = Environment(
        loader=PackageLoader("mwlab", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["table"] = table
    env.filters["data_uri"] = data_uri
    return env


def render(report: Report) -> str:
    """The report page."""
    return environment().get_template("report.html.j2").render(r=report)


def write_report(
    result: Path, summary: pd.DataFrame, aggregate: pd.DataFrame, since: Path | None = None
) -> Path:
    """Writes plots, checks.csv, the model files and report.html into
    `result` (with the drift since the result `since`, when named); returns
    the report's path."""
    path = result / "report.html"
    path.write_text(render(compute(result, summary, aggregate, since=since)), encoding="utf-8")
    return path
