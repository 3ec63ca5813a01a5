"""Link delay where the kernel has no netem: relays that hold data back.

`mwrelay` (this repository's `crates/mwrelay`) is a TCP relay that forwards
every chunk a fixed one-way delay (± jitter) after it arrived, in each
direction. The relays run in the root namespace and listen on the emulated
network's bridge address: for every (connecting host, listening process)
pair whose path has a delay, one relay forwards to the listener, with the
one-way delays of the two hosts' links added up (and their jitters), and the
connecting process is given the relay's address instead of the listener's.
The links' rate shaping still applies: the traffic crosses both hosts' links
as before.

Why not toxiproxy, the well-known latency-injection proxy: it delays in whole
milliseconds only, and added 4.45 ms to a PostgreSQL round trip asked to add
4 (11% over; measured with pgbench, docs/experiments.md); `mwrelay` added
4.17 to 4.25 ms, and takes microseconds.

[`Relays.probe`] measures what a relay with given delays actually adds:
round trips to an echo server through a twin relay against direct ones.
Each relay holds data `held_s` each way (what it was asked for, less its
own overhead): no round trip through it is shorter than twice that, however
loaded the machine, which is what the lab's tests hold it to.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mwlab.procs import LabError, binary, free_port, note_started, wait_port


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}us"


class Relays:
    """The relays of one run."""

    def __init__(self, logs: Path, listen_ip: str):
        self.logs = logs
        self.listen_ip = listen_ip
        self.procs: list[subprocess.Popen] = []
        # (connecting host, upstream) -> (the upstream's host, the relay's address)
        self.routes: dict[tuple[str, str], tuple[str, str]] = {}

    def __enter__(self) -> Relays:
        binary("mwrelay")  # a clear message now if it is not built
        self.logs.mkdir(parents=True, exist_ok=True)
        # What a relay adds with no delay at all (its two extra hops and its
        # wake-ups), taken off the delays it is asked for, as a calibrated
        # emulator does: the link then adds what was configured. The least
        # of 30 echoes, not their median: on a loaded machine the median
        # carries the wake-ups of the moment, and a run calibrated in a busy
        # second would add too little delay all along.
        self.overhead_us = max(self.probe(0.0, stat=min), 0.0)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []

    def relay(self, upstream: str, delay_s: float, jitter_s: float = 0.0, ip: str | None = None) -> str:
        """A relay to `upstream` (host:port) adding `delay_s` each way (less
        half its own measured overhead); its address."""
        port = free_port()
        listen = f"{ip or self.listen_ip}:{port}"
        net = self.held_s(delay_s)
        jitter_s = min(jitter_s, net)
        cmd = [str(binary("mwrelay")), "--listen", listen, "--upstream", upstream, "--delay", _us(net)]
        if os.geteuid() == 0 and shutil.which("chrt"):
            # Real-time priority, as netem's timers fire in the kernel: a relay
            # that waits for a core behind the load adds its wait to the delay
            # (4.7 ms for 4 on two busy cores, 4.2 with it).
            cmd = ["chrt", "--fifo", "1", *cmd]
        if jitter_s:
            cmd += ["--jitter", _us(jitter_s)]
        with (self.logs / f"relay-{port}.log").open("w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        note_started(f"relay-{port}", cmd, self.logs / f"relay-{port}.log")
        try:
            wait_port(port, timeout=10, proc=p, host=listen.rsplit(":", 1)[0])
        except LabError as e:
            raise LabError(f"mwrelay did not listen on {listen}: {e}") from e
        return listen

    def held_s(self, delay_s: float) -> float:
        """How long a relay asked for `delay_s` holds data each way: the
        delay less half its own round-trip overhead."""
        return max(delay_s - getattr(self, "overhead_us", 0.0) / 2e6, 0.0)

    def route(self, src: str, dst: str, upstream: str, delay_s: float, jitter_s: float = 0.0) -> str:
        """The address `src` should use to reach `upstream` on `dst` (one relay per pair)."""
        key = (src, upstream)
        if key not in self.routes:
            self.routes[key] = (dst, self.relay(upstream, delay_s, jitter_s))
        return self.routes[key][1]

    def probe(
        self,
        delay_s: float,
        jitter_s: float = 0.0,
        rounds: int = 30,
        stat: Callable[[list[float]], float] = statistics.median,
    ) -> float:
        """The round-trip time (µs) a relay with these delays adds, measured:
        `stat` (the median) of `rounds` echoes through a twin relay less that
        of the direct ones."""
        return self.probe_times(delay_s, jitter_s, rounds, stat)[0]

    def probe_times(
        self,
        delay_s: float,
        jitter_s: float = 0.0,
        rounds: int = 30,
        stat: Callable[[list[float]], float] = statistics.median,
    ) -> tuple[float, float]:
        """`probe`'s figure, and the shortest round trip through the twin relay (µs)."""
        with _Echo() as echo:
            via = self.relay(echo.addr, delay_s, jitter_s, "127.0.0.1")
            direct = _round_trips(echo.addr, rounds, b"p", b"p")
            relayed = _round_trips(via, rounds, b"p", b"p")
        return (stat(relayed) - stat(direct)) * 1e6, min(relayed) * 1e6


# A PostgreSQL SSLRequest: the server answers one byte at once, before any login.
_PG_PING = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")


def ping(addr: str, kind: str, rounds: int = 20) -> float:
    """The median round trip (seconds) of a request the server at `addr`
    answers at once (`ping_times`)."""
    return statistics.median(ping_times(addr, kind, rounds))


def ping_times(addr: str, kind: str, rounds: int = 20) -> list[float]:
    """Round trips (seconds) of a request the server at `addr` answers at
    once: `version` for memcached, an SSLRequest for PostgreSQL (one
    connection each, timed from the request to the answer, once the backend
    for it has started)."""
    host, port = addr.rsplit(":", 1)
    times = []
    if kind == "memcached":
        times = _round_trips(addr, rounds, b"version\r\n", b"\r\n")
    elif kind == "postgres":
        for _ in range(rounds):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # PostgreSQL starts a backend for each connection; let it be
                # ready (a relay would hide that start in its delay).
                time.sleep(0.02)
                t = time.perf_counter()
                s.sendall(_PG_PING)
                if s.recv(1) not in (b"N", b"S"):
                    raise LabError(f"{addr} did not answer a PostgreSQL SSLRequest")
                times.append(time.perf_counter() - t)
    else:
        raise ValueError(f"no ping for {kind}")
    return times


def _round_trips(addr: str, rounds: int, request: bytes, end: bytes) -> list[float]:
    """`rounds` times on one connection: send `request`, read until the answer
    ends with `end`; the seconds each took."""
    host, port = addr.rsplit(":", 1)
    out = []
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            t = time.perf_counter()
            s.sendall(request)
            got = b""
            while not got.endswith(end):
                more = s.recv(256)
                if not more:
                    raise LabError(f"{addr} closed the connection during a round trip")
                got += more
            out.append(time.perf_counter() - t)
    return out


class _Echo:
    """A one-connection-at-a-time TCP echo server on loopback."""

    def __enter__(self) -> _Echo:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        return self

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while data := conn.recv(64):
                    conn.sendall(data)

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def path_delay(delays: dict[str, tuple[float, float]], a: str, b: str) -> tuple[float, float]:
    """The (delay, jitter) one way between hosts `a` and `b`: their links'
    delays add, and so do their jitters (a bound: the relay draws one jitter
    per chunk and direction)."""
    (da, ja), (db, jb) = delays.get(a, (0.0, 0.0)), delays.get(b, (0.0, 0.0))
    return da + db, ja + jb
