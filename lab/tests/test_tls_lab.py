"""An experiment with TLS as a factor: clients that log in, mwproxy speaking
TLS to memcached servers started with -Z, and TLS between the clients and
mwproxy off and on; the runner makes the certificates, both points run
without an error, and the configuration each middleware recorded says what
it spoke."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mwlab.analysis import summarize
from mwlab.runner import prepare, run_experiment
from mwlab.spec import parse

SPEC = {
    "name": "tls",
    "topology": {"servers": 2, "middlewares": 1, "threads": 1},
    "middleware": {"engine": "async", "server_tls": True, "auth": True},
    "factors": {"tls": [False, True]},
    "run": {"duration": 1, "warmup": 0.5, "cooldown": 0, "repetitions": 1, "window_ms": 500},
}


def test_tls_as_a_factor_with_logins_and_tls_servers(tmp_path: Path):
    exp = parse(SPEC)
    exp.source = SPEC
    out = run_experiment(exp, prepare(exp, tmp_path))
    summary, _ = summarize(out)
    assert len(summary) == 2 and (summary["status"] == "ok").all(), summary.get("error")
    assert set(summary["tls"]) == {False, True}
    for _, row in summary.iterrows():
        assert row["client_errors"] == 0
        assert row["client_requests"] > 0
    for point, tls in (("tls=False", False), ("tls=True", True)):
        meta = json.loads((out / point / "rep-1" / "mw0" / "summary.json").read_text())["metadata"]
        config = meta["config"]
        assert config["backend"]["tls"] is True, "mwproxy spoke TLS to the servers"
        assert ("cert" in config["tls"]) is tls, config["tls"]
        assert config["auth"]["file"], "clients logged in"


def test_tls_settings_are_refused_where_they_cannot_run():
    with pytest.raises(ValueError, match="system mq has no TLS"):
        parse(
            {
                "name": "x",
                "topology": {"system": "mq", "middlewares": 1, "servers": 1},
                "middleware": {"tls": True},
            }
        )
    with pytest.raises(ValueError, match="nmw must be >= 1"):
        parse({"name": "x", "topology": {"middlewares": 0}, "middleware": {"auth": True}})
