"""Experiment specs: aliases, validation, expansion and seeded order."""

from __future__ import annotations

import pytest

from mwlab.spec import (
    ExperimentInfo,
    Middleware,
    Settings,
    SpecError,
    Topology,
    canonical,
    flatten,
    load,
    parse,
    stored_settings,
    with_values,
)


def spec(**extra):
    doc = {"name": "t", "topology": {"servers": 3, "middlewares": 1}}
    doc.update(extra)
    return doc


def test_seed_abbreviations_are_aliases():
    exp = parse(
        spec(
            factors={"vcli": [1, 4], "tmw": [8, 16], "wrkld": ["read-only"], "mgshrd": [True, False]},
            reps=2,
            ttime=5,
            nsvr=3,
        )
    )
    points = exp.points()
    assert len(points) == 2 * 2 * 1 * 2
    p = points[0]
    assert p.get("vcli") == 1 and p.get("tmw") == 8
    assert p.get("wrkld") == "0:1"
    assert {q.get("mgshrd") for q in points} == {"sharded", "non-sharded"}
    assert p.get("run.repetitions") == 2 and p.get("ttime") == 5
    assert len(exp.runs()) == 16


def test_runs_are_shuffled_reproducibly():
    doc = spec(factors={"vcli": [1, 2, 3, 4, 5]}, run={"repetitions": 3, "seed": 7})
    a = [r.key for r in parse(doc).runs()]
    assert a == [r.key for r in parse(doc).runs()]
    assert a != sorted(a)
    doc["run"]["seed"] = 8
    assert a != [r.key for r in parse(doc).runs()]


def test_scales_override_the_defaults():
    doc = spec(factors={"vcli": [1, 2]}, scales={"full": {"factors": {"vcli": [1, 2, 4, 8]}, "ttime": 60}})
    assert len(parse(doc, "quick").points()) == 2
    full = parse(doc, "full")
    assert len(full.points()) == 4 and full.points()[0].get("ttime") == 60
    with pytest.raises(SpecError, match="unknown scale"):
        parse(doc, "huge")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (spec(vclients=3), "unknown setting 'vclients'"),
        (spec(topology={"servers": 2, "sockets": 1}), "unknown setting 'sockets' in topology"),
        (spec(middleware={"replication": 4}), "replication 4 needs at least as many servers"),
        (
            spec(factors={"vcli": [1, 0]}),
            r"point vcli=0: topology.virtual_clients \(vcli\): .* greater than or equal to 1",
        ),
        (spec(factors={"tmw": [1, "2"]}), r"middleware.workers \(tmw\): Input should be a valid integer"),
        (spec(wrkld="mostly-reads"), r"workload.ratio \(wrkld\): must be SETS:GETS"),
        (spec(factors={"tmw": []}), "empty list"),
        (spec(mgshrd="sometimes"), "multiget.*'sharded' or 'non-sharded'"),
        (spec(ttime=0), "duration"),
        ({"topology": {}}, "needs a name"),
        (spec(hosts={"emulation": "docker"}), "hosts.emulation: Input should be 'local', 'netns' or 'ssh'"),
        (spec(hosts={"server_link": "100mbit"}), "server_link need emulated hosts"),
        (spec(hosts={"emulation": "netns", "client_link": "fast"}), "client_link"),
        (spec(hosts={"emulation": "netns", "server_cpus": "half"}), "server_cpus: must be a number"),
        (spec(run={"warmup": "long"}), "run.warmup: must be a number"),
        (spec(workload={"prefill": "yes"}), "workload.prefill: Input should be a valid boolean"),
        (spec(hosts={"emulation": "netns", "server_link": {"sideways": "1mbit"}}), "unknown sideways"),
        (spec(hosts={"emulation": "netns", "server_link": {"up": "0mbit"}}), "must be positive"),
        (spec(hosts={"emulation": "ssh"}), "needs hosts.ssh"),
        (spec(hosts={"emulation": "ssh", "ssh": {"db0": "me@there"}}), "no host 'db0'"),
        (
            spec(hosts={"emulation": "ssh", "ssh": {"client0": {"destination": "a@b", "pass": "x"}}}),
            "unknown keys pass",
        ),
        (spec(hosts={"emulation": "netns", "ssh": {"client0": "a@b"}}), "only read with emulation: ssh"),
    ],
)
def test_bad_specs_are_refused_with_a_reason(doc, message):
    with pytest.raises(SpecError, match=message):
        parse(doc)


def test_every_shipped_experiment_is_valid_at_both_scales():
    from mwlab.cli import EXPERIMENTS

    specs = sorted(EXPERIMENTS.glob("*.yaml"))
    assert len(specs) >= 8
    for path in specs:
        for scale in ("quick", "full"):
            exp = load(path, scale)
            assert exp.points(), path


def test_ssh_hosts_may_name_this_machines_address():
    exp = parse(
        spec(
            hosts={
                "emulation": "ssh",
                "ssh": {
                    "local_addr": "10.0.0.1",
                    "client0": {"destination": "me@10.0.0.5:2200", "key": "~/k"},
                },
            }
        )
    )
    assert exp.points()


def test_a_link_is_one_rate_or_one_per_direction():
    from mwlab.spec import link_rates

    assert link_rates("100mbit") == (100e6, 100e6)
    assert link_rates({"up": "100mbit"}) == (100e6, None)
    assert link_rates({"up": "1gbit", "down": "12mbps"}) == (1e9, 96e6)
    assert link_rates(None) == (None, None)


def test_settings_are_typed_and_read_as_attributes():
    p = parse(spec(tmw=4, engine="async", mgshrd=False, wrkld="write-only")).points()[0]
    s = p.settings
    assert isinstance(s, Settings)
    assert (s.middleware.workers, s.middleware.engine, s.middleware.multiget) == (4, "async", "non-sharded")
    assert (s.workload.ratio, s.topology.servers, s.total_clients) == ("1:0", 3, 2)
    with pytest.raises(ValueError, match="frozen"):
        s.middleware.workers = 5  # type: ignore[misc]
    changed = with_values(s, {"tmw": 16, "middleware.replication": 2})
    assert (changed.middleware.workers, changed.middleware.replication) == (16, 2)
    with pytest.raises(SpecError, match="unknown setting 'bogus'"):
        with_values(s, {"bogus": 1})


def test_stored_settings_come_back_whether_nested_or_dotted():
    s = Settings(topology=Topology(middlewares=1), middleware=Middleware(workers=3, db_pool=2))
    assert stored_settings(s.model_dump(mode="json")) == s
    # Results written before settings were typed stored dotted keys.
    assert stored_settings(flatten(s)) == s
    assert stored_settings({"topology.servers": 2}).topology.servers == 2
    with pytest.raises(SpecError, match=r"unknown setting 'workerz' in middleware; known: engine, threads"):
        stored_settings({"middleware": {"workerz": 1}})
    info = ExperimentInfo.model_validate({"name": "x", "factors": {"middleware.workers": [1, 2]}})
    assert info.columns == ["tmw"] and info.settings == Settings()


def test_points_run_only_the_combinations_named_each_with_its_repetitions():
    doc = {
        "name": "picked",
        "factors": {"vcli": [1, 2, 4], "tmw": [2, 8]},
        "run": {"repetitions": 3},
        "points": [
            {"vcli": 1, "tmw": 2, "repetitions": 2},
            {"virtual_clients": 4, "middleware.workers": 2},
            {"vcli": 2, "tmw": 8, "reps": 5},
        ],
    }
    exp = parse(doc)
    # In the spec's order of combinations, whatever the order of `points:`.
    assert [p.name for p in exp.points()] == ["vcli=1,tmw=2", "vcli=2,tmw=8", "vcli=4,tmw=2"]
    assert [p.settings.run.repetitions for p in exp.points()] == [2, 5, 3]
    assert len(exp.runs()) == 10 and len(exp.all_points()) == 6
    assert exp.info()["points"][0] == {
        "topology.virtual_clients": 1,
        "middleware.workers": 2,
        "run.repetitions": 2,
    }


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ({"vcli": 1}, "a list of points"),
        ([], "a list of points"),
        (["vcli=1"], "a mapping of every factor"),
        ([{"vcli": 1}], "missing tmw"),
        ([{"vcli": 3, "tmw": 2}], r"vcli=3 is not one of its levels \(1, 2\)"),
        ([{"vcli": 1, "tmw": 2, "nsvr": 2}], "nsvr is not a factor of this spec"),
        ([{"vcli": 1, "tmw": 2, "colour": 2}], "unknown setting 'colour'"),
        ([{"vcli": 1, "tmw": 2, "repetitions": 0}], "at least 1"),
        ([{"vcli": 1, "tmw": 2}, {"tmw": 2, "vcli": 1}], r"points\[1\]: named twice"),
    ],
)
def test_bad_points_are_refused_by_position(points, message):
    doc = {"name": "picked", "factors": {"vcli": [1, 2], "tmw": [2, 8]}, "points": points}
    with pytest.raises(SpecError, match=message):
        parse(doc)


def test_a_name_in_two_sections_asks_which():
    with pytest.raises(SpecError, match=r"in more than one section: say which \(middleware.threads"):
        canonical("threads")
    assert canonical("topology.threads") == "topology.threads"
