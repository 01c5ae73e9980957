"""The online part of the replay service: rollout-buffer methods of :class:`~replaystore.ray.server.ReplayServer`.

A mixin class: the service's actor class inherits these ``online_*`` methods; they act on its
:class:`~replaystore.online.RolloutBuffer` objects by name (``self.online``). See docs/online.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import KeyNotFound, Timeout

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

    async def online_try_acquire(
        self, name: str, k: int, holder: str | None, overprovision: int = 0, tokens: int | None = None
    ) -> list[int]:
        """``RolloutBuffer.try_acquire``."""
        return self._rollouts(name).try_acquire(k, holder=holder, overprovision=overprovision, tokens=tokens)

    async def online_held(self, name: str, ticket: int) -> bool:
        """``RolloutBuffer.held`` (judged by the clock at the call)."""
        return self._rollouts(name).held(ticket)

    async def online_version_of(self, name: str, ticket: int) -> int:
        """``RolloutBuffer.version_of``."""
        return self._rollouts(name).version_of(ticket)

    async def online_renew(self, name: str, tickets: Any) -> None:
        """``RolloutBuffer.renew`` (one ticket or a list)."""
        self._rollouts(name).renew(tickets)

    async def online_abandon(self, name: str, tickets: Any) -> None:
        """``RolloutBuffer.abandon`` (one ticket or a list)."""
        self._rollouts(name).abandon(tickets)

    async def online_finish(self, name: str, tickets: Any, accepted: bool) -> None:
        """``RolloutBuffer.finish`` (budget-only use; one ticket or a list)."""
        self._rollouts(name).finish(tickets, accepted=accepted)

    async def online_cancel_slowest(self, name: str, n: int, holder: str | None) -> list[int]:
        """``RolloutBuffer.cancel_slowest``."""
        return self._rollouts(name).cancel_slowest(n, holder=holder)

    async def online_pause(self, name: str) -> None:
        """``RolloutBuffer.pause``."""
        self._rollouts(name).pause()

    async def online_resume(self, name: str) -> None:
        """``RolloutBuffer.resume``."""
        self._rollouts(name).resume()

    async def online_reject(self, name: str, group: Any, reason: str) -> None:
        """``RolloutBuffer.reject``."""
        self._rollouts(name).reject(group, reason)

    async def online_add_group(
        self,
        name: str,
        group: Any,
        completions: Any,
        versions: Any,
        lengths: Any,
        group_size: Any,
        indices: Any,
        member_versions: Any,
    ) -> str:
        """``RolloutBuffer.add_group``: one call, one journal transaction, idempotent."""
        return self._rollouts(name).add_group(
            group,
            completions,
            versions=versions,
            lengths=lengths,
            group_size=group_size,
            indices=indices,
            member_versions=member_versions,
        )

    async def online_wait_for_version(self, name: str, version: int, timeout: float | None) -> int:
        """``RolloutBuffer.wait_for_version`` (waits in a worker thread)."""
        buf = self._rollouts(name)
        return await self._blocking(lambda timeout: buf.wait_for_version(version, timeout=timeout), timeout=timeout)

    async def online_discard(self, name: str, n: int) -> None:
        """``RolloutBuffer.discard`` (budget-only use)."""
        self._rollouts(name).discard(n)

    async def online_add(
        self, name: str, data: Any, group: Any, versions: Any, length: Any, group_size: Any, index: Any = None
    ) -> str:
        """``RolloutBuffer.add``; returns ``"pending"``, ``"complete"`` or ``"stale"``."""
        return self._rollouts(name).add(
            data, group=group, versions=versions, length=length, group_size=group_size, index=index
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

    async def online_set_version(self, name: str, version: int) -> int:
        """``RolloutBuffer.set_version``; returns groups dropped as stale."""
        return self._rollouts(name).set_version(version)

    async def online_version(self, name: str) -> int:
        """The buffer's current policy version."""
        return self._rollouts(name).version

    async def online_stats(self, name: str) -> dict[str, Any]:
        """``RolloutBuffer.stats``."""
        return self._rollouts(name).stats()

    async def online_report(self, name: str) -> dict[str, float]:
        """``RolloutBuffer.report``: the window's scalars, also written to the service's sinks."""
        return self._rollouts(name).report()

    async def online_close(self, name: str) -> None:
        """``RolloutBuffer.close``: this buffer's waiting and later calls raise ``Closed``; the service goes on."""
        self._rollouts(name).close()

    async def online_expire(self, name: str) -> None:
        """``RolloutBuffer.expire`` now (also runs every ``housekeeping_period``)."""
        self._rollouts(name).expire()

    def _expire_online(self) -> None:
        if not self._closed:
            for b in self.online.values():
                b.expire()
