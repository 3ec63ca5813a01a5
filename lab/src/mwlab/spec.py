"""Experiment specs: YAML files that declare a topology, middleware settings, a
workload and how to run it, where any setting may be a list of levels.

The run is the cross product of all lists (the *points*) times the repetitions,
in a randomised but seeded order. The seed reports' abbreviations (nsvr, ncli,
icli, tcli, vcli, nmw, tmw, mgshrd, mgsize, wrkld, reps, ttime) are accepted as
aliases. Everything is validated before anything starts.
"""

from __future__ import annotations

import copy
import itertools
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class SpecError(ValueError):
    """A spec that cannot be run, with a message that says what to change."""


# Every setting with its default, as section.key.
DEFAULTS: dict[str, Any] = {
    "topology.system": "memcached",
    "topology.servers": 1,
    "topology.middlewares": 0,
    "topology.client_machines": 1,
    "topology.instances": 1,
    "topology.threads": 2,
    "topology.virtual_clients": 1,
    "topology.client_targets": "spread",
    "middleware.engine": "pool",
    "middleware.threads": 0,
    "middleware.workers": 8,
    "middleware.net_threads": 1,
    "middleware.replication": 1,
    "middleware.multiget": "sharded",
    "middleware.queue_capacity": 1024,
    "middleware.trace_every": 100,
    "middleware.db_pool": None,
    "middleware.batch": 1,
    "workload.ratio": "1:10",
    "workload.keys": 10000,
    "workload.value_size": 128,
    "workload.multiget_size": 1,
    "workload.key_pattern": "uniform",
    "workload.think_time_us": 0,
    "workload.rate": None,
    "workload.prefill": True,
    "workload.receive": "pop",
    "workload.pairs": True,
    "workload.queues": 1,
    "run.duration": 10.0,
    "run.warmup": 2.0,
    "run.cooldown": 1.0,
    "run.trim_start": 0,
    "run.trim_end": 0,
    "run.repetitions": 3,
    "run.seed": 1,
    "run.window_ms": 1000,
    "run.client": "mwload",
    "hosts.emulation": "local",
    "hosts.server_link": None,
    "hosts.middleware_link": None,
    "hosts.client_link": None,
    "hosts.server_cpus": None,
    "hosts.middleware_cpus": None,
    "hosts.client_cpus": None,
    "hosts.delay": None,
    "hosts.ssh": None,
}

ALIASES = {
    "nsvr": "topology.servers",
    "ncli": "topology.client_machines",
    "icli": "topology.instances",
    "tcli": "topology.threads",
    "vcli": "topology.virtual_clients",
    "nmw": "topology.middlewares",
    "tmw": "middleware.workers",
    "engine": "middleware.engine",
    "mgshrd": "middleware.multiget",
    "mgsize": "workload.multiget_size",
    "wrkld": "workload.ratio",
    "reps": "run.repetitions",
    "ttime": "run.duration",
    "pool": "middleware.db_pool",
}

WORKLOADS = {"write-only": "1:0", "read-only": "0:1", "writes": "1:0", "reads": "0:1"}

SECTIONS = ("topology", "middleware", "workload", "run", "hosts")


def _canonical(key: str) -> str:
    if key in ALIASES:
        return ALIASES[key]
    if key in DEFAULTS:
        return key
    short = [k for k in DEFAULTS if k.split(".", 1)[1] == key]
    if len(short) == 1:
        return short[0]
    known = sorted(set(ALIASES) | {k.split(".", 1)[1] for k in DEFAULTS})
    raise SpecError(f"unknown setting {key!r}; known settings: {', '.join(known)}")


def _flatten(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """Section dicts and flat/aliased keys into one dict of canonical keys."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise SpecError(f"{where}: section {key!r} must be a mapping")
            for sub, v in value.items():
                name = f"{key}.{sub}"
                if name not in DEFAULTS:
                    known = ", ".join(k.split(".", 1)[1] for k in DEFAULTS if k.startswith(key + "."))
                    raise SpecError(f"{where}: unknown setting {sub!r} in {key}; known: {known}")
                flat[name] = v
        elif key == "factors":
            if not isinstance(value, dict):
                raise SpecError(f"{where}: factors must be a mapping of setting to levels")
            for sub, v in value.items():
                if sub == "together":
                    flat[TOGETHER] = _together(v, where)
                else:
                    flat[_canonical(sub)] = v
        else:
            flat[_canonical(key)] = value
    return flat


# Factors whose levels go together (the i-th level of each at once), e.g. the
# seed's scale-up: workers 1, 2, 4, 8 with 10, 20, 40, 80 clients.
TOGETHER = "__together__"


def _together(value: Any, where: str) -> dict[str, list[Any]]:
    if not isinstance(value, dict) or len(value) < 2:
        raise SpecError(f"{where}: factors: together maps two or more settings to lists of levels")
    out = {}
    for sub, levels in value.items():
        if not isinstance(levels, list) or not levels:
            raise SpecError(f"{where}: factors: together: {sub} needs a list of levels")
        out[_canonical(sub)] = levels
    lengths = {len(v) for v in out.values()}
    if len(lengths) != 1:
        raise SpecError(
            f"{where}: factors: together: every setting needs as many levels "
            f"({', '.join(f'{_short(k)}: {len(v)}' for k, v in out.items())})"
        )
    return out


def _normalise(key: str, value: Any) -> Any:
    if key == "workload.ratio":
        value = WORKLOADS.get(str(value), value)
    if key == "middleware.multiget" and isinstance(value, bool):
        value = "sharded" if value else "non-sharded"
    return value


@dataclass(frozen=True)
class Point:
    """One combination of factor levels: every setting resolved."""

    name: str
    settings: dict[str, Any]
    factors: dict[str, Any]

    def get(self, key: str) -> Any:
        return self.settings[_canonical(key)]

    @property
    def total_clients(self) -> int:
        """N: virtual clients over all client machines, instances and threads."""
        s = self.settings
        return (
            s["topology.client_machines"]
            * s["topology.instances"]
            * s["topology.threads"]
            * s["topology.virtual_clients"]
        )


@dataclass(frozen=True)
class Run:
    """One repetition of one point."""

    point: Point
    rep: int

    @property
    def key(self) -> str:
        return f"{self.point.name}/rep-{self.rep}"


@dataclass
class Experiment:
    """A validated experiment at one scale."""

    name: str
    description: str
    scale: str
    settings: dict[str, Any]
    factors: dict[str, list[Any]]
    source: dict[str, Any] = field(default_factory=dict)
    # Groups of factors whose levels go together rather than crossed.
    together: list[list[str]] = field(default_factory=list)

    def points(self) -> list[Point]:
        grouped = {n for g in self.together for n in g}
        alone = [n for n in self.factors if n not in grouped]
        # Each axis: a list of {setting: level} choices.
        axes = [[{n: v} for v in self.factors[n]] for n in alone]
        for g in self.together:
            axes.append([{n: self.factors[n][i] for n in g} for i in range(len(self.factors[g[0]]))])
        order = list(self.factors)
        points = []
        for combo in itertools.product(*axes):
            s = dict(self.settings)
            merged = {k: v for part in combo for k, v in part.items()}
            chosen = {n: merged[n] for n in order}
            s.update(chosen)
            s["middleware.replication"] = _replication(s["middleware.replication"], s["topology.servers"])
            label = ",".join(f"{_short(n)}={_label(v)}" for n, v in chosen.items()) or "default"
            points.append(Point(label, s, chosen))
        return points

    def runs(self) -> list[Run]:
        """Every point x repetition, shuffled with the run seed."""
        runs = [Run(p, r) for p in self.points() for r in range(1, p.settings["run.repetitions"] + 1)]
        random.Random(self.settings["run.seed"]).shuffle(runs)
        return runs


# Seconds each run spends besides its measured time: starting and stopping
# processes, creating emulated hosts, sampling (measured on this machine).
RUN_OVERHEAD_S = 3


def run_seconds(settings: dict[str, Any]) -> float:
    """About how long one run of a point with these settings takes."""
    return settings["run.warmup"] + settings["run.duration"] + settings["run.cooldown"] + RUN_OVERHEAD_S


def _replication(value: Any, servers: int) -> Any:
    """The seed reports' replication levels: none (1), half (ceil(n/2)), all (n)."""
    return {"none": 1, "half": (servers + 1) // 2, "all": servers}.get(value, value)


def _short(key: str) -> str:
    for alias, full in ALIASES.items():
        if full == key:
            return alias
    return key.split(".", 1)[1]


def _label(v: Any) -> str:
    return str(v).replace("/", "-").replace(" ", "")


def _validate_point(s: dict[str, Any], where: str) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise SpecError(f"{where}: {msg}")

    def positive_int(key: str, lo: int = 1, hi: int = 100_000) -> None:
        v = s[key]
        need(
            isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi,
            f"{key.split('.', 1)[1]} must be an integer in {lo}..{hi}, not {v!r}",
        )

    for k in (
        "topology.servers",
        "topology.client_machines",
        "topology.instances",
        "topology.threads",
        "topology.virtual_clients",
        "middleware.workers",
        "middleware.net_threads",
        "middleware.replication",
        "middleware.queue_capacity",
        "workload.keys",
        "workload.multiget_size",
        "run.repetitions",
    ):
        positive_int(k)
    positive_int("topology.middlewares", 0, 64)
    positive_int("middleware.threads", 0, 256)
    need(
        s["middleware.engine"] in ("pool", "async"),
        "engine must be pool (net thread, queue, workers) or async (event loops), "
        f"not {s['middleware.engine']!r}",
    )
    positive_int("workload.value_size", 1, 1 << 20)
    positive_int("middleware.trace_every", 0, 1 << 30)
    need(
        s["middleware.replication"] <= s["topology.servers"],
        f"replication {s['middleware.replication']} needs at least as many servers "
        f"(nsvr={s['topology.servers']})",
    )
    need(
        s["middleware.multiget"] in ("sharded", "non-sharded"),
        f"multiget must be sharded or non-sharded (mgshrd true/false), not {s['middleware.multiget']!r}",
    )
    need(
        s["topology.client_targets"] in ("spread", "all"),
        "client_targets must be spread (instance i uses server i) or all (ketama over every server)",
    )
    ratio = str(s["workload.ratio"])
    parts = ratio.split(":")
    need(
        len(parts) == 2 and all(p.isdigit() for p in parts) and sum(map(int, parts)) > 0,
        f"workload ratio must be SETS:GETS such as 1:10 (or write-only/read-only), not {ratio!r}",
    )
    need(
        s["workload.key_pattern"] in ("uniform", "sequential", "gaussian", "zipf"),
        "key_pattern must be uniform, sequential, gaussian or zipf",
    )
    for k in ("run.warmup", "run.cooldown"):
        need(isinstance(s[k], int | float) and s[k] >= 0, f"{k.split('.', 1)[1]} must be a number >= 0")
    need(
        isinstance(s["run.duration"], int | float) and s["run.duration"] > 0,
        f"duration (ttime) must be a number of seconds > 0, not {s['run.duration']!r}",
    )
    for k in ("run.trim_start", "run.trim_end"):
        need(
            isinstance(s[k], int) and not isinstance(s[k], bool) and s[k] >= 0,
            f"{k.split('.', 1)[1]} must be a whole number of windows >= 0, not {s[k]!r}",
        )
    need(s["run.client"] in ("mwload", "memtier"), "client must be mwload or memtier")
    rate = s["workload.rate"]
    need(
        rate is None or (isinstance(rate, int | float) and rate > 0), "rate must be a positive number or null"
    )
    need(
        isinstance(s["workload.think_time_us"], int) and s["workload.think_time_us"] >= 0,
        "think_time_us must be an integer >= 0",
    )
    need(s["run.window_ms"] >= 100, "window_ms must be at least 100")
    windows = int(s["run.duration"] * 1000 // s["run.window_ms"])
    kept = windows - s["run.trim_start"] - s["run.trim_end"]
    need(
        kept >= 1,
        f"trim_start ({s['run.trim_start']}) + trim_end ({s['run.trim_end']}) windows leave nothing of the "
        f"{windows} measured windows of {s['run.window_ms']} ms in a duration of {s['run.duration']} s",
    )
    total = (
        s["topology.client_machines"]
        * s["topology.instances"]
        * s["topology.threads"]
        * s["topology.virtual_clients"]
    )
    need(total <= 4096, f"{total} virtual clients is more than this runner will start (4096)")
    need(
        s["topology.system"] in ("memcached", "mq"),
        f"system must be memcached (mwproxy) or mq (mwmq over PostgreSQL), not {s['topology.system']!r}",
    )
    if s["topology.system"] == "mq":
        _validate_mq(s, need)
    _validate_hosts(s, need)


def _validate_mq(s: dict[str, Any], need) -> None:
    """The message-queue system: one database (`servers`), mwmq middlewares, mwload -P mq clients."""
    need(s["topology.servers"] == 1, "system mq has one database: servers (nsvr) must be 1")
    need(s["topology.middlewares"] >= 1, "system mq needs at least one middleware (nmw)")
    pool = s["middleware.db_pool"]
    need(
        pool is None or (isinstance(pool, int) and not isinstance(pool, bool) and 1 <= pool <= 1000),
        f"db_pool must be a number of connections in 1..1000 (or null: one per worker), not {pool!r}",
    )
    batch = s["middleware.batch"]
    need(
        isinstance(batch, int) and not isinstance(batch, bool) and 1 <= batch <= 1000, "batch must be 1..1000"
    )
    need(s["workload.receive"] in ("pop", "recv"), "receive must be pop or recv (RECV then ACK)")
    need(isinstance(s["workload.pairs"], bool), "pairs must be true or false")
    queues = s["workload.queues"]
    need(isinstance(queues, int) and not isinstance(queues, bool) and queues >= 1, "queues must be >= 1")
    need(s["workload.multiget_size"] == 1, "system mq has no multi-gets (multiget_size must be 1)")
    need(s["middleware.replication"] == 1, "system mq has no replication")
    if s["workload.pairs"]:
        need(
            s["topology.threads"] * s["topology.virtual_clients"] % 2 == 0,
            "pairs need an even number of clients per instance (threads x vcli)",
        )
    need(
        s["hosts.emulation"] == "local",
        "system mq runs on local hosts only so far (hosts: emulation: local)",
    )


ROLES = ("server", "middleware", "client")


def host_names(s: dict[str, Any]) -> dict[str, list[str]]:
    """The hosts of a point by role: one per server, middleware and client machine."""
    return {
        "server": [f"server{i}" for i in range(s["topology.servers"])],
        "middleware": [f"mw{j}" for j in range(s["topology.middlewares"])],
        "client": [f"client{k}" for k in range(s["topology.client_machines"])],
    }


def link_rates(link: Any) -> tuple[float | None, float | None]:
    """A host's link as (up, down) bits per second, None where unshaped: a rate
    (`100mbit`, both directions) or a mapping `{up: 100mbit, down: 1gbit}`
    (what the host sends, what it receives; either may be left out)."""
    from mwlab.netns import parse_rate

    if link is None:
        return None, None
    if isinstance(link, dict):
        extra = set(link) - {"up", "down"}
        if extra:
            raise ValueError(
                f"a link is a rate or {{up: RATE, down: RATE}}; unknown {', '.join(sorted(extra))}"
            )
        rates = tuple(None if link.get(k) is None else parse_rate(link[k]) for k in ("up", "down"))
    else:
        rates = (parse_rate(link),) * 2
    if any(r is not None and r <= 0 for r in rates):
        raise ValueError("a link rate must be positive")
    return rates  # type: ignore[return-value]


def _validate_hosts(s: dict[str, Any], need) -> None:
    from mwlab.netns import parse_delay

    emulation = s["hosts.emulation"]
    need(
        emulation in ("local", "netns", "ssh"),
        f"hosts emulation must be local, netns or ssh, not {emulation!r}",
    )
    shaped = [k for k in s if k.startswith("hosts.") and k.endswith(("_link", "_cpus")) and s[k] is not None]
    if s["hosts.delay"] is not None:
        shaped.append("hosts.delay")
    need(
        emulation == "netns" or not shaped,
        f"{', '.join(k.split('.', 1)[1] for k in shaped)} need emulated hosts (hosts: emulation: netns)",
    )
    for role in ROLES:
        try:
            link_rates(s[f"hosts.{role}_link"])
        except ValueError as e:
            need(False, f"{role}_link: {e}")
        cpus = s[f"hosts.{role}_cpus"]
        if cpus is not None:
            ok = (isinstance(cpus, int | float) and not isinstance(cpus, bool) and cpus > 0) or (
                isinstance(cpus, str) and re.fullmatch(r"[0-9]+([-,][0-9]+)*", cpus) is not None
            )
            need(
                ok,
                f"{role}_cpus must be a number of CPUs (a quota, e.g. 1.5) or a cpuset "
                f'(e.g. "0" or "0-1"), not {cpus!r}',
            )
    if s["hosts.delay"] is not None:
        try:
            parse_delay(s["hosts.delay"])
        except ValueError as e:
            need(False, f"delay: {e}")
    ssh = s["hosts.ssh"]
    if emulation == "ssh":
        need(
            isinstance(ssh, dict) and ssh,
            "emulation: ssh needs hosts.ssh, a mapping of host name to destination",
        )
        names = {n for ns in host_names(s).values() for n in ns}
        local = ssh.get("local_addr") if isinstance(ssh, dict) else None
        need(
            local is None or isinstance(local, str),
            "ssh: local_addr is this machine's address as the remote hosts see it (a string)",
        )
        for host, dest in (ssh or {}).items():
            if host == "local_addr":
                continue
            need(host in names, f"ssh: no host {host!r} in this topology (hosts: {', '.join(sorted(names))})")
            if isinstance(dest, dict):
                extra = set(dest) - {"destination", "port", "key", "known_hosts"}
                need(
                    not extra,
                    f"ssh: {host}: unknown keys {', '.join(sorted(extra))} "
                    "(known: destination, port, key, known_hosts)",
                )
            d = (
                dest
                if isinstance(dest, str)
                else (dest or {}).get("destination")
                if isinstance(dest, dict)
                else None
            )
            need(isinstance(d, str) and d, f"ssh: {host} needs a destination such as user@host[:port]")
    else:
        need(ssh is None, "hosts.ssh is only read with emulation: ssh")


def parse(doc: dict[str, Any], scale: str = "quick", where: str = "spec") -> Experiment:
    """An experiment from a parsed YAML document."""
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: a spec is a YAML mapping")
    doc = copy.deepcopy(doc)
    name = doc.pop("name", None)
    if not name or not isinstance(name, str):
        raise SpecError(f"{where}: the spec needs a name")
    description = str(doc.pop("description", ""))
    scales = doc.pop("scales", {}) or {}
    if not isinstance(scales, dict):
        raise SpecError(f"{where}: scales must map a scale name to overrides")
    flat = _flatten(doc, where)
    if scale not in scales and scale not in ("quick", "full"):
        raise SpecError(f"{where}: unknown scale {scale!r}; this spec has {', '.join(scales) or 'none'}")
    flat.update(_flatten(scales.get(scale) or {}, f"{where} (scale {scale})"))
    settings = dict(DEFAULTS)
    factors: dict[str, list[Any]] = {}
    together = flat.pop(TOGETHER, None) or {}
    for key, value in together.items():
        flat.pop(key, None)
        factors[key] = [_normalise(key, v) for v in value]
    for key, value in flat.items():
        if isinstance(value, list):
            if not value:
                raise SpecError(f"{where}: {key} has an empty list of levels")
            factors[key] = [_normalise(key, v) for v in value]
        else:
            settings[key] = _normalise(key, value)
    exp = Experiment(name, description, scale, settings, factors, doc, [list(together)] if together else [])
    for p in exp.points():
        _validate_point(p.settings, f"{where}, point {p.name}")
    return exp


def load(path: str | Path, scale: str = "quick") -> Experiment:
    """An experiment from a YAML file."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise SpecError(f"no such spec: {path}") from e
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {e}") from e
    exp = parse(doc, scale, str(path))
    exp.source = doc
    return exp
