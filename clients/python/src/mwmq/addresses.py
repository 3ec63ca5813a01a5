"""Where mwmq listens: `redis://`, `rediss://` (TLS), `mwmq://` and `mwmqs://`
URLs (`mwmq://user:password@host:port`, as Celery's broker URL has it) and
bare `host:port`, each turned into redis-py's connection settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

DEFAULT_PORT = 6380
_TLS = {"rediss", "mwmqs"}
_PLAIN = {"redis", "mwmq"}


@dataclass(frozen=True)
class Address:
    """One mwmq endpoint: host, port, TLS or not, and the credentials its URL
    carried (None when it carried none). Neither its `str` nor its `repr`
    shows the password: both end up in logs and tracebacks."""

    host: str
    port: int
    ssl: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return f"{'rediss' if self.ssl else 'redis'}://{self.host}:{self.port}"


def masked(address: str) -> str:
    """The address with its password, if any, replaced by `***`, to be shown
    in a message (a mistyped URL's error ends up in logs)."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    netloc_end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i != -1:
            netloc_end = min(netloc_end, i)
    netloc, tail = rest[:netloc_end], rest[netloc_end:]
    userinfo, at, hostport = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return address
    user = userinfo.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{hostport}{tail}"


def parse(address: str) -> Address:
    """An Address from a URL or `host:port` (ValueError saying what is wrong,
    without the password)."""
    text = address.strip()
    if "://" not in text:
        text = f"redis://{text}"
    shown = repr(masked(address.strip()))
    u = urlsplit(text)
    scheme = u.scheme.lower()
    if scheme not in _TLS | _PLAIN:
        raise ValueError(
            f"{shown}: the scheme is redis://, rediss://, mwmq:// or mwmqs://, not {u.scheme}://"
        )
    try:
        port = u.port or DEFAULT_PORT
    except ValueError as e:
        raise ValueError(f"{shown}: {e}") from None
    if not u.hostname:
        raise ValueError(f"{shown}: no host")
    # The path (Celery's virtual host `/`, a Redis database number) means nothing to mwmq.
    return Address(
        host=u.hostname,
        port=port,
        ssl=scheme in _TLS,
        username=unquote(u.username) if u.username else None,
        password=unquote(u.password) if u.password is not None else None,
    )
