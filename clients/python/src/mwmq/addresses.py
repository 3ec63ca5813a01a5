"""Where mwmq listens: `redis://`, `rediss://` (TLS), `mwmq://` and `mwmqs://`
URLs (`mwmq://user:password@host:port`, as Celery's broker URL has it) and
bare `host:port`, each turned into redis-py's connection settings."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

DEFAULT_PORT = 6380
_TLS = {"rediss", "mwmqs"}
_PLAIN = {"redis", "mwmq"}


@dataclass(frozen=True)
class Address:
    """One mwmq endpoint: host, port, TLS or not, and the credentials its URL
    carried (None when it carried none)."""

    host: str
    port: int
    ssl: bool = False
    username: str | None = None
    password: str | None = None

    def __str__(self) -> str:
        return f"{'rediss' if self.ssl else 'redis'}://{self.host}:{self.port}"


def parse(address: str) -> Address:
    """An Address from a URL or `host:port` (ValueError saying what is wrong)."""
    text = address.strip()
    if "://" not in text:
        text = f"redis://{text}"
    u = urlsplit(text)
    scheme = u.scheme.lower()
    if scheme not in _TLS | _PLAIN:
        raise ValueError(
            f"{address!r}: the scheme is redis://, rediss://, mwmq:// or mwmqs://, not {u.scheme}://"
        )
    try:
        port = u.port or DEFAULT_PORT
    except ValueError as e:
        raise ValueError(f"{address!r}: {e}") from None
    if not u.hostname:
        raise ValueError(f"{address!r}: no host")
    # The path (Celery's virtual host `/`, a Redis database number) means nothing to mwmq.
    return Address(
        host=u.hostname,
        port=port,
        ssl=scheme in _TLS,
        username=unquote(u.username) if u.username else None,
        password=unquote(u.password) if u.password is not None else None,
    )
