"""Makes kombu (and so Celery) know the `mwmq://` and `mwmqs://` broker URLs
in every process of an environment where the mwmq package is installed,
without a line in the application: `mwmq-kombu.pth` imports this module at
interpreter startup, and it adds the schemes to kombu's transport table
(`kombu.transport.TRANSPORT_ALIASES`) as soon as kombu loads that table.

kombu has no plugin registry for transports (no entry point group: a URL's
scheme is looked up in that dict and nowhere else), so a package can only
add itself to the dict. Importing kombu here would cost every Python process
of the environment kombu's import time; instead this installs a finder that
waits for `kombu.transport`, adds the aliases right after that module runs,
and removes itself. Until then it costs one string comparison per import.
It imports nothing but the standard library, and never the mwmq package
(whose import pulls in redis-py).

`python -S`, or an environment that does not process .pth files, skips it;
`import mwmq.kombu` registers the schemes as well.
"""

from __future__ import annotations

import sys

# Not `typing.TYPE_CHECKING`: importing typing (and importlib.abc) here would
# cost every interpreter start several milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

ALIASES = {"mwmq": "mwmq.kombu:Transport", "mwmqs": "mwmq.kombu:Transport"}
TARGET = "kombu.transport"


def register(module: ModuleType) -> None:
    """Adds mwmq's schemes to a loaded kombu.transport (keeping any other
    meaning someone gave them)."""
    aliases = getattr(module, "TRANSPORT_ALIASES", None)
    if isinstance(aliases, dict):
        for scheme, path in ALIASES.items():
            aliases.setdefault(scheme, path)


class _Finder:
    """A meta path finder (importlib.abc.MetaPathFinder's protocol) that
    finds nothing itself: it lets the other finders find kombu.transport and
    runs `register` after the module's code."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> ModuleSpec | None:
        if fullname != TARGET:
            return None
        self.remove()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        own = vars(loader).get("exec_module") if hasattr(loader, "__dict__") else None

        def exec_and_register(module: ModuleType) -> None:
            # Put the loader back as it was first: it may load other modules.
            if own is None:
                del loader.exec_module
            else:
                loader.exec_module = own
            exec_module(module)
            register(module)

        # On this loader object only, not its class, and until it has run (a
        # loader that takes no attributes is left alone: kombu loads as usual).
        import contextlib  # here, not at interpreter start: kombu is being imported

        with contextlib.suppress(AttributeError):
            loader.exec_module = exec_and_register  # type: ignore[union-attr]
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def install() -> None:
    """Registers at once if kombu.transport is loaded, else when it is."""
    loaded = sys.modules.get(TARGET)
    if loaded is not None:
        register(loaded)
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
