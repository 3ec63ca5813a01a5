"""Real hosts over SSH: the same spec, some of its hosts on other machines.

`hosts: {emulation: ssh, ssh: {client0: user@10.0.0.5, ...}}` runs the
processes of the named hosts there and every other one here. For each remote
host the runner (with asyncssh, which drives many connections from one event
loop and needs no ssh binary):

- connects (key authentication; `known_hosts` as given, or the user's);
- checks that memcached is installed there and that mwproxy and mwload are
  the same build as here (`--version`), and copies this machine's binaries
  into the run's remote directory when they are not;
- measures the clock offset (the remote clock against the middle of a round
  trip), so windows from different hosts are compared on one clock;
- starts every process in a session of its own (`setsid`), with a pidfile and
  a time limit (`timeout`), so nothing outlives the run even if this runner
  dies, and its exit status in a file;
- after the run fetches the result files (and logs) into the run directory,
  and removes the remote directory.

Processes started here listen on this machine's address as the remote hosts
see it (`local_addr`, by default the address that routes to the first remote
host), so both sides can reach each other. Every remote host runs a sampler
of its own (`mwsample`, copied there like mwload): CPU seconds per process
and thread class, memory, the host's busy CPU and network, into the same
`cpu.csv` and `resources.csv` as here; after the run its rows are merged into
this run's files on this machine's clock, the host's own rows as
`host:NAME`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mwlab.procs import LabError, Proc, ProcessGroup, binary, note_started, wait_port

# Seconds a remote process may outlive its planned end before `timeout` stops it.
GRACE = 120
# The sampler's name on a remote host (its pid file, stop file, log).
SAMPLER = "mwsample"


def merge_samples(remote: Path, local: Path, host: str, shift_ms: float) -> None:
    """Appends a remote sampler's rows (cpu.csv or resources.csv) to this
    run's file of that name: times moved onto this machine's clock (`shift_ms`,
    the remote clock's offset), the host's own rows named `host:HOST`."""
    if not remote.exists():
        return
    lines = remote.read_text().splitlines()
    if not lines:
        return
    fresh = not local.exists() or local.stat().st_size == 0
    with local.open("a") as f:
        if fresh:
            f.write(lines[0] + "\n")
        for line in lines[1:]:
            stamp, name, rest = line.split(",", 2)
            if not stamp.isdigit():
                continue
            name = f"host:{host}" if name == "host" else name
            f.write(f"{int(stamp) - round(shift_ms)},{name},{rest}\n")


@dataclass
class Destination:
    """How to reach one remote host."""

    host: str
    user: str | None
    port: int
    key: str | None
    known_hosts: str | None

    @staticmethod
    def parse(value: Any) -> Destination:
        if isinstance(value, str):
            value = {"destination": value}
        dest = str(value["destination"])
        user, _, rest = dest.rpartition("@")
        host, port = rest, 22
        if rest.count(":") == 1:
            host, p = rest.split(":")
            port = int(p)
        known = value.get("known_hosts", "default")
        return Destination(
            host,
            user or None,
            int(value.get("port", port)),
            value.get("key"),
            None if known is None else known,
        )


class RemotePopen:
    """A remote process, with the part of `subprocess.Popen`'s interface the runner uses."""

    remote = True
    pid = None

    def __init__(self, remote: Remote, host: str, workdir: str, name: str):
        self.remote, self.host, self.dir, self.name = remote, host, workdir, name
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            out = self.remote.run(self.host, f"cat {self.dir}/{self.name}.rc 2>/dev/null", check=False)
            if out.strip():
                self.returncode = int(out.strip())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.2)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # The process group of `timeout` and the process.
        self.remote.run(
            self.host, f"kill -{int(sig)} -$(cat {self.dir}/{self.name}.pid) 2>/dev/null", check=False
        )

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)
        self.returncode = self.returncode if self.returncode is not None else -9


class Remote:
    """Hosts reached over SSH, and this machine for every other host."""

    def __init__(self, config: dict[str, Any], out: Path | None = None, limit_s: float = 3600):
        cfg = dict(config)
        self.local = cfg.pop("local_addr", None)
        self.dests = {host: Destination.parse(v) for host, v in cfg.items()}
        self.out = out
        self.limit = int(limit_s + GRACE)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="ssh")
        self.conns: dict[str, Any] = {}
        self.dirs: dict[str, str] = {}
        self.bins: dict[tuple[str, str], str] = {}
        self.offsets: dict[str, float] = {}
        self.rtts: dict[str, float] = {}
        self.cores: dict[str, int] = {}
        self.started: list[tuple[str, str, str]] = []
        self.samplers: dict[str, str] = {}

    def _call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> Remote:
        import asyncssh

        self.thread.start()
        try:
            for host, d in self.dests.items():
                opts: dict[str, Any] = {"port": d.port}
                if d.user:
                    opts["username"] = d.user
                if d.key:
                    opts["client_keys"] = [str(Path(d.key).expanduser())]
                if d.known_hosts != "default":
                    opts["known_hosts"] = (
                        None if d.known_hosts is None else str(Path(d.known_hosts).expanduser())
                    )
                try:
                    self.conns[host] = self._call(_connect(d.host, opts), timeout=30)
                except (OSError, asyncssh.Error) as e:
                    raise LabError(f"cannot reach {host} at {d.host}:{d.port} over SSH: {e}") from e
                stamp = f"mwlab-{socket.gethostname()}-{time.time_ns()}"
                self.dirs[host] = f"/tmp/{stamp}"
                self.run(host, f"mkdir -p {self.dirs[host]}/bin")
                self._clock(host)
                self._check_memcached(host)
                self.cores[host] = self._cores(host)
            if self.local is None:
                first = next(iter(self.dests.values()))
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.connect((first.host, first.port))
                    self.local = s.getsockname()[0]
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, host: str, command: str, check: bool = True) -> str:
        """Runs a shell command on `host`; its output."""
        result = self._call(self.conns[host].run(command, check=False))
        if check and result.exit_status != 0:
            raise LabError(f"{host}: `{command}` failed: {(result.stderr or result.stdout or '').strip()}")
        return result.stdout or ""

    def _clock(self, host: str, tries: int = 3) -> None:
        """The offset of `host`'s clock from this machine's: its time less
        the middle of the round trip that read it, from the shortest of a
        few round trips (the offset is known to within half of it, kept as
        `clock_rtt_ms`; a loaded machine lengthens some round trips)."""
        best = (float("inf"), 0.0)
        for _ in range(tries):
            t0 = time.time()
            remote = int(self.run(host, "date +%s%N").strip()) / 1e9
            t1 = time.time()
            if t1 - t0 < best[0]:
                best = (t1 - t0, remote - (t0 + t1) / 2)
        self.rtts[host], self.offsets[host] = best

    def _cores(self, host: str) -> int:
        answer = self.run(host, "nproc", check=False).strip()
        if not answer.isdigit():
            raise LabError(f"{host}: could not count its CPUs (`nproc` answered {answer!r})")
        return int(answer)

    def _check_memcached(self, host: str) -> None:
        answer = self.run(host, "command -v memcached >/dev/null 2>&1 && echo present || echo absent").strip()
        if answer == "absent":
            raise LabError(f"{host}: memcached is not installed there (Debian package memcached)")
        if answer != "present":
            raise LabError(f"{host}: could not check for memcached (the shell answered {answer!r})")

    def _binary(self, host: str, local: str) -> str:
        """The path of `local`'s build on `host`: the same path when it is the
        same version there, else a copy in the run's remote directory."""
        key = (host, local)
        if key in self.bins:
            return self.bins[key]
        if not Path(local).is_file():
            self.bins[key] = local
            return local
        mine = subprocess.run([local, "--version"], capture_output=True, text=True).stdout.strip()
        theirs = self.run(host, f"{shlex.quote(local)} --version 2>/dev/null || true").strip()
        if theirs and theirs == mine:
            self.bins[key] = local
        else:
            target = f"{self.dirs[host]}/bin/{Path(local).name}"
            self._call(self._put(host, local, target), timeout=300)
            self.run(host, f"chmod +x {target}")
            self.bins[key] = target
        return self.bins[key]

    async def _put(self, host: str, local: str, remote: str) -> None:
        async with self.conns[host].start_sftp_client() as sftp:
            await sftp.put(local, remote)

    async def _get(self, host: str, remote: str, local: Path) -> None:
        async with self.conns[host].start_sftp_client() as sftp:
            if await sftp.exists(remote):
                local.parent.mkdir(parents=True, exist_ok=True)
                await sftp.get(remote, str(local), recurse=True)

    # The runner's placement interface.

    def addr(self, host: str) -> str:
        return self.dests[host].host if host in self.dests else self.local

    def start(self, g: ProcessGroup, name: str, host: str, cmd: list[str], port: int | None = None) -> Proc:
        if host not in self.dests:
            return g.start(name, cmd, port, host=self.local)
        work = self.dirs[host]
        args = list(cmd)
        local_bins = {str(binary(b)) for b in ("mwproxy", "mwload") if _built(b)}
        if args[0] in local_bins:
            args[0] = self._binary(host, args[0])
        elif Path(args[0]).name == "memcached":
            args[0] = "memcached"
        out = str(self.out) if self.out else None
        for i, a in enumerate(args):
            if out and a.startswith(out):
                args[i] = work + "/out" + a[len(out) :]
        self._launch(host, name, args)
        self.started.append((host, work, name))
        popen = RemotePopen(self, host, work, name)
        p = Proc(name, popen, port, g.logs / f"{name}.log")
        g.procs.append(p)
        # (Its log is fetched there at the end of the run.)
        note_started(f"{name} on {host}", args, p.log)
        if port is not None:
            try:
                wait_port(port, host=self.dests[host].host, timeout=15)
            except LabError as e:
                raise LabError(f"{name} on {host}: {e}") from e
        return p

    def _launch(self, host: str, name: str, args: list[str]) -> None:
        """Starts `args` on `host` in a session of its own, its pid in NAME.pid,
        stopped by `timeout` at the latest, its exit status in NAME.rc."""
        # `timeout` puts itself and the process in a process group of their
        # own, whose id goes in the pid file: a signal to that group reaches
        # both (`timeout` passes it on), and the shell lives on to write the
        # exit status.
        script = (
            f"timeout --signal=TERM {self.limit} {shlex.join(args)} > {name}.log 2>&1 < /dev/null & "
            f"echo $! > {name}.pid; wait $!; echo $? > {name}.rc"
        )
        line = f"cd {self.dirs[host]} && setsid sh -c {shlex.quote(script)} > /dev/null 2>&1 < /dev/null &"

        self.run(host, line)

    def start_samplers(self, interval_s: float) -> None:
        """A sampler on every remote host, of every process started there."""
        if not _built("mwsample"):
            raise LabError("mwsample is not built: run `cargo build --release` (make run does)")
        for host, work in self.dirs.items():
            exe = self._binary(host, str(binary("mwsample")))
            ms = max(10, round(interval_s * 1000))
            args = [exe, "--dir", work, "--out", f"{work}/sample", "--interval-ms", str(ms)]
            self._launch(host, SAMPLER, args)
            self.samplers[host] = work

    def stop_samplers(self) -> None:
        """Asks every sampler for its last sample and waits (a few seconds at most) for it to end."""
        for host, work in self.samplers.items():
            self.run(host, f"touch {work}/{SAMPLER}.stop", check=False)
        for host, work in self.samplers.items():
            try:
                RemotePopen(self, host, work, SAMPLER).wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.run(host, f"kill -9 -$(cat {work}/{SAMPLER}.pid) 2>/dev/null", check=False)

    def fetch(self, out: Path) -> None:
        """The remote processes' result files and logs, into the run directory;
        the samplers' rows merged into cpu.csv and resources.csv."""
        for host, work, name in self.started:
            self._call(self._get(host, f"{work}/out/{name}", out / name), timeout=300)
            self._call(self._get(host, f"{work}/{name}.log", out / "logs" / f"{name}.log"), timeout=60)
        for host, work in self.samplers.items():
            got = out / "logs" / f"{SAMPLER}-{host}"
            for name in ("cpu.csv", "resources.csv"):
                self._call(self._get(host, f"{work}/sample/{name}", got / name), timeout=60)
                merge_samples(got / name, out / name, host, self.offsets.get(host, 0.0) * 1000)
            self._call(self._get(host, f"{work}/{SAMPLER}.log", got / f"{SAMPLER}.log"), timeout=60)

    def describe(self) -> dict[str, Any]:
        return {
            host: {
                "addr": d.host,
                "ssh_port": d.port,
                "clock_offset_ms": round(self.offsets.get(host, 0.0) * 1000, 3),
                "clock_rtt_ms": round(self.rtts.get(host, 0.0) * 1000, 3),
                "cores": self.cores.get(host),
                "sampled": host in self.samplers,
            }
            for host, d in self.dests.items()
        }

    def close(self) -> None:
        """Stops what still runs remotely, removes the remote directories, disconnects."""
        for host, work, name in [*self.started, *((h, w, SAMPLER) for h, w in self.samplers.items())]:
            with contextlib.suppress(Exception):
                self.run(host, f"kill -9 -$(cat {work}/{name}.pid) 2>/dev/null", check=False)
        self.started.clear()
        self.samplers.clear()
        for host, work in list(self.dirs.items()):
            with contextlib.suppress(Exception):
                self.run(host, f"rm -rf {work}", check=False)
        self.dirs.clear()
        for conn in self.conns.values():
            with contextlib.suppress(Exception):
                self._call(_disconnect(conn), timeout=5)
        self.conns.clear()
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
        if not self.thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


async def _connect(host: str, opts: dict[str, Any]):
    import asyncssh

    return await asyncssh.connect(host, **opts)


async def _disconnect(conn) -> None:
    conn.close()
    await conn.wait_closed()


def _built(name: str) -> bool:
    try:
        binary(name)
    except LabError:
        return False
    return True
