"""The report's "Routes: which pool served what", from each run's
`routes.csv` (`mwlab.routes`): per point, every request each pool got
(`stats routes`' pool counters: the clients' requests and the copies
mwproxy made for it — shadows, all-async and all-initial children, warm-up
fills) with its share of the requests the route took, beside the calls the
pool's servers got for clients' requests (`stats backends`: what the
workers carry, never a copy); and the requests that reached each node of
the route tree with their share of the route's — counts from after the
prefill to the end of the clients, summed over repetitions and
middlewares. Written beside the other tables as `route-pools.csv` and
`route-nodes.csv`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mwlab.routes import GAUGES

POOLS_CSV = "route-pools.csv"
NODES_CSV = "route-nodes.csv"


@dataclass
class RouteTables:
    """The section's two tables."""

    pools: pd.DataFrame
    nodes: pd.DataFrame


def read_routes(rdir: Path) -> pd.DataFrame:
    """A run's routes.csv with `count`: what a counter counted while the
    clients ran (after - before; a gauge, such as a migration's phase, as it
    stood at the end)."""
    df = pd.read_csv(rdir / "routes.csv", dtype={"pool": str}, keep_default_na=False)
    # Runs recorded before pools had a kind of their own: `route` rows named `pool:<name>`.
    old = (df["kind"] == "route") & df["name"].str.startswith("pool:")
    df.loc[old, "name"] = df.loc[old, "name"].str.removeprefix("pool:")
    df.loc[old, "pool"] = df.loc[old, "name"]
    df.loc[old, "kind"] = "pool"
    gauge = df["counter"].isin(GAUGES)
    df["count"] = df["after"].where(gauge, df["after"] - df["before"])
    return df


def _ok(rdir: Path) -> bool:
    try:
        return json.loads((rdir / "run.json").read_text()).get("status") == "ok"
    except (OSError, ValueError):
        return False


def tables(result: Path) -> RouteTables | None:
    """The tables of a result directory (None when no run routed), also
    written to route-pools.csv and route-nodes.csv."""
    runs = []
    for path in sorted(result.glob("*/rep-*/routes.csv")):
        if _ok(path.parent):
            df = read_routes(path.parent)
            df.insert(0, "point", path.parent.parent.name)
            runs.append(df)
    if not runs:
        return None
    df = pd.concat(runs, ignore_index=True)
    out = RouteTables(pool_table(df), node_table(df))
    out.pools.to_csv(result / POOLS_CSV, index=False)
    out.nodes.to_csv(result / NODES_CSV, index=False)
    return out


def pool_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per point and pool (in the order of its servers): its servers, every
    request it got — clients' and copies, a multi-key get once per key — and
    their share of the requests the route took (shares add up past 100% where
    requests are copied or sent to several pools), its errors; then what its
    servers got from the workers for clients' requests, copies left out
    (`calls_for_clients`: one per server a request reached, so a multi-get
    split over servers or a replicated set counts once per server) and their
    timeouts."""
    rows = []
    for point, at in df.groupby("point", sort=False):
        root = at.loc[(at["kind"] == "route") & (at["name"] == "route") & (at["counter"] == "requests")]
        routed = root["count"].sum()
        pools, servers = at[at["kind"] == "pool"], at[at["kind"] == "server"]
        for pool in dict.fromkeys([*servers["pool"], *pools["name"]]):
            mine = pools[pools["name"] == pool].groupby("counter")["count"]
            counted = mine.sum()
            theirs = servers[servers["pool"] == pool]
            calls = theirs.groupby("counter")["count"].sum()
            requests = counted.get("requests", float("nan"))
            rows.append(
                {
                    "point": point,
                    "pool": pool,
                    "servers": int(mine.max().get("servers", theirs["name"].nunique())),
                    "requests": requests,
                    "share": requests / routed if routed else float("nan"),
                    "errors": counted.get("errors", float("nan")),
                    "calls_for_clients": int(calls.get("requests", 0)),
                    "timeouts": int(calls.get("timeouts", 0)),
                }
            )
    return pd.DataFrame(rows)


def node_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per point and node of the tree (by its path, in the tree's order): the
    pool it is, if it is one, the requests that reached it and their share of
    the root's, and every other counter it has (errors, failovers, shadow
    copies sent and dropped, ...)."""
    nodes = df[df["kind"] == "route"]
    rows = []
    for point, at in nodes.groupby("point", sort=False):
        grouped = at.groupby(["name", "counter"], sort=False)["count"]
        # Counts add up over repetitions and middlewares; a gauge shows its highest.
        sums, highest = grouped.sum(), grouped.max()
        counted = sums.where(~sums.index.get_level_values("counter").isin(GAUGES), highest)
        root = counted.get(("route", "requests"), 0)
        for name, node in at.groupby("name", sort=False):
            row = {"point": point, "node": name, "pool": node["pool"].iloc[0]}
            requests = int(counted.get((name, "requests"), 0))
            row["requests"] = requests
            row["share"] = requests / root if root else float("nan")
            for counter in dict.fromkeys(node["counter"]):
                if counter != "requests":
                    row[counter] = int(counted[(name, counter)])
            rows.append(row)
    return pd.DataFrame(rows)
