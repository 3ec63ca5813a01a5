"""A spec's pools and route as mwproxy runs them, and what mwproxy says it
did with them.

- [`config_text`]: mwproxy's configuration file for one middleware — each
  pool with the addresses of the servers the runner started for it, the
  route tree exactly as the spec wrote it (TOML inline tables: the tree is
  mwproxy's vocabulary, not the lab's), or one pool alone (the throwaway
  proxy of a spec's `prefill_pool`);
- [`check`]: mwproxy itself judges the pools and the tree before anything
  starts (`mwproxy -c FILE --print-config`, which validates without
  serving), so a route naming a pool the spec does not declare is refused
  with mwproxy's own words and the route's path;
- [`counters`]: `stats routes` (every node of the tree by its path, and
  every pool: the requests it got, copies included) and `stats backends`
  (every server: the calls the workers made for clients' requests, which
  the copies of the side lanes — shadows, all-async and all-initial
  children, warm-up fills — are not) over the memcached text protocol, read
  once after the prefill and once when the clients are done; [`write_csv`]
  keeps both readings in the run's `routes.csv` (docs/results-format.md).
"""

from __future__ import annotations

import csv
import json
import math
import socket
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mwlab.procs import LabError, binary
from mwlab.spec import Experiment, Settings, SpecError

# Columns of routes.csv.
COLUMNS = ("mw", "kind", "name", "pool", "counter", "before", "after")
# Counters of `stats routes` that say how things stand rather than count
# (a node's, then a pool's).
GAUGES = ("phase", "shadow_queued", "async_queued", "fills_queued", "servers", "servers_up")
# Counters of `stats backends` kept for each server.
SERVER_COUNTERS = ("requests", "errors", "timeouts", "reconnects")


# ---- the configuration file ----


def toml_value(v: Any) -> str:
    """A YAML value as a TOML value (inline tables and arrays): what the spec
    wrote, so that mwproxy reads the tree the spec declared."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else "inf" if v > 0 else "-inf")
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_value(str(k))} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise SpecError(
        f"{v!r} ({type(v).__name__}) has no TOML form: pools and routes take text, numbers, "
        "true/false, lists and mappings"
    )


def config_text(s: Settings, addresses: list[str], route: Any = None) -> str:
    """mwproxy's configuration of the point `s`'s pools and route (or
    `route` instead of the spec's), its servers at `addresses` (by server
    number; each pool takes the next ones, in the order the spec names the
    pools)."""
    pools = s.routes.pools or {}
    if len(addresses) != s.routes.servers:
        raise LabError(f"{len(addresses)} server addresses for pools of {s.routes.servers} servers")
    lines = [
        "# Written by mwlab: the spec's pools, with the servers the runner started, and its route.",
        f"route = {toml_value(s.routes.route if route is None else route)}",
    ]
    at = 0
    for name, pool in pools.items():
        n = pool["servers"]
        table = {"multiget": s.middleware.multiget, **pool, "servers": addresses[at : at + n]}
        at += n
        lines.append(f"pools.{toml_value(name)} = {toml_value(table)}")
    return "\n".join(lines) + "\n"


def check(exp: Experiment, where: str) -> None:
    """Has mwproxy judge the pools and route of the spec's points (without
    serving: `--print-config` reads and validates the file, then exits); a
    refusal is a SpecError with mwproxy's message, which names the route's
    path. Every point has the same pools and route (they are not factors);
    each configuration the points' other settings make is checked once."""
    seen: list[str] = []
    for p in exp.points():
        s = p.settings
        if s.routes.pools is None:
            continue
        text = config_text(s, [f"127.0.0.1:{20000 + i}" for i in range(s.routes.servers)])
        if text in seen:
            continue
        seen.append(text)
        with tempfile.NamedTemporaryFile("w", prefix="mwlab-route-", suffix=".toml") as f:
            f.write(text)
            f.flush()
            cmd = [str(binary("mwproxy")), "-c", f.name, "--print-config", "--log", "error"]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as e:
                raise LabError(f"mwproxy could not check the route: {e}") from e
        if r.returncode != 0:
            said = r.stderr.strip().removeprefix("mwproxy: ") or f"exit status {r.returncode}"
            raise SpecError(f"{where}: mwproxy refuses the pools and route: {said}")


# ---- which node of the tree is which pool ----

# Keys of a route table whose value is one child route.
CHILD_KEYS = ("default", "get", "set", "delete", "arith", "touch", "cold", "warm", "main", "from", "to")


def _rust_debug(text: str) -> str:
    """A prefix as mwproxy writes it in a node's path (Rust's `{:?}` of a string)."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c in "\n\r\t\0":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}[c])
        elif ord(c) < 32 or ord(c) == 127:
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def pool_paths(route: Any, path: str = "route") -> dict[str, str]:
    """The path of every node of the tree that is a pool (as `stats routes`
    names it) and the pool's name."""
    if isinstance(route, str):
        return {path: route}
    if not isinstance(route, dict):
        return {}
    if route.get("type") == "pool":
        return {path: str(route.get("pool"))}
    out: dict[str, str] = {}
    for key, child in route.items():
        if key == "routes" and isinstance(child, dict):
            for prefix, r in child.items():
                out.update(pool_paths(r, f"{path}.routes.{_rust_debug(str(prefix))}"))
        elif key in ("children", "shadows") and isinstance(child, list):
            for i, r in enumerate(child):
                if key == "shadows":
                    r = r.get("route") if isinstance(r, dict) else None
                    out.update(pool_paths(r, f"{path}.shadows[{i}].route"))
                else:
                    out.update(pool_paths(r, f"{path}.children[{i}]"))
        elif key in CHILD_KEYS:
            out.update(pool_paths(child, f"{path}.{key}"))
    return out


# ---- reading mwproxy's counters ----


@dataclass(frozen=True)
class Access:
    """How the lab reaches a middleware: TLS with this CA, a login `user:password`."""

    ca: Path | None = None
    login: str | None = None


def stats(addr: str, what: str, access: Access = Access(), timeout: float = 10.0) -> list[tuple[str, str]]:
    """`stats WHAT` of the memcached server or proxy at `addr` (host:port), as
    (name, value) pairs."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        if access.ca is not None:
            sock = ssl.create_default_context(cafile=str(access.ca)).wrap_socket(sock, server_hostname=host)
        if access.login:
            user, password = access.login.split(":", 1)
            data = f"{user} {password}".encode()
            reply = _exchange(sock, b"set mwlab 0 0 %d\r\n%s\r\n" % (len(data), data))
            if reply != b"STORED\r\n":
                raise LabError(f"{addr}: the login was refused: {reply.decode(errors='replace').strip()}")
        text = _exchange(sock, f"stats {what}\r\n".encode())
    finally:
        sock.close()
    if not text.endswith(b"END\r\n"):
        raise LabError(f"{addr}: `stats {what}` answered {text.decode(errors='replace').strip()!r}")
    out = []
    for line in text.decode().splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] == "STAT":
            out.append((parts[1], parts[2]))
    return out


def _exchange(sock: socket.socket, request: bytes) -> bytes:
    """The reply to `request`: STAT lines up to END, or one other line (a
    login's STORED, an error)."""
    sock.sendall(request)
    buf = b""
    while not (buf.endswith(b"END\r\n") or (b"\r\n" in buf and not buf.startswith(b"STAT "))):
        chunk = sock.recv(65536)
        if not chunk:
            raise LabError(f"the connection closed after {buf[-200:]!r}")
        buf += chunk
    return buf


@dataclass(frozen=True)
class Servers:
    """The servers a middleware was given: address as it knows it -> (the
    lab's name of the server process, its pool)."""

    by_addr: dict[str, tuple[str, str]]


def counters(addr: str, route: Any, servers: Servers, access: Access = Access()) -> dict[tuple, int]:
    """One reading of a middleware: {(kind, name, pool, counter): value} for
    every node of its tree (`route`, by path), every pool (`pool`: every
    request it got, copies included) and every server (`server`, by the
    lab's name: what the workers sent it for clients' requests)."""
    pools = pool_paths(route)
    out: dict[tuple, int] = {}
    for name, value in stats(addr, "routes", access):
        kind, rest = name.split(":", 1)
        thing, counter = rest.rsplit(":", 1)
        if kind == "pool":
            out[("pool", thing, thing, counter)] = int(value)
        else:
            out[("route", thing, pools.get(thing, ""), counter)] = int(value)
    backends: dict[str, dict[str, str]] = {}
    for name, value in stats(addr, "backends", access):
        _, index, field = name.split(":", 2)
        backends.setdefault(index, {})[field] = value
    for b in backends.values():
        lab_name, pool = servers.by_addr.get(b.get("address", ""), (b.get("address", ""), ""))
        for counter in SERVER_COUNTERS:
            if counter in b:
                out[("server", lab_name, pool, counter)] = int(b[counter])
    return out


def write_csv(path: Path, readings: dict[str, tuple[dict[tuple, int], dict[tuple, int]]]) -> None:
    """routes.csv: per middleware, each counter before the clients started
    and after they finished (a counter missing in one reading is 0 there)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for mw, (before, after) in readings.items():
            # mwproxy's order: the tree's nodes from the root, the pools, then the servers.
            for key in dict.fromkeys([*after, *before]):
                w.writerow([mw, *key, before.get(key, 0), after.get(key, 0)])
