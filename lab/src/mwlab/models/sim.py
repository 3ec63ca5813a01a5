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
