"""What the sync and async clients share above the wire: their settings
(the one place their keyword arguments are documented), the address in use,
and how a request's calls are made from a method's arguments."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from . import commands as c
from .core import Attempts, Batch, Settings, first_error, settings
from .errors import MwmqError


def new_key() -> str:
    """A KEY for a SEND that did not name one: 32 hex digits of a uuid4."""
    return uuid.uuid4().hex


class ClientBase:
    """The settings and the address in use, shared by Client and AsyncClient."""

    def __init__(
        self,
        address: str | Sequence[str] = "redis://127.0.0.1:6380",
        *,
        username: str | None = None,
        password: str | None = None,
        ssl: bool = False,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        socket_timeout: float | None = None,
        socket_connect_timeout: float | None = 5.0,
        protocol: int | None = None,
        max_connections: int | None = None,
        client_name: str | None = None,
        retries: int = 8,
        retry_backoff: tuple[float, float] = (0.05, 2.0),
        auto_key: bool = True,
        **redis_options: Any,
    ):
        """A connection to mwmq (or to the first of several that answers).

        `address`: a URL (`redis://host:6380`, `rediss://` for TLS,
        `mwmq://user:password@host:6380`) or `host:port`, or a list of them to
        fail over between. `username`/`password` override what a URL carries;
        `ssl*` are redis-py's. `socket_timeout` bounds each reply (None: wait as
        long as it takes; a RECV's `wait_ms` must end before it);
        `socket_connect_timeout` each connection attempt.

        `retries`: how many times a request is tried again after waiting
        (backoff from `retry_backoff[0]` seconds doubling to `retry_backoff[1]`,
        with jitter) when no address answers or mwmq says `-TRYAGAIN`; an
        address that refuses is left for the next one at once. `auto_key`: a
        `send` without `key=` gets a fresh one (uuid4) so that it can be retried
        without being stored twice — mwmq answers a repeated KEY with the first
        id. Without it such a SEND is never retried once sent (TryAgain or
        ConnectionLost is raised). Other keyword arguments go to `redis.Redis`.
        """
        self._settings: Settings = settings(
            address,
            username=username,
            password=password,
            ssl=ssl,
            ssl_ca_certs=ssl_ca_certs,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            protocol=protocol,
            max_connections=max_connections,
            client_name=client_name,
            retries=retries,
            retry_backoff=retry_backoff,
            auto_key=auto_key,
            redis_options=redis_options,
        )
        self._current = 0
        self._setup()

    def _setup(self) -> None:
        """The connections' state, made by each client."""

    @property
    def address(self) -> str:
        """The address in use now."""
        return str(self._settings.addresses[self._current])

    def _move(self, failed: int, to: int) -> None:
        """After address `failed` failed: `to` is used from now on (unless
        another request moved on already)."""
        if self._current == failed:
            self._current = to

    def _fail_over(self, batch: Batch, attempts: Attempts, failed: int, error: BaseException) -> float | None:
        """After a connection to address `failed` could not be made or broke:
        seconds to wait before trying again (on the address now in use), or
        None when the budget is spent and every pending call failed."""
        step = attempts.connection_failed(failed, error)
        if step is None:
            batch.give_up(attempts.exhausted())
            return None
        self._move(failed, step[0])
        return step[1]

    def _send_call(self, queue: str, body: c.Body, key: str | None, **options: Any) -> c.Call[str]:
        if key is None and self._settings.auto_key:
            key = new_key()
        return c.send(queue, body, key=key, **options)

    def _send_many_calls(
        self, queue: str, bodies: Iterable[c.Body], keys: Sequence[str] | None, **options: Any
    ) -> list[c.Call[str]]:
        listed = list(bodies)
        if keys is not None and len(keys) != len(listed):
            raise ValueError(f"{len(keys)} keys for {len(listed)} bodies")
        return [self._send_call(queue, b, keys[n] if keys else None, **options) for n, b in enumerate(listed)]

    def _check_wait(self, wait_ms: int | None) -> None:
        limit = self._settings.socket_timeout
        if wait_ms is not None and limit is not None and wait_ms / 1000 >= limit:
            raise ValueError(f"wait_ms={wait_ms} outlasts socket_timeout={limit} s: the reply would time out")


def all_or_raise(results: list[Any]) -> list[Any]:
    """A batch's results, or its first error raised with `.results` (a value
    or an MwmqError for each call) so the caller sees what went through."""
    err = first_error(results)
    if err is not None:
        err.results = results  # type: ignore[attr-defined]
        raise err
    return results


def created(result: Any, exist_ok: bool) -> bool:
    """create_queue's answer from QCREATE's result: True, or False when the
    queue existed and `exist_ok`; any other error is raised."""
    if isinstance(result, MwmqError):
        if exist_ok and result.code == "EXISTS":
            return False
        raise result
    return True
