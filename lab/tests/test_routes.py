"""Specs with pools and a route: mwproxy judges the tree, the runner starts
each pool's servers behind it, routes.csv keeps mwproxy's counters, and the
report says which pool served what (real memcached, mwproxy and mwload)."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml

from mwlab import routes
from mwlab.cli import EXPERIMENTS, main
from mwlab.route_report import POOLS_CSV, read_routes
from mwlab.spec import SpecError, load, parse

ROUTED = {
    "name": "routed",
    "topology": {"middlewares": 1, "threads": 1, "virtual_clients": 2},
    "pools": {"hot": {"servers": 1}, "main": {"servers": 1, "hash": "ketama"}},
    "route": {"type": "prefix", "routes": {"hot:": "hot"}, "default": "main"},
    "workload": {"keys": 200},
    "factors": {"key_prefix": ["hot:", "key:"]},
    "run": {
        "duration": 1,
        "warmup": 0.5,
        "cooldown": 0,
        "repetitions": 1,
        "window_ms": 250,
        "reference": False,
    },
}


def write_spec(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def counted(run: Path, kind: str, name: str) -> int:
    """Requests a node or server of routes.csv counted while the clients ran."""
    df = read_routes(run)
    row = df[(df["kind"] == kind) & (df["name"] == name) & (df["counter"] == "requests")]
    assert len(row) == 1, (kind, name, df)
    return int(row["count"].iloc[0])


def test_a_routed_spec_runs_and_the_report_says_which_pool_served_what(tmp_path: Path, capsys):
    results = tmp_path / "results"
    assert main(["run", str(write_spec(tmp_path, ROUTED)), "--results", str(results)]) == 0, (
        capsys.readouterr()
    )
    (out,) = (results / "routed").iterdir()
    hot, rest = out / "key_prefix=hot:" / "rep-1", out / "key_prefix=key:" / "rep-1"
    # mwproxy ran the spec's pools: one server each, the first pool first.
    config = (hot / "logs" / "mw0.toml").read_text()
    assert 'pools."hot"' in config and 'pools."main"' in config
    prefix, default = 'route.routes."hot:"', "route.default"
    # Keys with the prefix all reached the hot pool, through its node; none the main pool.
    assert counted(hot, "route", "route") == counted(hot, "route", prefix) > 0
    assert counted(hot, "route", default) == 0
    assert counted(hot, "server", "mc0") == counted(hot, "route", prefix)
    assert counted(hot, "server", "mc1") == 0
    # And every other key the main pool.
    assert counted(rest, "route", "route") == counted(rest, "route", default) > 0
    assert counted(rest, "route", prefix) == 0
    assert counted(rest, "server", "mc1") == counted(rest, "route", default)
    assert counted(rest, "server", "mc0") == 0
    pools = read_routes(hot)
    assert set(pools.loc[pools["kind"] == "server", "pool"]) == {"hot", "main"}
    assert set(pools.loc[pools["name"] == prefix, "pool"]) == {"hot"}
    # The report's table: pools x points with their shares.
    shares = pd.read_csv(out / POOLS_CSV).set_index(["point", "pool"])["share"]
    assert shares[("key_prefix=hot:", "hot")] == 1.0 and shares[("key_prefix=hot:", "main")] == 0.0
    assert shares[("key_prefix=key:", "main")] == 1.0 and shares[("key_prefix=key:", "hot")] == 0.0
    page = (out / "report.html").read_text()
    assert "Routes: which pool served what" in page and f"<td>{prefix}</td>" in page


def single_run(tmp_path: Path, doc: dict, capsys) -> tuple[Path, Path]:
    """`mwlab run` of a spec of one point: its result directory and its run's."""
    results = tmp_path / "results"
    assert main(["run", str(write_spec(tmp_path, doc)), "--results", str(results)]) == 0, capsys.readouterr()
    (out,) = (results / doc["name"]).iterdir()
    (run,) = out.glob("*/rep-1")
    return out, run


def test_the_pools_table_counts_the_copies_a_shadow_pool_receives(tmp_path: Path, capsys):
    """A pool that only gets shadow copies: the workers send its server
    nothing (`stats backends`), yet its share of the route's requests is
    what the shadow node sent it."""
    doc = copy.deepcopy(ROUTED) | {"name": "shadowed", "factors": {}}
    doc["pools"] = {"main": {"servers": 1}, "shadow": {"servers": 1}}
    doc["route"] = {
        "type": "shadow",
        "main": "main",
        "shadows": [{"route": "shadow", "request_fraction": 0.3}],
    }
    out, run = single_run(tmp_path, doc, capsys)
    pools = pd.read_csv(out / POOLS_CSV).set_index("pool")
    assert pools.loc["shadow", "share"] > 0
    routed = counted(run, "route", "route")
    assert pools.loc["main", "requests"] == routed and pools.loc["main", "share"] == 1.0
    assert pools.loc["main", "calls_for_clients"] == routed, "one server, one key a request"
    assert pools.loc["shadow", "calls_for_clients"] == 0, "the workers carry no copy"
    # Every copy sent is a request the shadow pool got, but those still on their way at a reading.
    raw = pd.read_csv(run / "routes.csv")
    queued = raw[(raw["name"] == "route") & (raw["counter"] == "shadow_queued")][["before", "after"]]
    sent = pd.read_csv(out / "route-nodes.csv").set_index("node").loc["route", "shadow_sent"]
    assert abs(pools.loc["shadow", "requests"] - sent) <= queued.to_numpy().sum(), (sent, pools, queued)
    page = (out / "report.html").read_text()
    assert "calls for clients' requests" in page and "copies mwproxy made for it" in page


def test_prefill_pool_fills_the_warm_pool_so_a_warm_up_route_fills_the_cold_one(tmp_path: Path, capsys):
    """Through the route the prefill would fill `cold` (where a warm-up
    sends sets); `prefill_pool: warm` writes to `warm` directly, so the
    clients' gets miss in `cold`, hit in `warm` and fill `cold`."""
    doc = copy.deepcopy(ROUTED) | {"name": "warming", "factors": {}, "prefill_pool": "warm"}
    doc["pools"] = {"cold": {"servers": 1}, "warm": {"servers": 1}}
    doc["route"] = {"type": "warm-up", "cold": "cold", "warm": "warm", "exptime": 600}
    _, run = single_run(tmp_path, doc, capsys)
    assert 'route = "warm"' in (run / "logs" / "prefill-proxy.toml").read_text()
    df = read_routes(run)
    fills = df[(df["name"] == "route") & (df["counter"] == "fills_sent")]["count"].sum()
    assert fills > 0 and counted(run, "server", "mc1") > 0, df
    assert main(["validate", str(tmp_path / "spec.yaml")]) == 0
    assert "route: warm-up; prefill: warm directly" in capsys.readouterr().out
    # A pool the spec does not declare, or no prefill at all, is refused.
    with pytest.raises(SpecError, match="prefill_pool 'hot' is not a pool of the spec"):
        parse(doc | {"prefill_pool": "hot"})
    with pytest.raises(SpecError, match="prefill is off"):
        parse(doc | {"workload": {"prefill": False}})


def test_a_spec_naming_a_pool_it_does_not_declare_is_refused_before_anything_starts(tmp_path: Path, capsys):
    doc = copy.deepcopy(ROUTED)
    doc["route"]["default"] = "mian"
    spec, results = write_spec(tmp_path, doc), tmp_path / "results"
    for command in (["validate", str(spec)], ["run", str(spec), "--results", str(results)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"{spec}: mwproxy refuses the pools and route" in err, err
        assert 'route.default: unknown pool "mian" (the pools are hot, main)' in err, err
    assert not results.exists()
    # A setting of a pool that mwproxy does not know is mwproxy's to refuse, too.
    doc = copy.deepcopy(ROUTED)
    doc["pools"]["main"]["hash"] = "sha0"
    assert main(["validate", str(write_spec(tmp_path, doc))]) == 2
    assert "sha0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("route"), "pools need a route over them"),
        (lambda d: d.pop("pools"), "a route names pools: declare them under pools"),
        (lambda d: d["topology"].update(middlewares=0), "pools and a route are mwproxy's: nmw must be >= 1"),
        (lambda d: d.update(nsvr=3), r"nsvr\) is 3 but the pools have 2 servers in all"),
        (lambda d: d["pools"]["hot"].update(servers=0), "pool hot: servers is how many memcached servers"),
        (lambda d: d["pools"].update({"a b": {"servers": 1}}), "a pool's name is letters, digits"),
        (lambda d: d.update(replication=2), "replication is each pool's own"),
        (lambda d: d.update(route=["hot", "main"]), "route is one per spec, not a list of levels"),
        (lambda d: d.update(system="mq"), "not with system mq"),
    ],
)
def test_what_the_lab_owns_of_a_route_spec_is_refused_with_a_reason(change, message):
    doc = copy.deepcopy(ROUTED)
    change(doc)
    with pytest.raises(SpecError, match=message):
        parse(doc)


def test_the_shipped_route_example_is_valid_for_mwproxy_at_both_scales():
    for scale in ("quick", "full"):
        exp = load(EXPERIMENTS / "routes-prefix.yaml", scale)
        assert exp.points()[0].settings.topology.servers == 3
        routes.check(exp, "routes-prefix")


def test_every_pool_node_is_named_as_mwproxy_names_it(tmp_path: Path, start_proxy):
    """The lab labels the nodes of `stats routes` that are pools by walking
    the spec's tree as mwproxy names paths: every kind of child, a prefix
    with a quote in it."""
    route = {
        "type": "prefix",
        "default": {"type": "failover", "children": ["a", {"type": "pool", "pool": "b"}]},
        "routes": {
            'x"y:': {
                "type": "operation",
                "get": "a",
                "default": {"type": "all-sync", "children": ["a", "b"]},
            },
            "w:": {"type": "warm-up", "cold": "a", "warm": "b"},
            "s:": {"type": "shadow", "main": "a", "shadows": [{"route": "b", "key_fraction": [0.0, 0.5]}]},
            "m:": {"type": "migrate", "from": "a", "to": "b", "start": 0, "window": 1},
        },
    }
    config = tmp_path / "routes.toml"
    lines = [f"route = {routes.toml_value(route)}"]
    lines += [f'pools.{p} = {{ servers = ["127.0.0.1:{9 + i}"] }}' for i, p in enumerate("ab")]
    config.write_text("\n".join(lines) + "\n")
    proxy = start_proxy(["-c", str(config)])
    named = {
        n.removeprefix("route:").rsplit(":", 1)[0]
        for n, _ in routes.stats(f"127.0.0.1:{proxy.port}", "routes")
    }
    pools = routes.pool_paths(route)
    assert len(pools) == 11 and set(pools) <= named, (sorted(pools), sorted(named))
    assert pools['route.routes."x\\"y:".get'] == "a" and pools["route.default.children[1]"] == "b"
    assert pools['route.routes."s:".shadows[0].route'] == "b"
