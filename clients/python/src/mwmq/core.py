"""What the sync and async clients share, without I/O: their settings (the
addresses and redis-py's keyword arguments for each), the retry budget with
its failover to the next address, and the bookkeeping of a batch of calls
sent on one connection (which were answered, which must be sent again).

The rules, in one place:

- a connection that cannot be made (refused, timed out, a TLS handshake
  that fails) sent nothing: the next address is tried at once, and once
  every address failed the client waits (exponential backoff with jitter)
  and starts again, up to `retries` waits;
- a connection that breaks after a request went out may have run it: the
  request is sent again (on the next address) only if it is repeatable
  (commands.Call.repeatable), else ConnectionLost says that it is unknown
  whether it ran;
- `-TRYAGAIN` is retried on the same address after a wait, for repeatable
  requests, within the same budget;
- a refused login (WRONGPASS, NOAUTH) and every other error reply are
  raised at once.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.backoff import NoBackoff
from redis.retry import Retry

from . import addresses
from .commands import Call
from .errors import ConnectionLost, MwmqError, TryAgain

log = logging.getLogger("mwmq.client")


@dataclass
class Settings:
    """A client's settings: its addresses, what redis-py gets for each, the
    retry budget and whether SENDs without a KEY get one. Its repr leaves out
    redis-py's arguments, which hold the password: an Attempts (and so this)
    is a local of every request, shown by tracebacks that show locals."""

    addresses: list[addresses.Address]
    redis_kwargs: list[dict[str, Any]] = field(repr=False)
    retries: int
    backoff: tuple[float, float]
    auto_key: bool
    socket_timeout: float | None


def settings(
    address: str | Sequence[str],
    *,
    username: str | None,
    password: str | None,
    ssl: bool,
    ssl_ca_certs: str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    socket_timeout: float | None,
    socket_connect_timeout: float | None,
    protocol: int | None,
    max_connections: int | None,
    client_name: str | None,
    retries: int,
    retry_backoff: tuple[float, float],
    auto_key: bool,
    redis_options: dict[str, Any],
) -> Settings:
    listed = [address] if isinstance(address, str) else list(address)
    if not listed:
        raise ValueError("no address given")
    if retries < 0:
        raise ValueError(f"retries is 0 or more, not {retries}")
    parsed = [addresses.parse(a) for a in listed]
    per_address = []
    for a in parsed:
        kw: dict[str, Any] = {
            "host": a.host,
            "port": a.port,
            "username": username if username is not None else a.username,
            "password": password if password is not None else a.password,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
            "socket_keepalive": True,
            "decode_responses": False,
            # The client retries (and fails over) itself: redis-py's own
            # retries would repeat a SEND it cannot know is safe, and a
            # failed login (mwmq counts each one against the address).
            "retry": Retry(NoBackoff(), 0),
            "client_name": client_name,
        }
        if protocol is not None:
            kw["protocol"] = protocol
        if max_connections is not None:
            kw["max_connections"] = max_connections
        if ssl or a.ssl:
            # The certificate and the host name are checked: redis-py 6 and
            # later check both by default, redis-py 5 only the certificate.
            kw.update(
                ssl=True,
                ssl_ca_certs=ssl_ca_certs,
                ssl_certfile=ssl_certfile,
                ssl_keyfile=ssl_keyfile,
                ssl_cert_reqs="required",
                ssl_check_hostname=True,
            )
        kw.update(redis_options)
        per_address.append(kw)
    return Settings(parsed, per_address, retries, retry_backoff, auto_key, socket_timeout)


@dataclass
class Attempts:
    """The retry budget of one request (or batch): which addresses failed
    since the last wait, how many waits were spent."""

    settings: Settings
    command: str = ""
    waits: int = 0
    failed: set[int] = field(default_factory=set)
    last_error: BaseException | None = None

    def connection_failed(self, index: int, error: BaseException) -> tuple[int, float] | None:
        """After address `index` failed: (the address to try next, seconds to
        wait first), or None when the budget is spent."""
        self.last_error = error
        self.failed.add(index)
        n = len(self.settings.addresses)
        untried = [i for i in range(n) if i not in self.failed]
        if untried:
            nxt = next((i for i in untried if i > index), untried[0])
            self._log("%s failed (%s): trying %s", index, error, self.settings.addresses[nxt])
            return nxt, 0.0
        self.failed.clear()
        delay = self._wait()
        if delay is not None:
            self._log("%s failed (%s): trying again in %.2f s", index, error, delay)
        return None if delay is None else ((index + 1) % n, delay)

    def try_again(self, error: BaseException) -> float | None:
        """After `-TRYAGAIN`: seconds to wait, or None when the budget is spent."""
        self.last_error = error
        delay = self._wait()
        if delay is not None:
            log.info(
                "%s: %s: trying again in %.2f s",
                self.command,
                error,
                delay,
                extra={"mwmq_command": self.command, "mwmq_retry": self.waits, "mwmq_error": str(error)},
            )
        return delay

    def _log(self, text: str, index: int, error: BaseException, then: object) -> None:
        address = str(self.settings.addresses[index])
        log.warning(
            f"%s: {text}",
            self.command,
            address,
            error,
            then,
            extra={"mwmq_command": self.command, "mwmq_address": address, "mwmq_retry": self.waits},
        )

    def _wait(self) -> float | None:
        if self.waits >= self.settings.retries:
            return None
        base, cap = self.settings.backoff
        delay = min(cap, base * 2**self.waits) * random.uniform(0.5, 1.0)
        self.waits += 1
        return delay

    def exhausted(self) -> MwmqError:
        """The error once the budget is spent."""
        e = self.last_error
        if isinstance(e, MwmqError):
            return e
        where = ", ".join(str(a) for a in self.settings.addresses)
        tries = f"after {self.waits} retries" if self.waits else "without retries"
        lost = ConnectionLost(f"no answer from {where} {tries}: {e}")
        lost.__cause__ = e
        return lost


class Batch:
    """Calls sent together on one connection, and what became of each: a
    reply, an error (final), or still to send."""

    def __init__(self, calls: Sequence[Call[Any]]):
        self.calls = list(calls)
        self.results: list[Any] = [None] * len(self.calls)
        self.pending: list[int] = list(range(len(self.calls)))

    def args(self) -> list[tuple[Any, ...]]:
        return [self.calls[i].args for i in self.pending]

    def answered(self, replies: list[Any]) -> bool:
        """The replies of the pending calls, in order (an error reply as its
        MwmqError, already translated). True when some came back TRYAGAIN and
        must be sent again."""
        again = []
        for i, reply in zip(self.pending, replies, strict=True):
            if isinstance(reply, TryAgain) and self.calls[i].repeatable:
                again.append(i)
                self.results[i] = reply
            elif isinstance(reply, MwmqError):
                self.results[i] = reply
            else:
                try:
                    self.results[i] = self.calls[i].parse(reply)
                except (ValueError, TypeError, IndexError) as e:
                    self.results[i] = MwmqError(f"unexpected reply {reply!r} to {self.calls[i].args[0]}: {e}")
        self.pending = again
        return bool(again)

    def broke(self, replies: list[Any], address: addresses.Address, error: BaseException) -> None:
        """The connection broke after `replies` (the first pending calls'
        replies) came back: the rest may have run. The repeatable stay
        pending; the others fail with ConnectionLost."""
        done, rest = self.pending[: len(replies)], self.pending[len(replies) :]
        self.pending = done
        again = self.answered(replies)
        pending = list(self.pending) if again else []
        for i in rest:
            call = self.calls[i]
            if call.repeatable:
                pending.append(i)
            else:
                lost = ConnectionLost(
                    f"the connection to {address} broke while {call.args[0]} to {call.args[1]!r} was in "
                    f"flight: whether it ran is unknown (a SEND with a key= is retried safely): {error}"
                )
                lost.__cause__ = error
                self.results[i] = lost
        self.pending = sorted(pending)

    def give_up(self, error: MwmqError) -> None:
        """The budget is spent: every pending call fails with `error` (or the
        TRYAGAIN it last heard)."""
        for i in self.pending:
            if not isinstance(self.results[i], TryAgain):
                self.results[i] = error
        self.pending = []


def first_error(results: list[Any]) -> MwmqError | None:
    return next((r for r in results if isinstance(r, MwmqError)), None)
