"""The online part of the replay service: rollout-buffer methods of :class:`~replaystore.ray.server.ReplayServer`.

A mixin class: the service's actor class inherits these ``online_*`` methods; they act on its
:class:`~replaystore.online.RolloutBuffer` objects by name (``self.online``). One per call of
:data:`replaystore.online.contract.CALLS`, generated (:func:`_dispatch`) but for ``acquire``
(which tries without waiting first) and ``sample`` (which writes a report every
``report_every`` samples). See docs/online.md.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import KeyNotFound, Timeout
from ..online.contract import CALLS
from ..table import contract

if TYPE_CHECKING:
    from ..online import RolloutBuffer


class OnlineService:
    """Rollout-buffer methods of the replay service (mixed into ``ReplayServer``).

    Relies on the service core for ``name``, ``online``, ``_online_report_every``, ``_closed``,
    ``_pool``, ``_check_open()`` and ``_blocking()``.
    """

    name: str
    online: dict[str, RolloutBuffer]
    _online_report_every: dict[str, int | None]
    _closed: bool
    _pool: ThreadPoolExecutor

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...
        async def _blocking(self, fn: Callable, *args: Any, timeout: float | None) -> Any: ...

    def _rollouts(self, name: str) -> RolloutBuffer:
        self._check_open()
        try:
            return self.online[name]
        except KeyError:
            raise KeyNotFound(
                f"service {self.name!r} has no rollout buffer {name!r}; rollout buffers: {sorted(self.online)}"
            ) from None

    async def online_acquire(
        self,
        name: str,
        k: int,
        timeout: float | None,
        holder: str | None,
        overprovision: int = 0,
        tokens: int | None = None,
    ) -> list[int]:
        """``RolloutBuffer.acquire`` (waits in a worker thread, never on the event loop)."""
        buf = self._rollouts(name)
        # validates everything and raises WouldDeadlock; no wait when the budget allows
        got = buf.try_acquire(k, holder=holder, overprovision=overprovision, tokens=tokens)
        if got or (timeout is not None and timeout <= 0):
            if not got:
                raise Timeout(f"{k} tickets of {name!r} not granted (timeout 0)")
            return got
        return await asyncio.get_running_loop().run_in_executor(
            self._pool,
            lambda: buf.acquire(k, timeout=timeout, holder=holder, overprovision=overprovision, tokens=tokens),
        )

    async def online_sample(
        self, name: str, num_groups: int | None, timeout: float | None, tokens: int | None = None
    ) -> Any:
        """``RolloutBuffer.sample`` (waits in a worker thread); reports every ``report_every`` samples."""
        buf = self._rollouts(name)
        batch = await self._blocking(
            lambda timeout: buf.sample(num_groups, timeout=timeout, tokens=tokens), timeout=timeout
        )
        every = self._online_report_every.get(name)
        if every and buf.counters["sample_calls"] % every == 0:
            buf.report()
        return batch

    async def online_version(self, name: str) -> int:
        """The buffer's current policy version."""
        return self._rollouts(name).version

    def _expire_online(self) -> None:
        if not self._closed:
            for b in self.online.values():
                b.expire()


def _dispatch(call: contract.Call) -> Callable:
    """``OnlineService.online_<call>(name, ...)``: the ``RolloutBuffer`` method on buffer ``name``.

    A blocking call runs first without waiting, then in a worker thread (never on the event loop).
    The signature is the buffer method's with ``name`` first.
    """

    async def method(self: OnlineService, name: str, *args: Any, **kwargs: Any) -> Any:
        a = contract.bind(call, args, kwargs)
        fn = getattr(self._rollouts(name), call.name)
        if call.blocking:
            t = a.pop("timeout")
            return await self._blocking(lambda timeout: fn(**a, timeout=timeout), timeout=t)
        return fn(**a)

    sig = call.signature()
    params = list(sig.parameters.values())
    buffer = inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
    method = contract.forwarded(call, method, OnlineService, sig.replace(parameters=[params[0], buffer, *params[1:]]))
    method.__name__ = f"online_{call.name}"
    method.__qualname__ = f"OnlineService.{method.__name__}"
    return method


for _call in CALLS.values():
    if f"online_{_call.name}" not in OnlineService.__dict__:
        setattr(OnlineService, f"online_{_call.name}", _dispatch(_call))
del _call
