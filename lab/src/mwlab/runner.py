"""The runner: for each run of an experiment, start memcached servers,
mwproxy middlewares and mwload clients (or, with `system: mq`, a throwaway
PostgreSQL, mwmq middlewares and `mwload -P mq` clients) — on loopback, on emulated hosts
(one network namespace per host, shaped links, CPU quotas; `netns.py`), or on
real hosts over SSH (`ssh.py`) — let the clients run, stop everything, and
keep every result file under

    results/<experiment>/<timestamp>/<point>/rep-<r>/
        mw0/ (windows.jsonl, summary.json, trace.csv)   cl0/ cl1/ ...
        resources.csv   cpu.csv   links.csv   logs/   run.json

and, around them all (`reference_around`), the reference point measured at
the start and end of the experiment (`mwlab.reference`: reference.csv).

A failed run is recorded (run.json says why) and the experiment goes on;
`--resume` skips the runs that already finished.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mwlab import drift, freshness, reference, routes
from mwlab.procs import (
    LabError,
    PgHa,
    Postgres,
    ProcessGroup,
    ResourceSampler,
    binary,
    free_port,
    memcached_cmd,
    started_mark,
    started_since,
    usable_cores,
)
from mwlab.relay import Relays, path_delay, ping_times
from mwlab.spec import Experiment, Run, Settings, host_names, run_seconds

Progress = Callable[[int, int, str, float], None]


def run_dir(out: Path, run: Run) -> Path:
    return out / run.point.name / f"rep-{run.rep}"


class Local:
    """Every host is this machine, on loopback."""

    def addr(self, host: str) -> str:
        return "127.0.0.1"

    def start(self, g: ProcessGroup, name: str, host: str, cmd: list[str], port: int | None = None):
        return g.start(name, cmd, port)

    def describe(self) -> dict[str, Any]:
        return {}


class Emulated:
    """Every host in its own network namespace (`netns.Emulation`)."""

    def __init__(self, emulation):
        self.emu = emulation

    def addr(self, host: str) -> str:
        return self.emu.addr(host)

    def start(self, g: ProcessGroup, name: str, host: str, cmd: list[str], port: int | None = None):
        return g.start(name, self.emu.wrap(host, cmd), port, host=self.emu.addr(host))

    def describe(self) -> dict[str, Any]:
        return {
            name: {
                "addr": h.addr,
                "netns": h.netns,
                "up_bps": h.spec.up_bps,
                "down_bps": h.spec.down_bps,
                "cpus": h.spec.cpus,
                "delay_s": h.spec.delay_s,
            }
            for name, h in self.emu.hosts.items()
        }


def host_delays(s: Settings) -> dict[str, tuple[float, float]]:
    """Each emulated host's link's one-way delay and jitter (seconds): its
    role's `delay`/`jitter`, else `hosts.delay`; hosts without one left out."""
    from mwlab.netns import parse_delay
    from mwlab.spec import link_delay

    if s.hosts.emulation != "netns":
        return {}
    every = (parse_delay(s.hosts.delay), 0.0) if s.hosts.delay else (0.0, 0.0)
    out = {}
    for role, names in host_names(s).items():
        d = link_delay(s.hosts.link(role))
        d = d if d[0] else every
        for name in names:
            if d[0]:
                out[name] = d
    return out


def host_specs(s: Settings, netem: bool = True):
    """The emulated hosts of a point with their links and CPUs (and, with
    `netem`, their delays; without, the relays add them)."""
    from mwlab.netns import HostSpec
    from mwlab.spec import link_rates

    delays = host_delays(s) if netem else {}
    specs = []
    for role, names in host_names(s).items():
        up, down = link_rates(s.hosts.link(role))
        for name in names:
            d, j = delays.get(name, (None, None))
            specs.append(HostSpec(name, up, down, s.hosts.cpus(role), d or None, j or None))
    return specs


@dataclass(frozen=True)
class Secrets:
    """A run's throwaway CA, the certificate it signed for every host's
    address, and the login of the clients (`middleware.tls`, `server_tls`,
    `auth`)."""

    ca: Path
    cert: Path
    key: Path
    users: Path
    login: str

    @staticmethod
    def make(out: Path, addrs: list[str]) -> Secrets:
        import secrets

        import trustme

        out.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        leaf = ca.issue_cert(*sorted({*addrs, "127.0.0.1"}), "localhost")
        paths = {name: out / f"{name}.pem" for name in ("ca", "cert", "key")}
        ca.cert_pem.write_to_path(str(paths["ca"]))
        leaf.cert_chain_pems[0].write_to_path(str(paths["cert"]))
        leaf.private_key_pem.write_to_path(str(paths["key"]))
        login = f"mwlab:{secrets.token_hex(12)}"
        users = out / "users"
        users.write_text(login + "\n")
        users.chmod(0o600)
        return Secrets(paths["ca"], paths["cert"], paths["key"], users, login)

    def memcached_args(self) -> list[str]:
        """memcached speaking only TLS (-Z)."""
        return ["-Z", "-o", f"ssl_chain_cert={self.cert},ssl_key={self.key}"]

    def proxy_args(self, m: Any) -> list[str]:
        """mwproxy's flags for `m` (the middleware section)."""
        args = ["--tls-cert", str(self.cert), "--tls-key", str(self.key)] if m.tls else []
        args += ["--auth-file", str(self.users)] if m.auth else []
        return args + (["--server-tls", "--server-tls-ca", str(self.ca)] if m.server_tls else [])

    def client_args(self, m: Any) -> list[str]:
        """mwload's flags for `m` (the middleware section)."""
        args = ["--tls", "--tls-ca", str(self.ca)] if m.tls else []
        return args + (["--auth", self.login] if m.auth else [])


def _engine_args(s: Settings, pool_only: list[str]) -> list[str]:
    """The engine and the flags it reads: the async engine's `--threads`, or
    the pool engine's workers and `pool_only` (a middleware warns about a
    flag its engine ignores)."""
    m = s.middleware
    if m.engine == "async":
        return ["--engine", "async", "--threads", str(m.threads)]
    return ["--engine", m.engine, "-t", str(m.workers), *pool_only, "--queue-capacity", str(m.queue_capacity)]


def _mwproxy_cmd(
    s: Settings,
    index: int,
    listen: str,
    servers: list[str],
    out: Path,
    config: Path | None = None,
    name: str | None = None,
) -> list[str]:
    """mwproxy in front of `servers`: one pool given by flags, or, with a
    `config` file (the spec's pools and route, `routes.config_text`), that;
    its files in `out/NAME` (`mw<index>` unless named)."""
    name = name or f"mw{index}"
    if config is not None:
        backends = ["-c", str(config)]
    else:
        backends = ["-m", *servers, "-r", str(s.middleware.replication), "--multiget", s.middleware.multiget]
    return [
        str(binary("mwproxy")),
        "--listen",
        listen,
        *backends,
        *_engine_args(s, ["--net-threads", str(s.middleware.net_threads)]),
        "--out",
        str(out / name),
        "--instance",
        name,
        "--trace-every",
        str(s.middleware.trace_every),
        "--window-ms",
        str(s.run.window_ms),
        "--log",
        "warn",
    ]


def _mwmq_cmd(s: Settings, index: int, listen: str, db: str, out: Path) -> list[str]:
    pool = s.db_pool
    # Beyond loopback (emulated hosts: a network inside this machine; SSH
    # hosts: the lab's own) the clients have no logins yet: mwmq is told so,
    # and says so loudly in its log.
    beyond = [] if listen.startswith("127.") else ["--insecure-no-auth"]
    return [
        str(binary("mwmq")),
        "--listen",
        listen,
        "--db",
        db,
        *_engine_args(s, []),
        "--db-pool",
        str(pool),
        "--batch",
        str(s.middleware.batch),
        "--out",
        str(out / f"mw{index}"),
        "--instance",
        f"mw{index}",
        "--trace-every",
        str(s.middleware.trace_every),
        "--window-ms",
        str(s.run.window_ms),
        "--log",
        "warn",
        *beyond,
    ]


def _mq_args(s: Settings, index: int) -> list[str]:
    """mwload's message-queue options for client instance `index`."""
    args = [
        "-P",
        "mq",
        "--receive",
        s.workload.receive,
        "--queues",
        str(s.workload.queues),
        "--name-prefix",
        f"cl{index}-",
    ]
    return args + (["--pairs"] if s.workload.pairs else [])


def _target_args(endpoints: list[str], all_targets: bool, index: int) -> list[str]:
    if all_targets and len(endpoints) > 1:
        return ["--servers", ",".join(endpoints)]
    host, port = endpoints[index % len(endpoints)].rsplit(":", 1)
    return ["-s", host, "-p", port]


def _mwload_cmd(s: Settings, index: int, instances: int, target: list[str], out: Path) -> list[str]:
    cmd = [
        str(binary("mwload")),
        *target,
        "-t",
        str(s.topology.threads),
        "-c",
        str(s.topology.virtual_clients),
        "--ratio",
        str(s.workload.ratio),
        "--test-time",
        str(s.run.duration),
        "--warmup",
        str(s.run.warmup),
        "--cooldown",
        str(s.run.cooldown),
        "--key-maximum",
        str(s.workload.keys - 1),
        "-d",
        str(s.workload.value_size),
        "--multi-key-get",
        str(s.workload.multiget_size),
        "--key-pattern",
        s.workload.key_pattern,
        "--key-prefix",
        s.workload.key_prefix,
        "--seed",
        str(s.run.seed * 1000 + index),
        "--window-ms",
        str(s.run.window_ms),
        "--out",
        str(out / f"cl{index}"),
        "--instance",
        f"cl{index}",
        "--progress",
        "never",
        "--max-error-rate",
        "1",
    ]
    if s.mq:
        cmd = [c for i, c in enumerate(cmd) if not _memcached_only(cmd, i)] + _mq_args(s, index)
    if s.workload.think_time_us:
        cmd += ["--think-time", str(s.workload.think_time_us), "--think-dist", "exponential"]
    if s.workload.rate:
        cmd += ["--rate", str(s.workload.rate / instances)]
    return cmd


def _memcached_only(cmd: list[str], i: int) -> bool:
    """Whether cmd[i] is a memcached-only flag of mwload or its value."""
    flags = ("--key-maximum", "--multi-key-get", "--key-pattern", "--key-prefix")
    return cmd[i] in flags or (i > 0 and cmd[i - 1] in flags)


def _prefill(place, g: ProcessGroup, s: Settings, host: str, targets: list[list[str]]) -> None:
    for i, target in enumerate(targets):
        cmd = [
            str(binary("mwload")),
            *target,
            "--prefill",
            "-n",
            "1",
            "-t",
            "1",
            "-c",
            "1",
            "--ratio",
            "0:1",
            "--key-maximum",
            str(s.workload.keys - 1),
            "--key-prefix",
            s.workload.key_prefix,
            "-d",
            str(s.workload.value_size),
            "--progress",
            "never",
        ]
        p = place.start(g, f"prefill{i}", host, cmd)
        if p.popen.wait(timeout=120) != 0:
            raise LabError(f"prefill through {' '.join(target)} failed; see {p.log}")


def _prefill_pool(
    place, g: ProcessGroup, s: Settings, hosts: tuple[str, str], servers: list[str], extra, out: Path
) -> None:
    """The spec's `prefill_pool`: the prefill written straight to that pool,
    through a throwaway mwproxy on the first middleware's host whose route is
    the pool alone (so the keys lie where the pool's own placement puts
    them), stopped before the clients start. `hosts`: the middleware's and
    the prefilling client's; `extra`: (mwproxy's, the client's) TLS and login
    arguments."""
    config = out / "logs" / "prefill-proxy.toml"
    config.write_text(routes.config_text(s, servers, route=s.routes.prefill_pool))
    listen = f"{place.addr(hosts[0])}:{free_port()}"
    cmd = _mwproxy_cmd(s, 0, listen, servers, out / "logs", config, name="prefill-proxy") + extra[0]
    proxy = place.start(g, "prefill-proxy", hosts[0], cmd, int(listen.rsplit(":", 1)[1]))
    try:
        _prefill(place, g, s, hosts[1], [_target_args([listen], False, 0) + extra[1]])
    finally:
        g.terminate(proxy)


def _placement(s: Settings, stack: contextlib.ExitStack, out: Path, netem: bool = True):
    emulation = s.hosts.emulation
    if emulation == "netns":
        from mwlab.netns import Emulation

        return Emulated(stack.enter_context(Emulation(host_specs(s, netem))))
    if emulation == "ssh":
        from mwlab.ssh import Remote

        limit = s.run.seconds + 60
        return stack.enter_context(Remote(s.hosts.ssh, out, limit))
    return Local()


def _conninfo_via(conninfo: str, via) -> str:
    """A libpq connection string with its host and port replaced by `via(host:port)`."""
    parts = dict(p.split("=", 1) for p in conninfo.split())
    if "port" not in parts or parts.get("host", "/").startswith("/"):
        return conninfo
    host, port = via(f"{parts['host']}:{parts['port']}").rsplit(":", 1)
    parts.update(host=host, port=port)
    return " ".join(f"{k}={v}" for k, v in parts.items())


def _delay_record(
    s: Settings, delays, hosts, place, relays, middleware: bool, servers: dict[str, str]
) -> dict[str, Any]:
    """What the run records of its link delays: how they were added, the
    round-trip time they add to a request (the client's exchange with its
    target, and the middleware's with a server or the database), and what
    probes measured: pings of the servers (memcached `version`, PostgreSQL's
    SSLRequest) through each delayed route against direct ones, and each
    delay through a twin relay to an echo server."""

    def rtt(a: str, b: str) -> float:
        return 2 * path_delay(delays, a, b)[0] * 1e6

    client = hosts["client"][0]
    server = hosts["server"][0]
    if middleware:
        mw = hosts["middleware"][0]
        front, back = rtt(client, mw), rtt(mw, server)
    else:
        front, back = rtt(client, server), 0.0
    probes = []
    if relays is not None:
        for (src, upstream), (dst, relayed) in sorted(relays.routes.items()):
            kind = servers.get(upstream)
            if kind is None:
                continue  # a middleware: stopped by now, probed through a twin relay below
            try:
                through, direct = ping_times(relayed, kind), ping_times(upstream, kind)
            except (LabError, OSError):
                continue  # a server behind TLS or logins answers no plain ping
            probes.append(
                {
                    "what": f"{kind} ping from {src} to {dst}",
                    "expected_us": rtt(src, dst),
                    "measured_us": (statistics.median(through) - statistics.median(direct)) * 1e6,
                    # No round trip through the relay is shorter than what it holds.
                    "held_us": 2 * relays.held_s(path_delay(delays, src, dst)[0]) * 1e6,
                    "shortest_us": min(through) * 1e6,
                }
            )
        pairs = {path_delay(delays, a, b) for a, b in _pairs(hosts)}
        for d, j in sorted(p for p in pairs if p[0]):
            measured, shortest = relays.probe_times(d, j)
            probes.append(
                {
                    "what": f"relay {d * 1e3:g} ms",
                    "expected_us": 2 * d * 1e6,
                    "measured_us": measured,
                    "held_us": 2 * relays.held_s(d) * 1e6,
                    "shortest_us": shortest,
                }
            )
    else:
        for host, (d, _) in sorted(delays.items()):
            rtts = place.emu.ping_rtts(host)
            if rtts is not None:
                probes.append(
                    {
                        "what": f"netem on {host}",
                        "expected_us": 2 * d * 1e6,
                        "measured_us": rtts[1],
                        "held_us": 2 * d * 1e6,
                        "shortest_us": rtts[0],
                    }
                )
    return {
        "method": "relay" if relays is not None else "netem",
        "relay_overhead_us": relays.overhead_us if relays is not None else None,
        "rtt_per_request_us": front + back,
        "client_rtt_us": front,
        "backend_rtt_us": back,
        "probes": probes,
    }


def _pairs(hosts: dict[str, list[str]]) -> list[tuple[str, str]]:
    """The (connecting, listening) host pairs of a run."""
    mws, servers, clients = hosts["middleware"], hosts["server"], hosts["client"]
    if mws:
        return [(c, m) for c in clients for m in mws] + [(m, sv) for m in mws for sv in servers]
    return [(c, sv) for c in clients for sv in servers]


def _database(place, host: str, out: Path, standby: int = 0) -> Postgres | PgHa:
    """The message-queue system's PostgreSQL on its host: this machine's unix
    socket when every host is local (with `standby`, a primary and its
    synchronous standby, both on this machine); inside the database host's namespace and
    cgroups, on TCP at its address, on emulated hosts; on TCP at this
    machine's address when the other hosts are real ones over SSH (the
    database host must then be this machine)."""
    if isinstance(place, Emulated):
        addr = place.addr(host)
        subnet = addr.rsplit(".", 1)[0] + ".0/24"
        return Postgres(out / "logs", listen=addr, wrap=lambda cmd: place.emu.wrap(host, cmd), trust=[subnet])
    if isinstance(place, Local):
        return PgHa(out / "logs") if standby else Postgres(out / "logs")
    if host in place.dests:
        raise LabError(
            f"{host} (the database) is a remote host: the lab starts PostgreSQL on this machine only; "
            f"leave {host} out of hosts.ssh"
        )
    # Trusted: the remote hosts of the run, each by its address or name.
    others = [d.host + ("/32" if d.host.replace(".", "").isdigit() else "") for d in place.dests.values()]
    return Postgres(out / "logs", listen=place.addr(host), trust=others)


def _pg_trees(pg: Postgres | PgHa | None) -> dict[str, int] | None:
    """PostgreSQL's process trees whose CPU time is sampled: `pg0` (the
    server, or the primary) and `pg1` (the synchronous standby)."""
    if pg is None:
        return None
    trees = {"pg0": pg.pid(), "pg1": pg.standby_pid() if isinstance(pg, PgHa) else None}
    return {k: v for k, v in trees.items() if v} or None


# How long a reading of the routes' counters waits for the copies on their way.
SETTLE_S = 5.0


def _route_counters(
    s: Settings, routed: dict[str, tuple[str, routes.Servers]], access: routes.Access
) -> dict[str, dict[tuple, int]] | str:
    """Every routed middleware's counters (`routes.counters`), or why they
    could not be read: once no copy (shadow, all-async or all-initial child,
    warm-up fill) is still waiting or on its way, or after SETTLE_S, so that
    the copies the prefill or the clients made count where they were made
    (the clients are done or not started when this reads)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        out = {}
        for name, (addr, servers) in routed.items():
            try:
                out[name] = routes.counters(addr, s.routes.route, servers, access)
            except (OSError, ValueError, LabError) as e:
                return f"{name} at {addr}: {e}"
        queued = [v for c in out.values() for k, v in c.items() if k[3].endswith("_queued")]
        if not any(queued) or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def _record_routes(
    out: Path,
    s: Settings,
    routed: dict[str, tuple[str, routes.Servers]],
    access: routes.Access,
    before: dict[str, dict[tuple, int]] | str,
) -> str | None:
    """routes.csv from the counters read before the clients started and now;
    why it could not be written (the run goes on without it), else None."""
    if not routed:
        return None
    after = _route_counters(s, routed, access)
    if isinstance(before, str) or isinstance(after, str):
        return f"stats routes could not be read: {before if isinstance(before, str) else after}"
    routes.write_csv(out / "routes.csv", {name: (before[name], after[name]) for name in routed})
    return None


def run_once(run: Run, out: Path) -> dict[str, Any]:
    """Runs one repetition of one point; returns what run.json records."""
    s = run.point.settings
    if s.run.client != "mwload":
        raise LabError("client: memtier is not supported by this runner yet; use mwload")
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    mark = started_mark()
    hosts = host_names(s)
    mq = s.mq
    delays = host_delays(s)
    netem = True
    if delays:
        from mwlab.netns import netem_available

        netem = netem_available()
    with contextlib.ExitStack() as stack:
        place = _placement(s, stack, out, netem)
        relays = None
        if not netem:
            relays = stack.enter_context(Relays(out / "logs", place.emu.subnet + ".254"))

        def via(src: str, dst: str, addr: str) -> str:
            """The address `src` reaches `addr` on `dst` by (a relay when one adds the delay)."""
            if relays is None:
                return addr
            d, j = path_delay(delays, src, dst)
            return relays.route(src, dst, addr, d, j) if d else addr

        database = _database(place, hosts["server"][0], out, s.database.standby) if mq else None
        pg = stack.enter_context(database) if database is not None else None
        g = stack.enter_context(ProcessGroup(out / "logs"))
        m = s.middleware
        secrets = None
        if m.tls or m.server_tls or m.auth:
            addrs = [place.addr(h) for names in hosts.values() for h in names]
            secrets = Secrets.make(out / "logs" / "tls", addrs)
        servers = []
        for i, host in enumerate([] if mq else hosts["server"]):
            port = free_port()
            addr = place.addr(host)
            tls = secrets.memcached_args() if secrets and m.server_tls else []
            place.start(g, f"mc{i}", host, memcached_cmd(addr, port) + tls, port)
            servers.append(f"{addr}:{port}")
        mws = []
        # The middlewares that run the spec's route: name -> (address, its servers).
        routed: dict[str, tuple[str, routes.Servers]] = {}
        # The first middleware's servers (as it reaches them) and arguments.
        first_mw: tuple[list[str], list[str]] = ([], [])
        for i, host in enumerate(hosts["middleware"]):
            port = free_port()
            listen = f"{place.addr(host)}:{port}"
            if pg is not None:
                db = _conninfo_via(pg.conninfo, lambda a, host=host: via(host, hosts["server"][0], a))
                place.start(g, f"mw{i}", host, _mwmq_cmd(s, i, listen, db, out), port)
            else:
                extra = secrets.proxy_args(m) if secrets else []
                mine = [via(host, hosts["server"][k], a) for k, a in enumerate(servers)]
                config = None
                if s.routes.pools is not None:
                    config = out / "logs" / f"mw{i}.toml"
                    config.write_text(routes.config_text(s, mine))
                    pools = s.routes.pool_of_servers()
                    by_addr = {a: (f"mc{k}", pools[k]) for k, a in enumerate(mine)}
                    routed[f"mw{i}"] = (listen, routes.Servers(by_addr))
                if i == 0:
                    first_mw = (mine, extra)
                place.start(g, f"mw{i}", host, _mwproxy_cmd(s, i, listen, mine, out, config) + extra, port)
            mws.append(listen)
        instances = s.topology.client_machines * s.topology.instances
        all_targets = s.topology.client_targets == "all"
        endpoints = mws or servers
        endpoint_hosts = hosts["middleware"] if mws else hosts["server"]
        client_host = [hosts["client"][j // s.topology.instances] for j in range(instances)]
        secure = secrets.client_args(m) if secrets else []
        if s.workload.prefill and not mq:
            first = client_host[0]
            if s.routes.prefill_pool:
                mw_host = hosts["middleware"][0]
                _prefill_pool(place, g, s, (mw_host, first), first_mw[0], (first_mw[1], secure), out)
            elif mws:
                _prefill(place, g, s, first, [_target_args(endpoints[:1], False, 0) + secure])
            elif all_targets:
                _prefill(place, g, s, first, [_target_args(servers, True, 0)])
            else:
                targets = [_target_args(servers, False, i) for i in range(min(len(servers), instances))]
                _prefill(place, g, s, first, targets)
        interval = min(0.5, s.run.window_ms / 2000)
        sampler = ResourceSampler(
            g,
            out / "resources.csv",
            interval=interval,
            emulation=getattr(place, "emu", None),
            trees=_pg_trees(pg),
        )
        sampler.start()
        if hasattr(place, "start_samplers"):
            place.start_samplers(interval)
        access = routes.Access(
            secrets.ca if secrets and m.tls else None, secrets.login if secrets and m.auth else None
        )
        before = _route_counters(s, routed, access)
        clients = [
            place.start(
                g,
                f"cl{j}",
                client_host[j],
                _mwload_cmd(
                    s,
                    j,
                    instances,
                    _target_args(
                        [via(client_host[j], h, e) for h, e in zip(endpoint_hosts, endpoints, strict=True)],
                        all_targets,
                        j,
                    ),
                    out,
                )
                + secure,
            )
            for j in range(instances)
        ]
        limit = s.run.seconds + 60
        codes = {}
        for c in clients:
            try:
                codes[c.name] = c.popen.wait(timeout=max(1.0, limit - (time.time() - started)))
            except subprocess.TimeoutExpired:
                c.popen.kill()
                codes[c.name] = "timeout"
        route_error = _record_routes(out, s, routed, access, before)
        for name, proc in [(p.name, p) for p in g.procs if p.name.startswith("mw")]:
            codes[name] = g.terminate(proc)
        sampler.stop()
        if hasattr(place, "stop_samplers"):
            place.stop_samplers()
        placement = {
            "emulation": s.hosts.emulation,
            "hosts": place.describe(),
            "processes": {
                **(
                    {name: hosts["server"][0] for name in _pg_trees(pg) or {"pg0": 0}}
                    if mq
                    else {f"mc{i}": h for i, h in enumerate(hosts["server"])}
                ),
                **{f"mw{i}": h for i, h in enumerate(hosts["middleware"])},
                **{f"cl{j}": h for j, h in enumerate(client_host)},
            },
        }
        if hasattr(place, "fetch"):
            place.fetch(out)
        kinds = {a: "memcached" for a in servers}
        if pg is not None and pg.listen:
            kinds[f"{pg.listen}:{pg.port}"] = "postgres"
        delay = _delay_record(s, delays, hosts, place, relays, bool(mws), kinds) if delays else None
    failed = {k: v for k, v in codes.items() if v != 0}
    record = {
        "point": run.point.name,
        "rep": run.rep,
        "factors": run.point.factors,
        "settings": run.point.settings.model_dump(mode="json"),
        "started_unix": started,
        "ended_unix": time.time(),
        "exit_codes": codes,
        "cores": usable_cores(),
        "placement": placement,
        "status": "failed" if failed else "ok",
    }
    if delay:
        record["delay"] = delay
    stale = freshness.stale_of(p.cmd for p in started_since(mark))
    if stale:
        record["stale_binaries"] = stale
    if route_error:
        record["routes_error"] = route_error
    if isinstance(pg, PgHa):
        record["database"] = pg.facts()
    if failed:
        record["error"] = "processes exited abnormally: " + ", ".join(f"{k}={v}" for k, v in failed.items())
    return record


def prepare(exp: Experiment, results: Path, resume: Path | None = None) -> Path:
    """The result directory of a run: a new one under `results`, or `resume`'s."""
    if resume is not None:
        if not (resume / "experiment.json").exists():
            raise LabError(f"{resume} is not an experiment result directory (no experiment.json)")
        return resume
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = results / exp.name / stamp
    n = 1
    while out.exists():
        n += 1
        out = results / exp.name / f"{stamp}-{n}"
    out.mkdir(parents=True)
    (out / "spec.yaml").write_text(yaml.safe_dump(exp.source, sort_keys=False))
    (out / "experiment.json").write_text(json.dumps(exp.info(), indent=1, default=str))
    return out


@contextlib.contextmanager
def reference_around(out: Path, on: bool = True, warn: Callable[[str], None] = print) -> Iterator[None]:
    """Measures the reference point (`mwlab.reference`) before and after the
    body when `on` (the spec's `run.reference`), and records its summary in
    experiment.json (`reference`). A measurement that fails is told to
    `warn` and the experiment goes on without it; an interrupted body gets
    no end measurement."""
    if on:
        _reference(out, "start", warn)
    yield
    if not on:
        return
    _reference(out, "end", warn)
    refs = reference.read(out)
    path = out / "experiment.json"
    if refs and path.is_file():
        info = json.loads(path.read_text())
        info["reference"] = drift.summary(refs)
        path.write_text(json.dumps(info, indent=1, default=str))


def _reference(out: Path, phase: str, warn: Callable[[str], None]) -> None:
    try:
        reference.measure(out, phase)
    except (LabError, OSError, subprocess.SubprocessError) as e:
        warn(f"the reference point was not measured at the {phase}: {e}")


def run_experiment(exp: Experiment, out: Path, progress: Progress | None = None) -> Path:
    """Runs every run of `exp` into `out` (from [`prepare`]), skipping runs that finished."""
    runs = exp.runs()
    t0 = time.monotonic()
    done_now = 0
    for i, run in enumerate(runs):
        rdir = run_dir(out, run)
        record_path = rdir / "run.json"
        if record_path.exists() and json.loads(record_path.read_text()).get("status") == "ok":
            continue
        if progress:
            elapsed = time.monotonic() - t0
            remaining = len(runs) - i
            eta = elapsed / done_now * remaining if done_now else float("nan")
            progress(i, len(runs), run.key, eta)
        _run_into(run, rdir)
        done_now += 1
    if progress:
        progress(len(runs), len(runs), "done", 0.0)
    return out


def _run_into(run: Run, rdir: Path) -> None:
    """One run into its directory; a failure is recorded, not raised."""
    if rdir.exists():
        shutil.rmtree(rdir)
    try:
        record = run_once(run, rdir)
    except (LabError, OSError, subprocess.SubprocessError) as e:
        rdir.mkdir(parents=True, exist_ok=True)
        record = {
            "point": run.point.name,
            "rep": run.rep,
            "factors": run.point.factors,
            "settings": run.point.settings.model_dump(mode="json"),
            "status": "failed",
            "error": str(e),
        }
    (rdir / "run.json").write_text(json.dumps(record, indent=1, default=str))


# Repetitions a point may get while its intervals are too wide.
MAX_REPS = 30


def ci_widths(out: Path) -> dict[str, dict[str, float]]:
    """Per point: repetitions that finished and the relative half-widths (%)
    of the 95% intervals of throughput and p99 across them, as the analysis
    writes them to aggregate.csv (inf where there is no interval yet)."""
    from mwlab.analysis import summarize

    _, aggregate = summarize(out)
    widths: dict[str, dict[str, float]] = {}
    for _, a in aggregate.iterrows():
        w: dict[str, float] = {"reps": float(a["reps"])}
        for col, lo, hi, name in (
            ("client_tput", "client_tput_ci_lo", "client_tput_ci_hi", "throughput"),
            ("client_rt_p99_us", "client_rt_p99_ci_lo_us", "client_rt_p99_ci_hi_us", "p99"),
        ):
            half = (a.get(hi, math.nan) - a.get(lo, math.nan)) / 2
            w[name] = 100 * half / abs(a[col]) if not math.isnan(half) and a.get(col) else math.inf
        widths[str(a["point"])] = w
    return widths


def run_until_ci(
    exp: Experiment, out: Path, target_pct: float, budget_s: float, progress: Progress | None = None
) -> dict[str, Any]:
    """After the planned runs, adds repetitions to every point whose 95%
    interval of throughput or of p99 across repetitions is wider than
    ±`target_pct`%, until all are within it, the time budget would be
    exceeded, or a point has MAX_REPS repetitions. Returns (and writes to
    `until_ci.json`) what happened, including when it gave up."""
    t0 = time.monotonic()
    points = {p.name: p for p in exp.points()}
    rounds = 0
    while True:
        widths = ci_widths(out)
        wide = {
            name: w
            for name, w in widths.items()
            if name in points and max(w["throughput"], w["p99"]) > target_pct
        }
        missing = [name for name in points if name not in widths]
        todo = sorted(set(wide) | set(missing))
        status = "met" if not todo else ""
        if todo:
            cost = sum(run_seconds(points[n].settings) for n in todo)
            if any(widths.get(n, {}).get("reps", 0) >= MAX_REPS for n in todo):
                status = f"gave up: a point reached {MAX_REPS} repetitions"
            elif time.monotonic() - t0 + cost > budget_s:
                status = f"gave up: another round ({cost:.0f} s) would exceed the budget of {budget_s:.0f} s"
        if status:
            result = {
                "target_pct": target_pct,
                "budget_s": budget_s,
                "status": status,
                "rounds": rounds,
                "points": {n: widths.get(n, {}) for n in points},
            }
            (out / "until_ci.json").write_text(json.dumps(result, indent=1, default=str))
            return result
        rounds += 1
        for k, name in enumerate(todo):
            reps = [int(d.name.split("-")[1]) for d in (out / name).glob("rep-*") if d.is_dir()]
            run = Run(points[name], max(reps, default=0) + 1)
            if progress:
                progress(k, len(todo), f"{run.key} (until ±{target_pct:g}%, round {rounds})", float("nan"))
            _run_into(run, run_dir(out, run))
