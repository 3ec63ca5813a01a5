"""The mapping of error replies to exception classes, for each form redis-py
raises them in (its own class with the code dropped, or a ResponseError
with the code kept). The live refusals are in test_client.py; these cover
what a test cannot provoke without locking the loopback address out
(a throttled login) and the forms of the other protocol version."""

from __future__ import annotations

import pytest
import redis.exceptions as rex

import mwmq
from mwmq.errors import from_redis, from_reply


@pytest.mark.parametrize(
    ("error", "cls", "text"),
    [
        (rex.ResponseError("NOQUEUE no such queue 'q'"), mwmq.NoQueue, "NOQUEUE no such queue 'q'"),
        (
            rex.ResponseError("EXISTS queue 'q' already exists"),
            mwmq.Exists,
            "EXISTS queue 'q' already exists",
        ),
        (rex.ResponseError("OVERQUOTA queue 'q' is full"), mwmq.OverQuota, "OVERQUOTA queue 'q' is full"),
        (
            rex.NoPermissionError("User bob has no permissions"),
            mwmq.NoPerm,
            "NOPERM User bob has no permissions",
        ),
        (
            rex.TryAgainError("the database did not answer"),
            mwmq.TryAgain,
            "TRYAGAIN the database did not answer",
        ),
        (
            rex.AuthenticationError("invalid username-password pair"),
            mwmq.WrongPass,
            "WRONGPASS invalid username-password pair",
        ),
        (rex.AuthenticationError("Authentication required."), mwmq.NoAuth, "NOAUTH Authentication required."),
        (
            rex.ResponseError("WRONGTYPE Operation against a key"),
            mwmq.WrongType,
            "WRONGTYPE Operation against a key",
        ),
        (
            rex.ResponseError("PRIORITY must be between 0 and 9"),
            mwmq.BadRequest,
            "ERR PRIORITY must be between 0 and 9",
        ),
        (rex.ResponseError("syntax error"), mwmq.BadRequest, "ERR syntax error"),
        (
            rex.ResponseError("too many failed logins from 10.0.0.7; retry in 3 s"),
            mwmq.LoginThrottled,
            "ERR too many failed logins from 10.0.0.7; retry in 3 s",
        ),
    ],
)
def test_each_reply_maps_to_its_class_with_mwmqs_text(error: rex.RedisError, cls: type, text: str):
    e = from_redis(error)
    assert type(e) is cls and str(e) == text and isinstance(e, mwmq.MwmqError)


def test_replies_as_sent():
    assert isinstance(from_reply("NOPERM User bob ..."), mwmq.NoPerm)
    assert isinstance(from_reply("ERR syntax error"), mwmq.BadRequest)
    e = from_reply("NOPROTO sorry")
    assert type(e) is mwmq.MwmqError and e.code == "NOPROTO" and str(e) == "NOPROTO sorry"
    assert issubclass(mwmq.ConnectionLost, ConnectionError)
    assert issubclass(mwmq.WrongPass, mwmq.AuthError) and issubclass(mwmq.LoginThrottled, mwmq.AuthError)
