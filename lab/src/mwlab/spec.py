"""Experiment specs: YAML files that declare a topology, middleware settings, a
workload and how to run it, where any setting may be a list of levels.

The run is the cross product of all lists (the *points*) times the repetitions,
in a randomised but seeded order; a spec's `points:` (a list of mappings, a
level for every factor and optionally `repetitions`) runs only the
combinations it names, each with its own repetitions — what `mwlab plan`
writes. The seed reports' abbreviations (nsvr, ncli,
icli, tcli, vcli, nmw, tmw, mgshrd, mgsize, wrkld, reps, ttime) are accepted as
aliases. Everything is validated before anything starts.

Each point's settings are a typed [`Settings`] — one model per section
(`topology`, `middleware`, `workload`, `run`, `hosts`), read as attributes
(`s.middleware.engine`) everywhere in the lab. Setting *names* (`tmw`,
`middleware.workers`, `workers`) exist only here: in specs, factor labels and
`--set KEY=VALUE`, and this module turns them into attributes.

A spec may declare named pools of memcached servers and mwproxy's route tree
over them (`pools:` and `route:`, the section `routes`); the tree is mwproxy's
own vocabulary, passed through as written and checked by mwproxy itself
(`mwlab.routes.check`), while the lab checks what is its own: how many
servers each pool has, that the topology agrees, and which declared pool
`prefill_pool:` (the prefill written to one pool, not through the route) names.
"""

from __future__ import annotations

import copy
import itertools
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)


class SpecError(ValueError):
    """A spec that cannot be run, with a message that says what to change."""


def _number(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("must be a number")
    return v


Count = Annotated[StrictInt, Field(ge=1, le=100_000)]
Number = Annotated[float, BeforeValidator(_number)]
WORKLOADS = {"write-only": "1:0", "read-only": "0:1", "writes": "1:0", "reads": "0:1"}
ROLES = ("server", "middleware", "client")


class Section(BaseModel):
    """A section of the settings: unknown keys are refused, values are checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Topology(Section):
    """Who runs where: servers, middlewares, client machines and their load."""

    system: Literal["memcached", "mq"] = "memcached"
    servers: Count = 1
    middlewares: Annotated[StrictInt, Field(ge=0, le=64)] = 0
    client_machines: Count = 1
    instances: Count = 1
    threads: Count = 2
    virtual_clients: Count = 1
    client_targets: Literal["spread", "all"] = "spread"

    @property
    def total_clients(self) -> int:
        """N: virtual clients over all client machines, instances and threads."""
        return self.client_machines * self.instances * self.threads * self.virtual_clients


def _multiget(v: Any) -> Any:
    return ("sharded" if v else "non-sharded") if isinstance(v, bool) else v


class Middleware(Section):
    """mwproxy's or mwmq's settings."""

    engine: Literal["pool", "async"] = "pool"
    threads: Annotated[StrictInt, Field(ge=0, le=256)] = 0
    workers: Count = 8
    net_threads: Count = 1
    # The seed reports' levels none, half and all are resolved per point.
    replication: Count | Literal["none", "half", "all"] = 1
    multiget: Annotated[Literal["sharded", "non-sharded"], BeforeValidator(_multiget)] = "sharded"
    queue_capacity: Count = 1024
    trace_every: Annotated[StrictInt, Field(ge=0, le=1 << 30)] = 100
    db_pool: Annotated[StrictInt, Field(ge=1, le=1000)] | None = None
    batch: Annotated[StrictInt, Field(ge=1, le=1000)] = 1
    # TLS between the clients and mwproxy, between mwproxy and memcached
    # (-Z), and clients that log in (memcached's -Y, mwproxy's --auth-file).
    tls: StrictBool = False
    server_tls: StrictBool = False
    auth: StrictBool = False


def _ratio(v: Any) -> Any:
    v = WORKLOADS.get(str(v), v)
    parts = str(v).split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or sum(map(int, parts)) == 0:
        raise ValueError("must be SETS:GETS such as 1:10 (or write-only/read-only)")
    return str(v)


def _key_prefix(v: Any) -> Any:
    if not isinstance(v, str) or len(v) > 200 or any(c.isspace() or ord(c) < 32 for c in v):
        raise ValueError("must be text of at most 200 characters without spaces or control characters")
    return v


class Workload(Section):
    """What the clients send."""

    ratio: Annotated[str, BeforeValidator(_ratio)] = "1:10"
    # mwload's keys are this prefix and a zero-padded number (memcached only):
    # what a route's prefix selector sees.
    key_prefix: Annotated[str, BeforeValidator(_key_prefix)] = "key:"
    keys: Count = 10000
    value_size: Annotated[StrictInt, Field(ge=1, le=1 << 20)] = 128
    multiget_size: Count = 1
    key_pattern: Literal["uniform", "sequential", "gaussian", "zipf"] = "uniform"
    think_time_us: Annotated[StrictInt, Field(ge=0)] = 0
    rate: Annotated[Number, Field(gt=0)] | None = None
    prefill: StrictBool = True
    receive: Literal["pop", "recv", "stream"] = "pop"
    pairs: StrictBool = True
    queues: Annotated[StrictInt, Field(ge=1)] = 1


class RunSettings(Section):
    """How long, how often, with which client."""

    duration: Annotated[Number, Field(gt=0)] = 10.0
    warmup: Annotated[Number, Field(ge=0)] = 2.0
    cooldown: Annotated[Number, Field(ge=0)] = 1.0
    trim_start: Annotated[StrictInt, Field(ge=0)] = 0
    trim_end: Annotated[StrictInt, Field(ge=0)] = 0
    repetitions: Count = 3
    seed: StrictInt = 1
    window_ms: Annotated[StrictInt, Field(ge=100)] = 1000
    client: Literal["mwload", "memtier"] = "mwload"
    # Measure the reference point (mwlab.reference) at the start and end of
    # `mwlab run`: a few seconds each, so that results can be compared across time.
    reference: bool = True

    @property
    def seconds(self) -> float:
        """Warm-up, measured time and cool-down."""
        return self.warmup + self.duration + self.cooldown


def _cpus(v: Any) -> Any:
    if v is None:
        return v
    number = isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    if number or (isinstance(v, str) and re.fullmatch(r"[0-9]+([-,][0-9]+)*", v)):
        return v
    raise ValueError('must be a number of CPUs (a quota, e.g. 1.5) or a cpuset (e.g. "0" or "0-1")')


Cpus = Annotated[float | str | None, BeforeValidator(_cpus)]


class Hosts(Section):
    """Where the processes run: this machine, emulated hosts or real ones."""

    emulation: Literal["local", "netns", "ssh"] = "local"
    server_link: str | dict[str, Any] | None = None
    middleware_link: str | dict[str, Any] | None = None
    client_link: str | dict[str, Any] | None = None
    server_cpus: Cpus = None
    middleware_cpus: Cpus = None
    client_cpus: Cpus = None
    delay: str | float | None = None
    ssh: dict[str, Any] | None = None

    @field_validator("server_link", "middleware_link", "client_link")
    @classmethod
    def _link(cls, v: Any) -> Any:
        link_rates(v)
        return v

    @field_validator("delay")
    @classmethod
    def _delay(cls, v: Any) -> Any:
        from mwlab.netns import parse_delay

        if v is not None:
            parse_delay(v)
        return v

    def link(self, role: str) -> Any:
        """The link of a role's hosts (`server`, `middleware`, `client`)."""
        return {"server": self.server_link, "middleware": self.middleware_link, "client": self.client_link}[
            role
        ]

    def cpus(self, role: str) -> Any:
        """The CPUs of a role's hosts."""
        return {"server": self.server_cpus, "middleware": self.middleware_cpus, "client": self.client_cpus}[
            role
        ]

    def shaped(self) -> list[str]:
        """The settings that need emulated hosts."""
        names = [f"{r}_link" for r in ROLES if self.link(r) is not None]
        names += [f"{r}_cpus" for r in ROLES if self.cpus(r) is not None]
        return names + (["delay"] if self.delay is not None else [])


class Database(Section):
    """The message-queue system's PostgreSQL: alone, or with a synchronous
    standby (`scripts/pg-ha.sh`: streaming replication, `synchronous_commit =
    on`, every commit waits for the standby's flush)."""

    standby: Annotated[StrictInt, Field(ge=0, le=1)] = 0


POOL_NAME = re.compile(r"[A-Za-z0-9_-]+")
MAX_POOL_SERVERS = 64


def _pools(v: Any) -> Any:
    """Pools as a spec names them: each a mapping with `servers`, the number
    of memcached servers the runner starts for it, and any other setting of
    mwproxy's `[pools.<name>]` (hash, key_hash, replication, ...), which
    mwproxy checks."""
    if v is None:
        return v
    if not isinstance(v, dict) or not v:
        raise ValueError("pools maps each pool's name to {servers: N, ...}")
    for name, pool in v.items():
        if not isinstance(name, str) or not POOL_NAME.fullmatch(name):
            raise ValueError(f"pool {name!r}: a pool's name is letters, digits, - and _")
        if not isinstance(pool, dict) or "servers" not in pool:
            raise ValueError(f"pool {name}: a mapping with servers, the number of memcached servers to start")
        n = pool["servers"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_POOL_SERVERS:
            raise ValueError(
                f"pool {name}: servers is how many memcached servers the lab starts for it "
                f"(1 to {MAX_POOL_SERVERS}), not {n!r}"
            )
    return v


def _route(v: Any) -> Any:
    if v is None or isinstance(v, str | dict):
        return v
    raise ValueError("a route is a pool's name or a mapping with a type (mwproxy's [route])")


class Routes(Section):
    """Named pools and mwproxy's route tree over them (docs/mwproxy.md,
    "Routes"). The runner starts each pool's servers, in the order the pools
    are named, and gives mwproxy a configuration file with them."""

    pools: Annotated[dict[str, dict[str, Any]] | None, BeforeValidator(_pools)] = None
    route: Annotated[str | dict[str, Any] | None, BeforeValidator(_route)] = None
    # The pool the prefill writes to directly, not through the route (a
    # warm-up's warm pool: through the route, the prefill fills the cold one).
    prefill_pool: StrictStr | None = None

    @property
    def servers(self) -> int:
        """Memcached servers of every pool."""
        return sum(p["servers"] for p in (self.pools or {}).values())

    def pool_of_servers(self) -> list[str]:
        """The pool of each server, by the server's number (mc0, mc1, ...)."""
        return [name for name, p in (self.pools or {}).items() for _ in range(p["servers"])]


class Settings(BaseModel):
    """Every setting of one point, by section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topology: Topology = Topology()
    middleware: Middleware = Middleware()
    workload: Workload = Workload()
    run: RunSettings = RunSettings()
    hosts: Hosts = Hosts()
    database: Database = Database()
    routes: Routes = Routes()

    @property
    def total_clients(self) -> int:
        """N: virtual clients over all client machines, instances and threads."""
        return self.topology.total_clients

    @property
    def mq(self) -> bool:
        """The message-queue system (mwmq over PostgreSQL)."""
        return self.topology.system == "mq"

    @property
    def db_pool(self) -> int:
        """Database connections per mwmq (one per worker unless set)."""
        return self.middleware.db_pool or self.middleware.workers

    def check(self) -> None:
        """The rules between settings (each setting on its own is checked by
        its section); raises ValueError saying what to change."""
        t, m, w, r, h = self.topology, self.middleware, self.workload, self.run, self.hosts
        need = _need
        need(
            isinstance(m.replication, int) and m.replication <= t.servers,
            f"replication {m.replication} needs at least as many servers (nsvr={t.servers})",
        )
        windows = int(r.duration * 1000 // r.window_ms)
        need(
            windows - r.trim_start - r.trim_end >= 1,
            f"trim_start ({r.trim_start}) + trim_end ({r.trim_end}) windows leave nothing of the "
            f"{windows} measured windows of {r.window_ms} ms in a duration of {r.duration} s",
        )
        n = self.total_clients
        need(n <= 4096, f"{n} virtual clients is more than this runner will start (4096)")
        if any(v is not None for v in self.routes.model_dump().values()):
            self._check_routes()
        if self.mq:
            need(t.servers == 1, "system mq has one database: servers (nsvr) must be 1")
            need(t.middlewares >= 1, "system mq needs at least one middleware (nmw)")
            need(w.multiget_size == 1, "system mq has no multi-gets (multiget_size must be 1)")
            need(m.replication == 1, "system mq has no replication")
            need(
                not w.pairs or t.threads * t.virtual_clients % 2 == 0,
                "pairs need an even number of clients per instance (threads x vcli)",
            )
            need(
                h.emulation != "ssh" or "server0" not in (h.ssh or {}),
                "system mq starts PostgreSQL on this machine: "
                "leave server0 (the database host) out of hosts.ssh",
            )
            need(not (m.tls or m.server_tls or m.auth), "system mq has no TLS or logins yet")
            need(
                self.database.standby == 0 or h.emulation == "local",
                "database.standby: the standby runs on this machine only (hosts: emulation: local)",
            )
        else:
            need(self.database.standby == 0, "database.standby is a setting of system mq (its PostgreSQL)")
        if m.tls or m.server_tls or m.auth:
            need(h.emulation != "ssh", "TLS and logins run on local or emulated hosts (not over ssh yet)")
        secured = [k for k in ("tls", "server_tls", "auth") if getattr(m, k)]
        need(t.middlewares >= 1 or not secured, f"{', '.join(secured)}: the middleware's; nmw must be >= 1")
        shaped = h.shaped()
        need(
            h.emulation == "netns" or not shaped,
            f"{', '.join(shaped)} need emulated hosts (hosts: emulation: netns)",
        )
        if h.emulation == "ssh":
            self._check_ssh()
        else:
            need(h.ssh is None, "hosts.ssh is only read with emulation: ssh")

    def _check_routes(self) -> None:
        r, t = self.routes, self.topology
        _need(r.pools is not None, "a route names pools: declare them under pools ({name: {servers: N}})")
        _need(r.route is not None, "pools need a route over them (route: a pool's name or mwproxy's tree)")
        _need(not self.mq, "pools and a route are mwproxy's: not with system mq")
        _need(t.middlewares >= 1, "pools and a route are mwproxy's: nmw must be >= 1")
        _need(
            self.hosts.emulation != "ssh",
            "pools and a route run on local or emulated hosts (not over ssh yet)",
        )
        _need(
            t.servers == r.servers,
            f"topology.servers (nsvr) is {t.servers} but the pools have {r.servers} servers in all: "
            "with pools, leave nsvr out (it is their sum)",
        )
        _need(
            self.middleware.replication == 1,
            "with pools, replication is each pool's own (pools: {NAME: {servers: 3, replication: 2}})",
        )
        pool = r.prefill_pool
        _need(
            pool is None or pool in (r.pools or {}),
            f"prefill_pool {pool!r} is not a pool of the spec (the pools are {', '.join(r.pools or {})})",
        )
        _need(
            pool is None or self.workload.prefill, "prefill_pool says where the prefill goes: prefill is off"
        )

    def _check_ssh(self) -> None:
        ssh = self.hosts.ssh
        _need(bool(ssh), "emulation: ssh needs hosts.ssh, a mapping of host name to destination")
        assert ssh is not None
        names = {n for ns in host_names(self).values() for n in ns}
        local = ssh.get("local_addr")
        _need(
            local is None or isinstance(local, str),
            "ssh: local_addr is this machine's address as the remote hosts see it (a string)",
        )
        for host, dest in ssh.items():
            if host == "local_addr":
                continue
            _need(
                host in names, f"ssh: no host {host!r} in this topology (hosts: {', '.join(sorted(names))})"
            )
            if isinstance(dest, dict):
                extra = set(dest) - {"destination", "port", "key", "known_hosts"}
                _need(
                    not extra,
                    f"ssh: {host}: unknown keys {', '.join(sorted(extra))} "
                    "(known: destination, port, key, known_hosts)",
                )
                dest = dest.get("destination")
            _need(
                isinstance(dest, str) and bool(dest),
                f"ssh: {host} needs a destination such as user@host[:port]",
            )


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


# ---- names of settings: dotted keys, short keys and the seed reports' aliases ----

SECTIONS: dict[str, type[Section]] = {
    "topology": Topology,
    "middleware": Middleware,
    "workload": Workload,
    "run": RunSettings,
    "hosts": Hosts,
    "database": Database,
    "routes": Routes,
}
KEYS = [f"{s}.{f}" for s, model in SECTIONS.items() for f in model.model_fields]

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
    "standby": "database.standby",
}


def canonical(key: str) -> str:
    """The dotted name of a setting given by its dotted name, its name within
    its section (where unique) or a seed alias."""
    if key in ALIASES:
        return ALIASES[key]
    if key in KEYS:
        return key
    short = [k for k in KEYS if k.split(".", 1)[1] == key]
    if len(short) == 1:
        return short[0]
    if short:
        raise SpecError(
            f"setting {key!r} is in more than one section: say which ({', '.join(sorted(short))})"
        )
    known = sorted(set(ALIASES) | {k.split(".", 1)[1] for k in KEYS})
    raise SpecError(f"unknown setting {key!r}; known settings: {', '.join(known)}")


def column_name(key: str) -> str:
    """A setting's name in tables and factor labels: its seed alias, else its
    name within its section."""
    for alias, full in ALIASES.items():
        if full == key:
            return alias
    return key.split(".", 1)[1]


def factor_columns(factors: dict[str, Any]) -> dict[str, Any]:
    """Factor levels under their column names."""
    return {column_name(k): v for k, v in factors.items()}


def nest(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Dotted keys into sections."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        section, name = canonical(key).split(".", 1)
        out.setdefault(section, {})[name] = value
    return out


def flatten(settings: Settings) -> dict[str, Any]:
    """Settings as dotted keys (the spec's own view)."""
    return {f"{s}.{k}": v for s in SECTIONS for k, v in getattr(settings, s).model_dump().items()}


def build(flat: dict[str, Any], where: str = "settings") -> Settings:
    """Settings from dotted keys, each section checked (not the rules between
    them: [`Settings.check`])."""
    try:
        return Settings.model_validate(nest(flat))
    except ValidationError as e:
        raise SpecError(explain(e, where)) from None


def with_values(settings: Settings, changes: dict[str, Any], where: str = "settings") -> Settings:
    """`settings` with some settings changed (any name [`canonical`] takes)."""
    flat = flatten(settings)
    flat.update({canonical(k): v for k, v in changes.items()})
    return build(flat, where)


def explain(e: ValidationError, where: str) -> str:
    """A pydantic error as a sentence a user can act on: the setting's path,
    what is wrong, and for an unknown key the names that are known."""
    lines = []
    for err in e.errors():
        # Past the section and the setting, a path names union branches and list items.
        loc = [str(x) for x in err["loc"]]
        path = ".".join(loc[:2])
        if err["type"] == "extra_forbidden":
            section = loc[0] if len(loc) > 1 else ""
            known = list(SECTIONS[section].model_fields) if section in SECTIONS else list(SECTIONS)
            what = f"in {section}" if section else "section"
            lines.append(f"unknown setting {loc[min(1, len(loc) - 1)]!r} {what}; known: {', '.join(known)}")
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            alias = column_name(path) if path in KEYS else ""
            named = f"{path} ({alias})" if alias in ALIASES else path
            lines.append(f"{named}: {msg} (got {err.get('input')!r})")
    return f"{where}: " + "; ".join(dict.fromkeys(lines))


def stored_settings(d: dict[str, Any]) -> Settings:
    """Settings as a results directory stores them (by section; results of
    earlier versions: dotted keys)."""
    if any("." in k for k in d):
        return build(d, "stored settings")
    try:
        return Settings.model_validate(d)
    except ValidationError as e:
        raise SpecError(explain(e, "stored settings")) from None


class ExperimentInfo(BaseModel):
    """What a result directory's experiment.json says."""

    model_config = ConfigDict(extra="ignore")

    name: str
    description: str = ""
    scale: str = "quick"
    settings: Settings = Settings()
    factors: dict[str, list[Any]] = {}
    together: list[list[str]] = []
    # The spec's `points:` where it chose some combinations only.
    points: list[dict[str, Any]] | None = None

    def experiment(self) -> Experiment:
        """The experiment again (every combination of its factors)."""
        return Experiment(
            self.name, self.description, self.scale, self.settings, self.factors, {}, self.together
        )

    @field_validator("settings", mode="before")
    @classmethod
    def _stored(cls, v: Any) -> Any:
        return stored_settings(v) if isinstance(v, dict) else v

    @property
    def columns(self) -> list[str]:
        """The factors' column names in summary.csv and aggregate.csv."""
        return list(factor_columns(self.factors))


# ---- points and runs ----


@dataclass(frozen=True)
class Point:
    """One combination of factor levels: every setting resolved."""

    name: str
    settings: Settings
    factors: dict[str, Any]

    def get(self, key: str) -> Any:
        """A setting by any name [`canonical`] takes."""
        section, name = canonical(key).split(".", 1)
        return getattr(getattr(self.settings, section), name)

    @property
    def total_clients(self) -> int:
        """N: virtual clients over all client machines, instances and threads."""
        return self.settings.total_clients


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
    settings: Settings
    factors: dict[str, list[Any]]
    source: dict[str, Any] = field(default_factory=dict)
    # Groups of factors whose levels go together rather than crossed.
    together: list[list[str]] = field(default_factory=list)
    # The spec's `points:` — the combinations to run, each a level per factor
    # and optionally its own repetitions; None runs every combination.
    selection: list[dict[str, Any]] | None = None

    def combinations(self) -> list[dict[str, Any]]:
        """Every combination of the factors' levels (levels taken together
        count as one factor), in the spec's order."""
        grouped = {n for g in self.together for n in g}
        alone = [n for n in self.factors if n not in grouped]
        # Each axis: a list of {setting: level} choices.
        axes = [[{n: v} for v in self.factors[n]] for n in alone]
        for g in self.together:
            axes.append([{n: self.factors[n][i] for n in g} for i in range(len(self.factors[g[0]]))])
        order = list(self.factors)
        out = []
        for combo in itertools.product(*axes):
            merged = {k: v for part in combo for k, v in part.items()}
            out.append({n: merged[n] for n in order})
        return out

    def all_points(self) -> list[Point]:
        """Every combination, each with its settings (whatever `points:` chose)."""
        return [self._point(chosen) for chosen in self.combinations()]

    def points(self) -> list[Point]:
        """The points to run: every combination, or those `points:` names,
        each with its settings (and the repetitions `points:` gave it)."""
        if self.selection is None:
            return self.all_points()
        out = []
        for chosen in self.combinations():
            for pick in self.selection:
                if all(pick[k] == v for k, v in chosen.items()):
                    out.append(self._point(chosen, pick.get(REPS)))
        return out

    def _point(self, chosen: dict[str, Any], reps: int | None = None) -> Point:
        flat = {**flatten(self.settings), **chosen}
        if reps is not None:
            flat[REPS] = reps
        flat["middleware.replication"] = replication_copies(
            flat["middleware.replication"], flat["topology.servers"]
        )
        label = ",".join(f"{column_name(n)}={_label(v)}" for n, v in chosen.items()) or "default"
        return Point(label, build(flat, f"point {label}"), chosen)

    def runs(self) -> list[Run]:
        """Every point x repetition, shuffled with the run seed."""
        runs = [Run(p, r) for p in self.points() for r in range(1, p.settings.run.repetitions + 1)]
        random.Random(self.settings.run.seed).shuffle(runs)
        return runs

    def info(self) -> dict[str, Any]:
        """What experiment.json records."""
        out = {
            "name": self.name,
            "description": self.description,
            "scale": self.scale,
            "settings": self.settings.model_dump(mode="json"),
            "factors": self.factors,
        }
        if self.together:
            out["together"] = self.together
        if self.selection is not None:
            out["points"] = self.selection
        return out


# Seconds each run spends besides its measured time: starting and stopping
# processes, creating emulated hosts, sampling (measured on this machine).
RUN_OVERHEAD_S = 3


def run_seconds(settings: Settings) -> float:
    """About how long one run of a point with these settings takes."""
    return settings.run.seconds + RUN_OVERHEAD_S


def replication_copies(value: Any, servers: int) -> Any:
    """The seed reports' replication levels: none (1), half (ceil(n/2)), all (n)."""
    return {"none": 1, "half": (servers + 1) // 2, "all": servers}.get(value, value)


def _label(v: Any) -> str:
    return str(v).replace("/", "-").replace(" ", "")


def host_names(s: Settings) -> dict[str, list[str]]:
    """The hosts of a point by role: one per server, middleware and client machine."""
    t = s.topology
    return {
        "server": [f"server{i}" for i in range(t.servers)],
        "middleware": [f"mw{j}" for j in range(t.middlewares)],
        "client": [f"client{k}" for k in range(t.client_machines)],
    }


def link_rates(link: Any) -> tuple[float | None, float | None]:
    """A host's link as (up, down) bits per second, None where unshaped: a rate
    (`100mbit`, both directions) or a mapping `{up: 100mbit, down: 1gbit,
    delay: 2ms, jitter: 0.5ms}` (what the host sends, what it receives, the
    one-way delay each way and its jitter; any may be left out)."""
    from mwlab.netns import parse_rate

    if link is None:
        return None, None
    if isinstance(link, dict):
        extra = set(link) - {"up", "down", "delay", "jitter"}
        if extra:
            raise ValueError(
                "a link is a rate or {up: RATE, down: RATE, delay: TIME, jitter: TIME}; "
                f"unknown {', '.join(sorted(extra))}"
            )
        link_delay(link)
        rates = tuple(None if link.get(k) is None else parse_rate(link[k]) for k in ("up", "down"))
    else:
        rates = (parse_rate(link),) * 2
    if any(r is not None and r <= 0 for r in rates):
        raise ValueError("a link rate must be positive")
    return rates  # type: ignore[return-value]


def link_delay(link: Any) -> tuple[float, float]:
    """A host's link's one-way delay and jitter in seconds (0 where not given)."""
    from mwlab.netns import parse_delay

    if not isinstance(link, dict):
        return 0.0, 0.0
    d, j = (parse_delay(link[k]) if link.get(k) is not None else 0.0 for k in ("delay", "jitter"))
    if j > d:
        raise ValueError(f"a link's jitter ({j * 1e3:g} ms) cannot exceed its delay ({d * 1e3:g} ms)")
    return d, j


# ---- reading specs ----

# Factors whose levels go together (the i-th level of each at once), e.g. the
# seed's scale-up: workers 1, 2, 4, 8 with 10, 20, 40, 80 clients.
TOGETHER = "__together__"


def _flatten(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """Section dicts and flat/aliased keys into one dict of canonical keys."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise SpecError(f"{where}: section {key!r} must be a mapping")
            for sub, v in value.items():
                name = f"{key}.{sub}"
                if name not in KEYS:
                    known = ", ".join(SECTIONS[key].model_fields)
                    raise SpecError(f"{where}: unknown setting {sub!r} in {key}; known: {known}")
                flat[name] = v
        elif key == "factors":
            if not isinstance(value, dict):
                raise SpecError(f"{where}: factors must be a mapping of setting to levels")
            for sub, v in value.items():
                if sub == "together":
                    flat[TOGETHER] = _together(v, where)
                else:
                    flat[_canonical(sub, where)] = v
        else:
            flat[_canonical(key, where)] = value
    return flat


def _canonical(key: str, where: str) -> str:
    try:
        return canonical(key)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def _together(value: Any, where: str) -> dict[str, list[Any]]:
    if not isinstance(value, dict) or len(value) < 2:
        raise SpecError(f"{where}: factors: together maps two or more settings to lists of levels")
    out = {}
    for sub, levels in value.items():
        if not isinstance(levels, list) or not levels:
            raise SpecError(f"{where}: factors: together: {sub} needs a list of levels")
        out[_canonical(sub, where)] = levels
    lengths = {len(v) for v in out.values()}
    if len(lengths) != 1:
        raise SpecError(
            f"{where}: factors: together: every setting needs as many levels "
            f"({', '.join(f'{column_name(k)}: {len(v)}' for k, v in out.items())})"
        )
    return out


def _normalise(key: str, value: Any) -> Any:
    """A level as the settings store it (so factor labels and columns show it so)."""
    if key == "workload.ratio":
        return WORKLOADS.get(str(value), value)
    if key == "middleware.multiget":
        return _multiget(value)
    return value


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
    picks = doc.pop("points", None)
    if not isinstance(scales, dict):
        raise SpecError(f"{where}: scales must map a scale name to overrides")
    flat = _flatten(doc, where)
    if scale not in scales and scale not in ("quick", "full"):
        raise SpecError(f"{where}: unknown scale {scale!r}; this spec has {', '.join(scales) or 'none'}")
    flat.update(_flatten(scales.get(scale) or {}, f"{where} (scale {scale})"))
    fixed: dict[str, Any] = {}
    factors: dict[str, list[Any]] = {}
    together = flat.pop(TOGETHER, None) or {}
    for key, value in together.items():
        flat.pop(key, None)
        factors[key] = [_normalise(key, v) for v in value]
    for key in ("routes.pools", "routes.route"):
        if isinstance(flat.get(key), list):
            raise SpecError(
                f"{where}: {key.split('.')[1]} is one per spec, not a list of levels "
                "(to compare routes, write a spec for each)"
            )
    for key, value in flat.items():
        if isinstance(value, list):
            if not value:
                raise SpecError(f"{where}: {key} has an empty list of levels")
            factors[key] = [_normalise(key, v) for v in value]
        else:
            fixed[key] = _normalise(key, value)
    _pool_servers(fixed, factors)
    settings = build(fixed, where)
    exp = Experiment(name, description, scale, settings, factors, doc, [list(together)] if together else [])
    if picks is not None:
        exp.selection = _selection(picks, exp, where)
    try:
        points = exp.points()
    except SpecError as e:
        raise SpecError(f"{where}, {e}") from None
    for p in points:
        try:
            p.settings.check()
        except ValueError as e:
            raise SpecError(f"{where}, point {p.name}: {e}") from None
    return exp


def _pool_servers(fixed: dict[str, Any], factors: dict[str, list[Any]]) -> None:
    """With pools and no number of servers given, the servers are the pools'."""
    pools = fixed.get("routes.pools")
    if "topology.servers" in fixed or "topology.servers" in factors or not isinstance(pools, dict):
        return
    counts = [p.get("servers") if isinstance(p, dict) else None for p in pools.values()]
    if counts and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts):
        fixed["topology.servers"] = sum(counts)


REPS = "run.repetitions"


def _selection(picks: Any, exp: Experiment, where: str) -> list[dict[str, Any]]:
    """The spec's `points:` checked against its factors: each entry names a
    level of every factor (by any name a setting takes), optionally
    `repetitions`, and is one of the combinations, named once."""
    if not isinstance(picks, list) or not picks:
        raise SpecError(
            f"{where}: points is a list of points, each a mapping of every factor to one of its levels"
        )
    names = ", ".join(column_name(k) for k in exp.factors)
    combos = exp.combinations()
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(picks):
        here = f"{where}: points[{i}]"
        if not isinstance(entry, dict):
            raise SpecError(f"{here}: a mapping of every factor ({names}) to a level")
        pick: dict[str, Any] = {}
        for key, value in entry.items():
            k = _canonical(str(key), here)
            if k == REPS:
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise SpecError(f"{here}: repetitions must be a whole number of at least 1")
            elif k not in exp.factors:
                raise SpecError(
                    f"{here}: {key} is not a factor of this spec (its factors: {names or 'none'})"
                )
            else:
                value = _normalise(k, value)
                if value not in exp.factors[k]:
                    levels = ", ".join(map(_label, exp.factors[k]))
                    raise SpecError(f"{here}: {key}={_label(value)} is not one of its levels ({levels})")
            pick[k] = value
        missing = [column_name(k) for k in exp.factors if k not in pick]
        if missing:
            raise SpecError(f"{here}: give a level for every factor; missing {', '.join(missing)}")
        chosen = {k: pick[k] for k in exp.factors}
        if chosen not in combos:
            raise SpecError(f"{here}: not a combination of the spec (factors taken together go together)")
        if any({k: o[k] for k in exp.factors} == chosen for o in out):
            raise SpecError(f"{here}: named twice")
        out.append(pick)
    return out


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
