"""mwmq's errors as Python exceptions: one class per error code of
docs/mwmq.md, told apart by the reply's first word, each keeping mwmq's text.

redis-py raises its own classes and strips some codes from the text
(`-ERR`, `-NOPERM`, `-TRYAGAIN`, `-WRONGPASS`, `-NOAUTH`); `from_redis` puts
them back, so `str(e)` is always the reply as mwmq sent it:
`NOQUEUE no such queue 'jobs'`, `ERR syntax error`.
"""

from __future__ import annotations

import redis.exceptions as rex


class MwmqError(Exception):
    """Every error this package raises. `code` is the reply's first word
    (`NOQUEUE`, `ERR`, ...; empty for a connection that was lost), `message`
    the rest of mwmq's text."""

    code = ""

    def __init__(self, message: str, code: str | None = None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{self.code} {message}" if self.code else message)


class BadRequest(MwmqError):
    """`-ERR ...`: a malformed command, a value out of range, a refused option."""

    code = "ERR"


class NoQueue(MwmqError):
    """`-NOQUEUE no such queue 'q'`."""

    code = "NOQUEUE"


class Exists(MwmqError):
    """`-EXISTS queue 'q' already exists`."""

    code = "EXISTS"


class OverQuota(MwmqError):
    """`-OVERQUOTA ...`: a queue's MAXMESSAGES/MAXBYTES, a user's max_queues,
    max_schedules or max_body."""

    code = "OVERQUOTA"


class NoPerm(MwmqError):
    """`-NOPERM User bob has no permissions to ...`: the user lacks the right."""

    code = "NOPERM"


class TryAgain(MwmqError):
    """`-TRYAGAIN ...`: the database did not answer in time, or mwmq is busy
    (its logins queue, a request queue). Retried by the client where that is
    safe (see Client's `retries`); raised once the retries are spent."""

    code = "TRYAGAIN"


class AuthError(MwmqError):
    """A login refused, or a command before one."""


class LoginThrottled(AuthError):
    """`-ERR too many failed logins ...; retry in N s`: this source, this user
    name or this connection failed to log in too often; the text says when to
    try again."""

    code = "ERR"


class WrongPass(AuthError):
    """`-WRONGPASS invalid username-password pair or user is disabled.`"""

    code = "WRONGPASS"


class NoAuth(AuthError):
    """`-NOAUTH Authentication required.`: the server has users and this
    client gave none."""

    code = "NOAUTH"


class WrongType(MwmqError):
    """`-WRONGTYPE ...`: a queue command on a stream or the other way round."""

    code = "WRONGTYPE"


class ConnectionLost(MwmqError, ConnectionError):
    """No address answered (after the retries), or the connection broke while
    a request that may not be repeated was in flight (a SEND without a KEY:
    whether it was stored is unknown)."""


# The codes redis-py leaves in the text, and the class of each.
_BY_CODE: dict[str, type[MwmqError]] = {
    cls.code: cls for cls in (NoQueue, Exists, OverQuota, NoPerm, TryAgain, WrongPass, NoAuth, WrongType)
}
# Other codes mwmq (or a Redis stream command) may answer; raised as MwmqError with the code.
_OTHER_CODES = {"NOPROTO", "CROSSSLOT", "BUSYGROUP", "NOGROUP"}


def from_reply(text: str) -> MwmqError:
    """The exception for an error reply's text as mwmq sent it (`NOQUEUE no such queue 'q'`)."""
    code, _, rest = text.partition(" ")
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(rest)
    if code in _OTHER_CODES:
        return MwmqError(rest, code)
    if code == "ERR":
        return BadRequest(rest)
    return BadRequest(text)


def from_redis(e: rex.RedisError) -> MwmqError:
    """The exception for an error reply redis-py raised (a ResponseError or one
    of its subclasses, or AuthenticationError at login)."""
    text = str(e)
    if isinstance(e, rex.NoPermissionError):
        return NoPerm(text)
    if isinstance(e, rex.TryAgainError):
        return TryAgain(text)
    if isinstance(e, rex.AuthenticationError):
        # redis-py raises it for WRONGPASS and NOAUTH alike, without the code.
        if "Authentication required" in text or "already authenticated" in text:
            return NoAuth(text)
        return WrongPass(text)
    if "too many failed logins" in text:
        return LoginThrottled(text)
    code = text.partition(" ")[0]
    if code in _BY_CODE or code in _OTHER_CODES:
        return from_reply(text)
    # redis-py strips `ERR ` (and leaves a code it does not know in the text).
    return BadRequest(text)


def is_connection_error(e: BaseException) -> bool:
    """A failure of the connection itself (to try another address), not a
    refusal by the server."""
    if isinstance(e, (rex.AuthenticationError, rex.AuthorizationError)):
        return False
    return isinstance(e, (rex.ConnectionError, rex.TimeoutError, OSError))
