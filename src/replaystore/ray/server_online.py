"""The online part of the replay service: rollout-buffer methods of :class:`~replaystore.ray.server.ReplayServer`.

A mixin class: the service's actor class inherits these ``online_*`` methods; they act on its
:class:`~replaystore.online.RolloutBuffer` objects by name (``self.online``). One per call of
:data:`replaystore.online.contract.CALLS`, generated (:func:`_serve`) but for ``acquire``
(which tries without waiting first). See docs/online.md.
"""

from __future__ import annotations

import asyncio
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
        async def _blocking(self, fn: Callable, a: dict[str, Any]) -> Any: ...

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

    async def online_version(self, name: str) -> int:
        """The buffer's current policy version."""
        return self._rollouts(name).version

    def _expire_online(self) -> None:
        if not self._closed:
            for b in self.online.values():
                b.expire()


async def _serve(service: OnlineService, call: contract.Call, name: str, a: dict[str, Any]) -> Any:
    """``OnlineService.online_<call>(name, ...)``: the ``RolloutBuffer`` method on buffer ``name``.

    A blocking call runs first without waiting, then in a worker thread (never on the event loop);
    ``sample`` writes the buffer's report every ``report_every`` samples.
    """
    buf = service._rollouts(name)
    fn = getattr(buf, call.name)
    if not call.blocking:
        return fn(**a)
    result = await service._blocking(fn, a)
    every = service._online_report_every.get(name) if call.name == "sample" else None
    if every and buf.counters["sample_calls"] % every == 0:
        buf.report()
    return result


contract.forward(OnlineService, CALLS, serve=_serve, prefix="online_", first="name")
