"""The `mwlab` command line: run, analyze, report, compare, validate, list,
and `--version`."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import sys
from importlib import metadata
from pathlib import Path
from typing import ClassVar

from mwlab import __version__, freshness, model_cli, plan, predict_cli, reference, routes, stats_cli
from mwlab.analysis import summarize
from mwlab.compare import CompareError, compare, reference_ratio, write_page
from mwlab.drift import run_lines as drift_lines
from mwlab.predict import PredictError
from mwlab.procs import REPO, LabError, binary
from mwlab.render import write_report
from mwlab.spec import ROLES, Settings, SpecError, load, run_seconds
from mwlab.verdict import result_lines

EXPERIMENTS = REPO / "experiments"
SINCE_HELP = "say how far the machine moved since this earlier result (by their reference points)"


def version() -> str:
    """The installed package's version (lab/pyproject.toml, as pip recorded it)."""
    try:
        return metadata.version("mwlab")
    except metadata.PackageNotFoundError:
        return f"{__version__} (not installed)"


def _spec_path(name: str) -> Path:
    p = Path(name)
    if p.exists():
        return p
    candidate = EXPERIMENTS / f"{name}.yaml"
    if candidate.exists():
        return candidate
    raise SpecError(f"no spec {name!r}: give a file or one of: {', '.join(_names())}")


def _names() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


def _earlier(since: str | None) -> Path | None:
    """--since RESULT: a result directory, or a clear refusal before anything runs."""
    if not since:
        return None
    path = Path(since)
    if not (path / "experiment.json").is_file():
        what = "not a result directory (no experiment.json)" if path.is_dir() else "no such result directory"
        raise LabError(f"--since {since}: {what}")
    return path


def analyze(result: Path, since: Path | None = None):
    """Tables, checks, plots and report of a result directory (its drift
    since the result `since`, when named); returns (report path, aggregate)."""
    summary, aggregate = summarize(result)
    return write_report(result, summary, aggregate, since=since), aggregate


def _warn(text: str) -> None:
    print(f"mwlab: {text}", file=sys.stderr)


def _binaries(exp) -> list[Path]:
    """The binaries the experiment's runs start (those built), for the
    warning about stale ones (`mwlab.freshness`)."""
    names = {"mwload"}
    for p in exp.points():
        s = p.settings
        names |= {"mwmq"} if s.mq else {"mwproxy"} if s.topology.middlewares else set()
    if exp.settings.run.reference:
        names.add("mwproxy")
    out = []
    for name in sorted(names):
        with contextlib.suppress(LabError):
            out.append(binary(name))
    return out


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP (what `timeout`, a closed terminal or a cancelled CI
    job send) stop a run as Ctrl-C does: every process of the run is stopped."""

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _key_numbers(agg) -> str:
    lines = []
    for _, r in agg.iterrows():
        parts = [f"{r['point']}: {r['client_tput']:,.0f} ops/s", f"R {r['client_rt_mean_us'] / 1000:.2f} ms"]
        if "mw_tput" in r and not math.isnan(r["mw_tput"]):
            parts.append(f"queue {r['mw_queue_us']:.0f} us")
        lines.append("  " + ", ".join(parts))
    return "\n".join(lines)


def _until_ci_line(res: dict) -> str:
    """One line on what `--until-ci` achieved."""
    worst = max(
        (max(w.get("throughput", math.inf), w.get("p99", math.inf)), n) for n, w in res["points"].items()
    )
    verdict = "every point within" if res["status"] == "met" else res["status"] + ";"
    return (
        f"until-ci: {verdict} ±{res['target_pct']:g}% after {res['rounds']} extra round(s); "
        f"widest: {worst[1]} ±{worst[0]:.1f}% (until_ci.json)"
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _hosts_line(s: Settings) -> str:
    h = s.hosts
    if h.emulation == "local":
        return "every process on this machine"
    if h.emulation == "ssh":
        remote = sorted(k for k in h.ssh or {} if k != "local_addr")
        return f"over SSH: {', '.join(remote)}; the rest on this machine"
    parts = []
    for role in ROLES:
        link = h.link(role)
        if isinstance(link, dict):
            parts.append(f"{role} " + ", ".join(f"{k} {link[k]}" for k in ("up", "down") if link.get(k)))
        elif link is not None:
            parts.append(f"{role} {link}")
    parts += [f"{role} CPUs {h.cpus(role)}" for role in ROLES if h.cpus(role) is not None]
    if h.delay is not None:
        parts.append(f"delay {h.delay}")
    return "network namespaces" + (f" ({', '.join(parts)})" if parts else "")


def _progress_printer():
    try:
        from rich.console import Console

        console = Console(stderr=True)
    except ImportError:  # pragma: no cover - rich is a dependency
        console = None

    def show(done: int, total: int, current: str, eta: float) -> None:
        eta_s = "" if math.isnan(eta) else f", about {eta:.0f} s left"
        msg = f"[{done}/{total}] {current}{eta_s}"
        if console is not None:
            console.print(msg, highlight=False)
        else:
            print(msg, file=sys.stderr)

    return show


def _pools_line(s: Settings) -> str:
    """The pools and the route's kind, for `mwlab validate`."""
    pools = ", ".join(
        f"{name} ({p['servers']} server{'s' if p['servers'] > 1 else ''})"
        for name, p in (s.routes.pools or {}).items()
    )
    route = s.routes.route
    kind = route if isinstance(route, str) else (route or {}).get("type", "?")
    prefill = f"; prefill: {s.routes.prefill_pool} directly" if s.routes.prefill_pool else ""
    return f"{pools}; route: {kind}{prefill}"


class _Help(argparse.HelpFormatter):
    """argparse's help laid out as clap's (mwproxy, mwmq, mwload): "Usage:",
    capitalised headings "Commands", "Arguments", "Options"."""

    HEADINGS: ClassVar[dict[str, str]] = {
        "positional arguments": "Arguments",
        "options": "Options",
        "optional arguments": "Options",
    }

    def add_usage(self, usage, actions, groups, prefix=None):
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)

    def start_section(self, heading: str | None) -> None:
        heading = heading or ""
        super().start_section(self.HEADINGS.get(heading, heading[:1].upper() + heading[1:]))


def _clap_style(parser: argparse.ArgumentParser) -> None:
    """Every parser and sub-parser in clap's layout and words ("Print help")."""
    parser.formatter_class = _Help
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            action.help = "Print help"
        elif isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _clap_style(sub)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mwlab",
        description="Experiments with memcached and mwproxy, PostgreSQL and mwmq, driven by mwload.",
    )
    parser.add_argument(
        "-V", "--version", action="version", version=f"mwlab {version()}", help="Print version"
    )
    sub = parser.add_subparsers(title="Commands", dest="command", required=True, metavar="<COMMAND>")
    p = sub.add_parser("run", help="run an experiment and write its report")
    p.add_argument("spec", help="a spec file or the name of one in experiments/")
    p.add_argument("--scale", default="quick", help="quick (minutes) or full (the seed reports' parameters)")
    p.add_argument("--results", default=str(REPO / "results"), help="where result directories go")
    p.add_argument("--resume", help="continue an interrupted run in this result directory")
    p.add_argument(
        "--until-ci",
        type=float,
        metavar="P",
        help="add repetitions until the 95%% intervals of throughput and p99 are within ±P%% at every point",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="with --until-ci: stop adding repetitions when the next round would pass this (default 3600)",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="run only the fewest runs that predict every population within --target (see mwlab plan)",
    )
    p.add_argument(
        "--target",
        default="10%",
        help="with --plan: widest 90%% half-width of throughput X and response time R (default 10%%)",
    )
    p.add_argument("--from", dest="prior", metavar="RESULT", help="with --plan: the result to plan from")
    p.add_argument("--since", metavar="RESULT", help=SINCE_HELP)
    p = sub.add_parser("analyze", help="recompute tables, checks, plots and the report of a result directory")
    p.add_argument("result")
    p.add_argument("--since", metavar="RESULT", help=SINCE_HELP)
    p = sub.add_parser("compare", help="compare two result sets of the same experiment")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--html", help="where the comparison page goes (default: compare.html in B)")
    p = sub.add_parser("validate", help="check a spec and list its points")
    p.add_argument("spec")
    p.add_argument("--scale", default="quick")
    sub.add_parser("list", help="list the experiments in experiments/")
    model_cli.add_parser(sub)
    predict_cli.add_parser(sub)
    plan.add_parser(sub)
    stats_cli.add_parser(sub)
    _clap_style(parser)
    args = parser.parse_args(argv)
    if args.command == "model":
        return model_cli.main(args)
    if args.command == "stats":
        return stats_cli.main(args)
    try:
        if args.command == "predict":
            return predict_cli.main(args)
        if args.command == "plan":
            return plan.main(args, _spec_path)
        if args.command == "list":
            for n in _names():
                print(n)
        elif args.command == "validate":
            path = _spec_path(args.spec)
            exp = load(path, args.scale)
            freshness.warn_once(_binaries(exp), _warn)
            routes.check(exp, str(path))
            runs = exp.runs()
            print(f"{exp.name} ({exp.scale}): {len(exp.points())} points, {len(runs)} runs")
            print(f"  hosts: {_hosts_line(exp.points()[0].settings)}")
            if exp.points()[0].settings.routes.pools:
                print(f"  pools: {_pools_line(exp.points()[0].settings)}")
            ref = reference.seconds() if exp.settings.run.reference else 0.0
            print(f"  time: at least {_duration(sum(run_seconds(r.point.settings) for r in runs) + ref)}")
            for pt in exp.points():
                print(f"  {pt.name}  N={pt.total_clients}")
        elif args.command == "run":
            from mwlab.runner import prepare, reference_around, run_experiment

            path = _spec_path(args.spec)
            exp = load(path, args.scale)
            freshness.warn_once(_binaries(exp), _warn)
            routes.check(exp, str(path))
            if args.until_ci is not None and not 0 < args.until_ci < 100:
                raise SpecError(f"--until-ci takes a percentage between 0 and 100, not {args.until_ci}")
            if args.prior and not args.plan:
                raise SpecError("--from RESULT plans from a result: give --plan with it")
            if args.plan:
                try:
                    exp, lines = plan.planned(exp, args.target, args.prior)
                except PredictError as e:
                    raise SpecError(str(e)) from None
                print("\n".join(lines))
            since = _earlier(args.since)
            out = prepare(exp, Path(args.results), Path(args.resume) if args.resume else None)
            try:
                with _signals_interrupt(), reference_around(out, exp.settings.run.reference, _warn):
                    run_experiment(exp, out, _progress_printer())
                    if args.until_ci is not None:
                        from mwlab.runner import run_until_ci

                        res = run_until_ci(exp, out, args.until_ci, args.budget, _progress_printer())
                        print(_until_ci_line(res))
            except KeyboardInterrupt:
                # A plan is resumed from the spec it wrote (the plan from a
                # pilot does not change, but the spec says what was chosen).
                spec = str(out / "spec.yaml") if args.plan else args.spec
                again = ["mwlab", "run", spec, "--scale", args.scale, "--resume", str(out)]
                print(
                    "mwlab: interrupted; every process was stopped. Continue with:\n  " + shlex.join(again),
                    file=sys.stderr,
                )
                return 130
            report, aggregate = analyze(out, since)
            if aggregate.empty:
                print(f"mwlab: every run failed; the report says why: {report}", file=sys.stderr)
                return 1
            print(_key_numbers(aggregate))
            print("\n".join(result_lines(out)))
            for line in drift_lines(out, since):
                print(line)
            print(f"report: {report}")
        elif args.command == "analyze":
            since = _earlier(args.since)
            report = analyze(Path(args.result), since)[0]
            print("\n".join(result_lines(Path(args.result))))
            for line in drift_lines(Path(args.result), since):
                print(line)
            print(f"report: {report}")
        elif args.command == "compare":
            df = compare(Path(args.a), Path(args.b))
            print(reference_ratio(Path(args.a), Path(args.b))[1])
            print(
                df.to_string(
                    index=False, float_format=lambda v: f"{v:,.2f}", formatters={"p": lambda v: f"{v:.3g}"}
                )
            )
            page = write_page(Path(args.a), Path(args.b), df, Path(args.html) if args.html else None)
            print(f"page: {page}")
    except (SpecError, LabError, CompareError, FileNotFoundError) as e:
        print(f"mwlab: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mwlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`mwlab validate x | head`): quietly, as other tools do.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces stdout until exit
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
