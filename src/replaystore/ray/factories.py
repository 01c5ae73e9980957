"""The ``tables=`` argument of :func:`~replaystore.ray.serve`, checked before Ray starts.

A service builds its tables itself (in the actor, again after every restart), so ``tables=`` takes
*factories*: a callable returning a new :class:`~replaystore.Table`, or a dict of them by name.
Passing a Table (or anything else that is not callable) is refused here, at the call that is
wrong, instead of as a ``TypeError`` from inside the start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import InvalidArgument
from ..table import Table


def _check(factory: Any, what: str) -> None:
    if callable(factory) and not isinstance(factory, Table):
        return
    if isinstance(factory, Table):
        raise InvalidArgument(
            f"{what} must be a factory returning a Table (the service builds it, again after a "
            f"restart), got a Table instance: pass lambda: rs.Table(...) or functools.partial(rs.Table, ...)"
        )
    raise InvalidArgument(f"{what} must be a factory returning a Table, got {type(factory).__name__} {factory!r}")


def table_factories(tables: Any, default: str) -> dict[str, Callable[[], Table]]:
    """``tables`` as ``{name: factory}`` (``None``: no tables; one factory: the ``default`` table).

    Raises:
        InvalidArgument: ``tables`` (or a value of the dict) is not a callable factory, e.g. a
            Table instance.
    """
    if tables is None:
        return {}
    if isinstance(tables, Mapping):
        for name, factory in tables.items():
            _check(factory, f"tables[{name!r}]")
        return dict(tables)
    _check(tables, "tables")
    return {default: tables}
