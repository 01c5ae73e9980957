"""OnlineClient: producers and trainers of a rollout buffer hosted by the replay service.

The same API as :class:`~replaystore.online.RolloutBuffer`, one Ray call per method; picklable, so
pass it to producer actors. Errors come back as themselves (``InvalidRequest``, ``UnknownTicket``,
``Timeout``, ``Closed``).

```python
svc = rsr.serve(name="rl", online={"rollouts": RolloutBufferConfig(4096, batch_size=8, max_staleness=1,
                                                                   group_size=4, ticket_ttl=60, path="/data/rl")})
oc = svc.online("rollouts")
[t] = oc.acquire(1, timeout=60, holder="gen-0")  # producer; t.version: its admission version
oc.add_group(t, completions, versions=(t.version, oc.version))   # one call for the whole group
batch = oc.sample(8, timeout=60)                # trainer: a RolloutBatch of whole groups
oc.set_version(v + 1)
```

Producers that continue or interrupt rollouts under new weights wait for a version
(``oc.wait_for_version(v, timeout)``, waiting in the service's worker threads) or follow them
(``async for v in oc.versions(): ...``).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import AsyncIterator, Hashable, Iterable, Sequence
from typing import Any

from ..errors import Closed, Timeout
from ..online.groups import RolloutBatch
from ..online.tickets import Ticket
from ._runtime import get, rpc_timeout


class OnlineClient:
    """Client of one rollout buffer of a replay service (see the module doc).

    Args:
        actor: the service's actor handle.
        name: the service's name.
        buffer: the rollout buffer's name in the service.
        rpc_grace: seconds to wait for calls that never block, and beyond a blocking call's timeout.
    """

    def __init__(self, actor: Any, name: str, buffer: str, rpc_grace: float | None = 60.0) -> None:
        self.actor = actor
        self.name = name
        self.buffer = buffer
        self.rpc_grace = rpc_grace

    def __reduce__(self) -> tuple:
        return (OnlineClient, (self.actor, self.name, self.buffer, self.rpc_grace))

    def __repr__(self) -> str:
        return f"OnlineClient(service={self.name!r}, buffer={self.buffer!r})"

    def _call(self, method: str, *args: Any, op_timeout: float | None = 0.0) -> Any:
        return get(
            getattr(self.actor, method).remote(self.buffer, *args),
            rpc_timeout(op_timeout, self.rpc_grace),
            f"{self.name}.{method}({self.buffer!r})",
        )

    # -- producers ------------------------------------------------------------------------------------------
    def acquire(
        self,
        k: int = 1,
        timeout: float | None = None,
        holder: str | None = None,
        overprovision: int = 0,
        tokens: int | None = None,
    ) -> list[Ticket]:
        """``k`` tickets (carrying ``.version``), waiting while the budget is spent.

        ``rs.Timeout`` after ``timeout``; see :meth:`RolloutBuffer.acquire` for ``overprovision``,
        ``tokens`` and ``rs.WouldDeadlock``.
        """
        return self._call("online_acquire", k, timeout, holder, overprovision, tokens, op_timeout=timeout)

    def try_acquire(
        self, k: int = 1, holder: str | None = None, overprovision: int = 0, tokens: int | None = None
    ) -> list[Ticket]:
        """``k`` tickets if the budget allows them now, else ``[]``."""
        return self._call("online_try_acquire", k, holder, overprovision, tokens)

    def held(self, ticket: int) -> bool:
        """Whether ``ticket`` is held now (expiry judged by the service's clock at the call)."""
        return self._call("online_held", ticket)

    def version_of(self, ticket: int) -> int:
        """The policy version ``ticket`` was admitted under (a :class:`Ticket` answers without a call)."""
        if isinstance(ticket, Ticket):
            return ticket.version
        return self._call("online_version_of", ticket)

    def renew(self, tickets: Any) -> None:
        """Restart the tickets' time-to-live (heartbeat); one ticket or a list."""
        self._call("online_renew", _tickets(tickets))

    def abandon(self, tickets: Any) -> None:
        """Give tickets back (one or a list); their pending groups are dropped."""
        self._call("online_abandon", _tickets(tickets))

    def finish(self, tickets: Any, accepted: bool = True) -> None:
        """End tickets whose rollouts are stored elsewhere (e.g. the fragment buffer)."""
        self._call("online_finish", _tickets(tickets), bool(accepted))

    def discard(self, n: int) -> None:
        """``n`` accepted rollouts stored elsewhere left untrained: give their budget back."""
        self._call("online_discard", n)

    def cancel_slowest(self, n: int, holder: str | None = None) -> list[int]:
        """Cancel up to ``n`` held tickets, longest-running first; returns their ids."""
        return self._call("online_cancel_slowest", n, holder)

    def pause(self) -> None:
        """Stop admitting producers until :meth:`resume` (``InvalidRequest`` if already paused)."""
        self._call("online_pause")

    def resume(self) -> None:
        """Admit producers again (``InvalidRequest`` if not paused)."""
        self._call("online_resume")

    def add(
        self,
        data: Any,
        group: Hashable | None = None,
        versions: Any = None,
        length: int | None = None,
        group_size: int | None = None,
        index: int | None = None,
    ) -> str:
        """Add a rollout to its group; ``"pending"``, ``"complete"`` or ``"stale"``.

        With ``index`` (the member's index in its group) a retried call adds nothing twice.
        """
        return self._call("online_add", data, group, versions, length, group_size, index)

    def add_group(
        self,
        group: Hashable,
        completions: Sequence[Any],
        versions: Any = None,
        lengths: Sequence[int] | None = None,
        group_size: int | None = None,
        indices: Sequence[int] | None = None,
        member_versions: Sequence[Any] | None = None,
    ) -> str:
        """A whole group in one call and one journal transaction; idempotent (a retry adds nothing twice)."""
        return self._call(
            "online_add_group", group, completions, versions, lengths, group_size, indices, member_versions
        )

    def reject(self, group: Hashable, reason: str) -> None:
        """Drop a scored group (or a held ticket's future group), counted by ``reason``; its budget comes back."""
        self._call("online_reject", group, reason)

    # -- trainers ----------------------------------------------------------------------------------------------
    def sample(
        self, num_groups: int | None = None, timeout: float | None = None, tokens: int | None = None
    ) -> RolloutBatch:
        """``num_groups`` whole groups, or groups until ``tokens`` (``rs.Timeout`` after ``timeout``)."""
        return self._call("online_sample", num_groups, timeout, tokens, op_timeout=timeout)

    def set_version(self, version: int) -> int:
        """Set the policy version; returns how many groups were dropped as stale."""
        return self._call("online_set_version", int(version))

    @property
    def version(self) -> int:
        """The buffer's policy version (one call)."""
        return self._call("online_version")

    def wait_for_version(self, version: int, timeout: float | None = None) -> int:
        """Wait until the policy version is at least ``version``; returns the version then.

        Waits in a worker thread of the service; ``rs.Timeout`` after ``timeout``.
        """
        return self._call("online_wait_for_version", version, timeout, op_timeout=timeout)

    async def versions(
        self, after: int | None = None, timeout: float | None = None, poll: float = 5.0
    ) -> AsyncIterator[int]:
        """An async iterator of version changes (each newer version seen); ends when the service closes.

        Each wait is one Ray call of at most ``poll`` seconds, awaited without blocking the event loop.
        ``rs.Timeout`` if no new version comes within ``timeout`` seconds.
        """
        seen = (await self.actor.online_version.remote(self.buffer)) if after is None else int(after)
        while True:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                step = poll if deadline is None else min(poll, max(0.0, deadline - time.monotonic()))
                try:
                    v = await self.actor.online_wait_for_version.remote(self.buffer, seen + 1, step)
                    break
                except Closed:
                    return
                except Timeout:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise
            seen = v
            yield v

    def stats(self) -> dict[str, Any]:
        """The buffer's stats (totals)."""
        return self._call("online_stats")

    def report(self) -> dict[str, float]:
        """The window's scalars since the last report (also written to the service's sinks)."""
        return self._call("online_report")

    def close(self) -> None:
        """Close this rollout buffer (its waiting and later calls raise ``rs.Closed``); the service goes on."""
        self._call("online_close")

    def expire(self) -> None:
        """Run the buffer's expiry now."""
        self._call("online_expire")


def _tickets(tickets: Any) -> Any:
    """A list of tickets as a list, one bare ticket as itself (the service validates both)."""
    if isinstance(tickets, numbers.Integral) or not isinstance(tickets, Iterable) or isinstance(tickets, (str, bytes)):
        return tickets
    return list(tickets)


__all__ = ["OnlineClient"]
