"""A small seeded discrete-event simulator, to check the models where no
closed form is at hand (and the closed forms themselves)."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class SimResult:
    throughput: float
    mean_response_time: float
    mean_waiting_time: float


def simulate_mmm(lam: float, mu: float, m: int, customers: int, seed: int = 1) -> SimResult:
    """FCFS M/M/m: mean waiting and response time over `customers` (first 10% discarded)."""
    rng = random.Random(seed)
    free_at = [0.0] * m
    heapq.heapify(free_at)
    t = 0.0
    warm = customers // 10
    waits = resp = 0.0
    first = last = 0.0
    for i in range(customers):
        t += rng.expovariate(lam)
        server_free = heapq.heappop(free_at)
        start = max(t, server_free)
        done = start + rng.expovariate(mu)
        heapq.heappush(free_at, done)
        if i == warm:
            first = t
        if i >= warm:
            waits += start - t
            resp += done - t
            last = t
    n = customers - warm
    return SimResult(n / (last - first), resp / n, waits / n)


def simulate_closed(
    demands: list[float],
    servers: list[int],
    delays: list[bool],
    think: float,
    users: int,
    completions: int,
    seed: int = 1,
) -> SimResult:
    """Closed network: each user thinks (exponential, mean `think`), then visits every
    center once in order (exponential service, mean = demand); FCFS multi-server
    queues or pure delays. Throughput and response time over `completions` cycles."""
    rng = random.Random(seed)
    k = len(demands)
    busy = [0] * k
    waiting: list[list[tuple[int, float]]] = [[] for _ in range(k)]
    events: list[tuple[float, int, str, int, int]] = []
    seq = 0
    started = [0.0] * users

    def push(time: float, kind: str, user: int, center: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (time, seq, kind, user, center))

    def arrive(time: float, user: int, center: int) -> None:
        if center == k:
            push(time + (rng.expovariate(1 / think) if think > 0 else 0.0), "think_done", user, 0)
            return
        if delays[center]:
            push(time + rng.expovariate(1 / demands[center]), "done", user, center)
        elif busy[center] < servers[center]:
            busy[center] += 1
            push(time + rng.expovariate(1 / demands[center]), "done", user, center)
        else:
            waiting[center].append((user, time))

    for u in range(users):
        push(rng.expovariate(1 / think) if think > 0 else 0.0, "think_done", u, 0)
    done_cycles = 0
    warm = completions // 10
    total_r = 0.0
    t_first = t_last = 0.0
    while done_cycles < completions + warm:
        time, _, kind, user, center = heapq.heappop(events)
        if kind == "think_done":
            started[user] = time
            arrive(time, user, 0)
            continue
        if not delays[center]:
            if waiting[center]:
                nxt, _ = waiting[center].pop(0)
                push(time + rng.expovariate(1 / demands[center]), "done", nxt, center)
            else:
                busy[center] -= 1
        if center == k - 1:
            done_cycles += 1
            if done_cycles == warm:
                t_first = time
            if done_cycles > warm:
                total_r += time - started[user]
                t_last = time
        arrive(time, user, center + 1)
    return SimResult(completions / (t_last - t_first), total_r / completions, 0.0)


@dataclass(frozen=True)
class HoldResult:
    throughput: float
    mean_response_time: float
    # From taking a worker to giving it back, and waiting for one.
    mean_hold_time: float
    mean_worker_wait: float


def simulate_hold(
    delay: float,
    cpu_out: float,
    cpu_in: float,
    latency: float,
    cores: int,
    workers: int,
    users: int,
    completions: int,
    seed: int = 1,
) -> HoldResult:
    """A worker pool that holds CPU: each user's request waits `delay`
    (exponential, no resource), runs `cpu_out` on the shared cores, takes a
    worker (FCFS), and while holding it runs `cpu_in` on the same cores and
    waits `latency` (a server's round trip), then gives the worker back and
    starts over (no think time). The cores serve both bursts FCFS. The
    truth, with the workers' holding time containing CPU and waits for a
    core, that the per-point model measures and approximates."""
    rng = random.Random(seed)
    events: list[tuple[float, int, str, int]] = []
    seq = 0
    cpu_busy = pool_busy = 0
    cpu_queue: list[tuple[int, str]] = []
    pool_queue: list[tuple[int, float]] = []
    started, took = [0.0] * users, [0.0] * users

    def push(time: float, kind: str, user: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (time, seq, kind, user))

    def cpu(time: float, user: int, burst: str) -> None:
        nonlocal cpu_busy
        if cpu_busy < cores:
            cpu_busy += 1
            push(time + rng.expovariate(1 / (cpu_out if burst == "out" else cpu_in)), burst, user)
        else:
            cpu_queue.append((user, burst))

    def take(time: float, user: int, since: float) -> None:
        took[user] = time
        waits.append(time - since)
        cpu(time, user, "in")

    for u in range(users):
        push(rng.expovariate(1 / delay) if delay > 0 else 0.0, "delayed", u)
    warm = completions // 10
    done = 0
    resp: list[float] = []
    holds: list[float] = []
    waits: list[float] = []
    t_first = t_last = 0.0
    while done < completions + warm:
        time, _, kind, user = heapq.heappop(events)
        if kind == "delayed":
            cpu(time, user, "out")
            continue
        if kind in ("out", "in"):
            if cpu_queue:
                nxt, burst = cpu_queue.pop(0)
                push(time + rng.expovariate(1 / (cpu_out if burst == "out" else cpu_in)), burst, nxt)
            else:
                cpu_busy -= 1
            if kind == "out":
                if pool_busy < workers:
                    pool_busy += 1
                    take(time, user, time)
                else:
                    pool_queue.append((user, time))
            else:
                push(time + (rng.expovariate(1 / latency) if latency > 0 else 0.0), "back", user)
            continue
        # "back": the reply is in; the worker is free.
        if pool_queue:
            nxt, since = pool_queue.pop(0)
            take(time, nxt, since)
        else:
            pool_busy -= 1
        done += 1
        if done == warm:
            t_first = time
        if done > warm:
            resp.append(time - started[user])
            holds.append(time - took[user])
            t_last = time
        started[user] = time
        push(time + (rng.expovariate(1 / delay) if delay > 0 else 0.0), "delayed", user)
    n = len(resp)
    return HoldResult(n / (t_last - t_first), sum(resp) / n, sum(holds) / n, sum(waits[-n:]) / n)
