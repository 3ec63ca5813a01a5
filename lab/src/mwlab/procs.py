"""Local processes of an experiment: memcached servers, mwproxy middlewares and
mwload clients on free loopback ports, stopped on every way out (including
Ctrl-C), and a sampler of their CPU, memory and the host's network once a
second, like dstat (figures from psutil; thread names from
/proc/PID/task/TID/comm, which psutil does not read).

Every process started here (and PostgreSQL's servers, and the relays) is
noted with its command and where it logs (`started_since`), so that a failed
test can print the tail of each log and the seeds it ran with
(lab/tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[3]


class LabError(RuntimeError):
    """Something the lab needs is missing or failed."""


@dataclass
class Started:
    """A process this Python process started: its name, command and where its
    log is now (a callable: PostgreSQL's log moves when the server stops)."""

    seq: int
    name: str
    cmd: list[str]
    logs: Callable[[], list[Path]]


_STARTED: list[Started] = []
_STARTED_KEEP = 2000


def note_started(name: str, cmd: list[str], logs: Callable[[], list[Path]] | Path) -> None:
    """Notes a started process (the last 2,000 are kept)."""
    where = logs if callable(logs) else (lambda path=logs: [path])
    seq = _STARTED[-1].seq + 1 if _STARTED else 1
    _STARTED.append(Started(seq, name, [str(c) for c in cmd], where))
    del _STARTED[:-_STARTED_KEEP]


def started_mark() -> int:
    """A mark to pass to `started_since` later."""
    return _STARTED[-1].seq if _STARTED else 0


def started_since(mark: int, upto: int | None = None) -> list[Started]:
    """The processes started after `mark` (and up to `upto`), oldest first."""
    return [s for s in _STARTED if s.seq > mark and (upto is None or s.seq <= upto)]


# The ports handed out, each with the lock on its file that keeps other
# processes from handing it out too (released when the process exits).
_GIVEN_PORTS: dict[int, Any] = {}


# Ports the lab hands out: below the kernel's ephemeral range (32768 and up),
# so that no outgoing connection takes one between the check and the
# server's bind, and apart from the Rust tests' (20000-32767).
_PORTS = range(10_000, 20_000)
_NEXT_PORT = [_PORTS.start + (os.getpid() * 7919) % len(_PORTS)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that no process
    running now has handed out: the kernel may give the same free port twice
    in a row while the server that got it first has not bound it yet, and two
    lab processes (or test workers) side by side would otherwise both offer
    it. Each port handed out holds an exclusive lock on a file of its own
    (`$TMPDIR/mwlab-ports/<port>`) for as long as this process runs. Taken in
    turn from 10000-19999, starting at a place derived from the process id."""
    where = Path(tempfile.gettempdir()) / "mwlab-ports"
    where.mkdir(exist_ok=True)
    for _ in range(len(_PORTS)):
        port = _NEXT_PORT[0]
        _NEXT_PORT[0] = _PORTS.start + (port + 1 - _PORTS.start) % len(_PORTS)
        if port in _GIVEN_PORTS:
            continue
        lock = _reserve(where, port)
        if lock is None:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                lock.close()
                continue
        if len(_GIVEN_PORTS) >= 5_000:  # servers long gone: start afresh
            for held in _GIVEN_PORTS.values():
                held.close()
            _GIVEN_PORTS.clear()
        _GIVEN_PORTS[port] = lock
        return port
    raise LabError("no free TCP port in 10000-19999 on 127.0.0.1")


def _reserve(where: Path, port: int) -> Any:
    """The open, exclusively locked file for `port` in `where`; None when
    another process holds it."""
    f = open(where / str(port), "a")  # noqa: SIM115 - held open while the port is
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


def wait_port(
    port: int, timeout: float = 10.0, proc: subprocess.Popen | None = None, host: str = "127.0.0.1"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LabError(f"process exited with status {proc.returncode} before listening on {port}")
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise LabError(f"nothing listens on port {port} after {timeout} s")


def binary(name: str) -> Path:
    """A binary of this repository (release build preferred), or from PATH."""
    env = os.environ.get(f"{name.upper()}_BIN")
    if env:
        return Path(env)
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / name
        if p.exists():
            return p
    found = shutil.which(name)
    if found:
        return Path(found)
    raise LabError(f"{name} is not built: run `cargo build --release` (make run does)")


@dataclass
class Proc:
    """A started process with its role name."""

    name: str
    popen: subprocess.Popen
    port: int | None = None
    log: Path | None = None


@dataclass
class ProcessGroup:
    """Processes started for one run; stopping is idempotent and kills stragglers."""

    logs: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, cmd: list[str], port: int | None = None, host: str = "127.0.0.1") -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("wb") as f:
            popen = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        p = Proc(name, popen, port, log)
        self.procs.append(p)
        note_started(name, cmd, log)
        if port is not None:
            try:
                wait_port(port, proc=popen, host=host)
            except LabError as e:
                raise LabError(f"{name}: {e}; see {log}") from e
        return p

    def memcached(self, name: str) -> Proc:
        port = free_port()
        return self.start(name, memcached_cmd("127.0.0.1", port), port)

    def terminate(self, p: Proc, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit status."""
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
            try:
                p.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
        return p.popen.returncode

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            if getattr(p.popen, "remote", False):
                with contextlib.suppress(Exception):
                    if p.popen.poll() is None:
                        p.popen.kill()
                continue
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def memcached_cmd(addr: str, port: int) -> list[str]:
    """The command of a memcached server on `addr:port` (one worker thread, 256 MB)."""
    exe = shutil.which("memcached")
    if exe is None:
        raise LabError("memcached is not installed (make run installs it)")
    cmd = [exe, "-l", addr, "-p", str(port), "-U", "0", "-t", "1", "-m", "256"]
    if os.geteuid() == 0:
        cmd += ["-u", "root"]
    return cmd


class Postgres:
    """A throwaway PostgreSQL for one run (`scripts/postgres.sh`: initdb as the
    `postgres` user in a scratch directory, unix socket only), stopped on exit.
    Its server log is copied into the run's logs."""

    def __init__(
        self,
        logs: Path,
        settings: list[str] | None = None,
        listen: str | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
        trust: list[str] | None = None,
    ):
        """`listen`: also accept TCP on this address (a free port), trusting
        connections from the networks or hosts `trust` (CIDR or host names;
        nobody else); `wrap`: how to run the start command on its host (an
        emulated host's namespace and cgroups, which the server's processes
        inherit)."""
        self.logs = logs
        self.settings = settings or []
        self.listen = listen
        self.wrap = wrap or (lambda cmd: cmd)
        self.dir: Path | None = None
        self.conninfo = ""
        if listen:
            self.port = free_port()
            self.settings = [
                *self.settings,
                f"listen_addresses={listen}",
                f"port={self.port}",
                *[f"hba={t}" for t in trust or []],
            ]

    def __enter__(self) -> Postgres:
        import tempfile

        if shutil.which("runuser") is None and os.geteuid() == 0:
            raise LabError("runuser is missing (util-linux)")
        self.dir = Path(tempfile.mkdtemp(prefix="mwlab-pg-"))
        self.dir.chmod(0o755)
        script = str(REPO / "scripts" / "postgres.sh")
        cmd = self.wrap([script, "start", str(self.dir / "pg"), *self.settings])
        note_started("postgres", cmd, self._log_files)
        out = _start_database(cmd, "PostgreSQL", 120, self.__exit__)
        self.conninfo = out.strip().splitlines()[-1]
        if self.listen:
            self.conninfo = f"host={self.listen} port={self.port} user=postgres dbname=mwmq"
        return self

    def _log_files(self) -> list[Path]:
        """The server's logs: in its directory while it runs, then their copies."""
        if self.dir is not None:
            return sorted((self.dir / "pg").glob("*.log"))
        return sorted(self.logs.glob("pg-*.log"))

    def pid(self) -> int | None:
        """The postmaster's process id."""
        try:
            return int((self.dir / "pg" / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError, TypeError):
            return None

    def __exit__(self, *exc: object) -> None:
        if self.dir is None:
            return
        subprocess.run(
            [str(REPO / "scripts" / "postgres.sh"), "stop", str(self.dir / "pg")],
            capture_output=True,
            timeout=120,
        )
        for log in (self.dir / "pg").glob("*.log"):
            with contextlib.suppress(OSError):
                self.logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(log, self.logs / f"pg-{log.name}")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


def _start_database(cmd: list[str], what: str, seconds: int, undo: Callable[[], None]) -> str:
    """Runs a database's start script; its output, or (after `undo`) a LabError saying why not."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as e:
        undo()
        raise LabError(f"{what} did not start within {seconds} s") from e
    if r.returncode != 0:
        undo()
        raise LabError(f"{what} did not start: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


class PgHa:
    """A PostgreSQL primary with a synchronous standby for one run
    (`scripts/pg-ha.sh`: a pg_auto_failover monitor and two nodes on this
    machine, pg_auto_failover's own timeouts), stopped on exit. mwmq reaches
    the primary over its unix socket, as it reaches a lone server, so that
    the standby is the one difference. While it runs, the standby's flush
    lag (`pg_stat_replication.flush_lag`: from the primary's WAL flush to
    the standby's confirmation, the round trip a commit waits for) is
    sampled every second."""

    SOCKETS = "/var/run/postgresql"

    def __init__(self, logs: Path):
        self.logs = logs
        self.dir: Path | None = None
        self.conninfo = ""
        self.listen = None
        self.ports: list[int] = []
        self.lags_us: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def __enter__(self) -> PgHa:
        import tempfile

        if shutil.which("pg_autoctl") is None:
            raise LabError(
                "database.standby needs pg_auto_failover (make test-deps or make ha-deps installs it)"
            )
        self.dir = Path(tempfile.mkdtemp(prefix="mwlab-pgha-"))
        self.dir.chmod(0o755)
        cmd = [str(REPO / "scripts" / "pg-ha.sh"), "start", str(self.dir / "ha"), "timeouts=default"]
        note_started("postgres-ha", cmd, self._log_files)
        _start_database(cmd, "the primary and its standby", 180, self.__exit__)
        self.ports = [int(p) for p in (self.dir / "ha" / "ports").read_text().strip().split(",")]
        self.conninfo = f"host={self.SOCKETS} port={self.ports[1]} user=postgres dbname=mwmq"
        self._sampler = threading.Thread(target=self._sample, name="standby-lag", daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        query = "SELECT coalesce(extract(epoch FROM flush_lag) * 1e6, 0) FROM pg_stat_replication"
        while not self._stop.wait(1.0):
            with contextlib.suppress(subprocess.SubprocessError, OSError, ValueError):
                r = subprocess.run(
                    ["psql", "-X", "-tA", "-c", query, self.conninfo],
                    capture_output=True,
                    text=True,
                    timeout=5,
                )
                lag = float(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.split() else 0.0
                if lag > 0:
                    self.lags_us.append((time.time() * 1000.0, lag))

    def _log_files(self) -> list[Path]:
        """The monitor's and the nodes' logs: in their directory while they run, then their copies."""
        if self.dir is not None:
            return sorted((self.dir / "ha").glob("*.log"))
        return sorted(self.logs.glob("pgha-*.log"))

    def _postmaster(self, node: int) -> int | None:
        try:
            assert self.dir is not None
            return int((self.dir / "ha" / f"node{node}" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError, AssertionError):
            return None

    def pid(self) -> int | None:
        """The primary's postmaster."""
        return self._postmaster(1)

    def standby_pid(self) -> int | None:
        """The standby's postmaster."""
        return self._postmaster(2)

    def facts(self) -> dict[str, Any]:
        """What run.json records of the database: the standby's flush lag,
        each sample (unix ms, µs; the analysis keeps those of the measured
        windows) and the median of all."""
        lags = sorted(lag for _, lag in self.lags_us)
        return {
            "standby": 1,
            "standby_lag_samples": [[round(t), lag] for t, lag in self.lags_us],
            "standby_flush_lag_us": lags[len(lags) // 2] if lags else None,
        }

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
        if self.dir is None:
            return
        script = str(REPO / "scripts" / "pg-ha.sh")
        subprocess.run([script, "stop", str(self.dir / "ha")], capture_output=True, timeout=120)
        for log in (self.dir / "ha").glob("*.log"):
            with contextlib.suppress(OSError):
                self.logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(log, self.logs / f"pgha-{log.name}")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


def _children(pid: int) -> list[int]:
    """Direct children of a process."""
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def _pg_class(pid: int) -> str:
    """A PostgreSQL process's role from its title: `postgres: walwriter` -> `walwriter`;
    a client connection (`postgres: user db [local] idle`) -> `backend`."""
    try:
        # PostgreSQL writes its title over its arguments; joined, they read as one line either way.
        title = " ".join(psutil.Process(pid).cmdline()).strip()
    except psutil.Error:
        return "other"
    if not title.startswith("postgres:"):
        return "postmaster"
    rest = title.split(":", 1)[1].split()
    if len(rest) >= 3 and (rest[2].startswith("[") or ":" in rest[2] or rest[2][:1].isdigit()):
        return "backend"
    return re.sub(r"[^a-z]", "", "".join(rest[:2]).lower()) or "other"


def tree_times(pid: int, seen: dict[int, tuple[str, float]] | None = None) -> dict[str, float]:
    """CPU seconds of a process and its children, per class (PostgreSQL's
    roles). With `seen` (kept by the caller between calls), children that
    have exited still count with their last reading, so the sums never go
    down when a connection closes."""
    seen = {} if seen is None else seen
    for p in [pid, *_children(pid)]:
        t = _proc_times(p)
        if t is not None:
            cls = seen[p][0] if p in seen else _pg_class(p)
            seen[p] = (cls, t[0])
    out: dict[str, float] = {}
    for cls, secs in seen.values():
        out[cls] = out.get(cls, 0.0) + secs
    return out


def _proc_times(pid: int) -> tuple[float, float] | None:
    """(cpu seconds, rss MB) of a process."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            t, rss = p.cpu_times(), p.memory_info().rss
    except psutil.Error:
        return None
    return t.user + t.system, rss / 1e6


def thread_class(name: str) -> str:
    """A thread's role from its name: `worker-3` -> `worker`, `mc-worker` stays."""
    return re.sub(r"[-_]?\d+$", "", name.strip()) or "main"


def _thread_times(pid: int) -> dict[str, float]:
    """CPU seconds of a process's live threads, summed per thread class (psutil
    has the times; the names are only in /proc/PID/task/TID/comm)."""
    out: dict[str, float] = {}
    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return out
    for t in threads:
        try:
            name = Path(f"/proc/{pid}/task/{t.id}/comm").read_text()
        except OSError:
            continue
        cls = thread_class(name)
        out[cls] = out.get(cls, 0.0) + t.user_time + t.system_time
    return out


def usable_cores() -> float:
    """CPUs this process may use: its affinity, lowered by a cgroup CPU quota if there is one."""
    cores = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, int(quota) / int(period))
    except (FileNotFoundError, ValueError, PermissionError):
        pass
    return cores


def _host_cpu() -> tuple[float, float]:
    """(busy seconds, total seconds) since boot of the CPUs this process may
    run on (`host_busy` of its affinity)."""
    return host_busy(psutil.cpu_times(percpu=True), os.sched_getaffinity(0))


def host_busy(per_cpu: list[Any], cpus: set[int]) -> tuple[float, float]:
    """(busy seconds, total seconds) of the CPUs `cpus` among per-CPU times
    (psutil's `cpu_times(percpu=True)`): the CPUs [`usable_cores`] counts,
    so that what others run on CPUs the lab may not use (a run pinned with
    taskset) is not taken for CPU they took from it."""
    mine = [t for i, t in enumerate(per_cpu) if i in cpus] or per_cpu
    total = sum(sum(t) for t in mine)
    idle = sum(t.idle + getattr(t, "iowait", 0.0) for t in mine)
    return total - idle, total


def _net_bytes() -> tuple[int, int]:
    """(received, sent) bytes over all interfaces."""
    n = psutil.net_io_counters()
    return n.bytes_recv, n.bytes_sent


class ResourceSampler(threading.Thread):
    """Samples every process of a group, its threads and the host once per
    interval: rates into `resources.csv` (CPU %, RSS, network), cumulative CPU
    seconds per process and per thread class into `cpu.csv` (the lab's own
    process as `lab`, the host's busy time as `host`), from which the analysis
    derives each component's CPU demand per request and the CPU that others used."""

    def __init__(
        self,
        group: ProcessGroup,
        path: Path,
        interval: float = 1.0,
        emulation=None,
        trees: dict[str, int] | None = None,
    ):
        super().__init__(daemon=True, name="resources")
        self.group, self.path, self.interval = group, path, interval
        # Processes not started by the group, sampled with their children
        # (PostgreSQL: the postmaster and its backends), by name.
        self.trees = trees or {}
        self._seen: dict[str, dict[int, tuple[str, float]]] = {name: {} for name in self.trees}
        self.cpu_path = path.with_name("cpu.csv")
        self.emulation = emulation
        self.stopping = threading.Event()

    def _links(self, f) -> None:
        """Emulated hosts: bytes and packets per link direction, and CPU
        throttling per host. The counters' time is taken when they are read
        (within 2 ms: a read that took longer, the thread preempted on a
        loaded machine, is read again), so that a rate from two readings is
        the rate of the link, not of the sampler's lateness."""
        if self.emulation is None:
            return
        for _ in range(5):
            before = time.time()
            counters = self.emulation.link_counters()
            after = time.time()
            if after - before <= 0.002:
                break
        stamp = round((before + after) / 2 * 1000)
        for (host, direction), (nbytes, packets) in sorted(counters.items()):
            f.write(f"{stamp},{host},{direction},{nbytes},{packets}\n")
        for host, (throttled, nr_throttled, periods) in sorted(self.emulation.cpu_counters().items()):
            f.write(f"{stamp},{host},throttle,{throttled:.6f},{nr_throttled}/{periods}\n")
        f.flush()

    def _cumulative(self, f, stamp: int) -> None:
        own = _proc_times(os.getpid())
        if own is not None:
            f.write(f"{stamp},lab,*,{own[0]:.3f}\n")
        for p in list(self.group.procs):
            if p.popen.pid is None:
                continue
            # The threads first: the process's time, read after them, is
            # never less than theirs (it holds its exited threads' too).
            threads = _thread_times(p.popen.pid)
            sample = _proc_times(p.popen.pid)
            if sample is None:
                continue
            f.write(f"{stamp},{p.name},*,{sample[0]:.3f}\n")
            for cls, secs in sorted(threads.items()):
                f.write(f"{stamp},{p.name},{cls},{secs:.3f}\n")
        for name, pid in self.trees.items():
            classes = tree_times(pid, self._seen[name])
            if classes:
                f.write(f"{stamp},{name},*,{sum(classes.values()):.3f}\n")
                for cls, secs in sorted(classes.items()):
                    f.write(f"{stamp},{name},{cls},{secs:.3f}\n")
        busy, _total = _host_cpu()
        f.write(f"{stamp},host,busy,{busy:.3f}\n")
        f.flush()

    def run(self) -> None:
        last: dict[int, float] = {}
        host_last = _host_cpu()
        net_last = _net_bytes()
        t_last = time.monotonic()
        links_path = self.path.with_name("links.csv")
        with (
            self.path.open("w") as f,
            self.cpu_path.open("w") as cpu,
            links_path.open("w") if self.emulation else contextlib.nullcontext() as links,
        ):
            f.write("unix_ms,name,cpu_percent,rss_mb,net_rx_mb_s,net_tx_mb_s\n")
            cpu.write("unix_ms,process,thread,cpu_s\n")
            if links is not None:
                links.write("unix_ms,host,direction,bytes,packets\n")
                self._qdisc("start")
            self._cumulative(cpu, int(time.time() * 1000))
            self._links(links)
            while not self.stopping.wait(self.interval):
                now = time.monotonic()
                dt = max(now - t_last, 1e-6)
                t_last = now
                stamp = int(time.time() * 1000)
                self._cumulative(cpu, stamp)
                self._links(links)
                for p in list(self.group.procs):
                    if p.popen.pid is None:
                        continue
                    sample = _proc_times(p.popen.pid)
                    if sample is None:
                        continue
                    cpu_s, rss = sample
                    prev = last.get(p.popen.pid, cpu_s)
                    last[p.popen.pid] = cpu_s
                    f.write(f"{stamp},{p.name},{100 * (cpu_s - prev) / dt:.1f},{rss:.1f},,\n")
                for name, pid in self.trees.items():
                    cpu_s = sum(tree_times(pid, self._seen[name]).values())
                    prev = last.get(-pid, cpu_s)
                    last[-pid] = cpu_s
                    f.write(f"{stamp},{name},{100 * (cpu_s - prev) / dt:.1f},,,\n")
                busy, total = _host_cpu()
                share = (busy - host_last[0]) / max(total - host_last[1], 1)
                host_last = (busy, total)
                rx, tx = _net_bytes()
                f.write(
                    f"{stamp},host,{100 * share * len(os.sched_getaffinity(0)):.1f},,"
                    f"{(rx - net_last[0]) / dt / 1e6:.3f},{(tx - net_last[1]) / dt / 1e6:.3f}\n"
                )
                net_last = (rx, tx)
                f.flush()
            self._cumulative(cpu, int(time.time() * 1000))
            if links is not None:
                self._links(links)
                self._qdisc("end")

    def _qdisc(self, when: str) -> None:
        """The shaping qdiscs' counters (sent, drops, overlimits) into qdisc.json."""
        path = self.path.with_name("qdisc.json")
        data = json.loads(path.read_text()) if path.exists() else {}
        data[when] = {f"{h}/{d}": v for (h, d), v in self.emulation.qdisc_stats().items()}
        path.write_text(json.dumps(data, indent=1))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)
