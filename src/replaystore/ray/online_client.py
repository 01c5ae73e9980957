"""OnlineClient: producers and trainers of a rollout buffer hosted by the replay service.

The same API as :class:`~replaystore.online.RolloutBuffer`, one Ray call per method; picklable, so
pass it to producer actors. Errors come back as themselves (``InvalidRequest``, ``UnknownTicket``,
``Timeout``, ``Closed``).

```python
svc = rsr.serve(name="rl", online={"rollouts": RolloutBufferConfig(4096, batch_size=8, max_staleness=1,
                                                                   group_size=4, ticket_ttl=60, path="/data/rl")})
oc = svc.online("rollouts")
[t] = oc.acquire(1, timeout=60)                 # producer
oc.add(tokens, group=t, versions=(v0, v1), length=len(tokens))
batch = oc.sample(8, timeout=60)                # trainer: a RolloutBatch of whole groups
oc.set_version(v + 1)
```
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from ..online.groups import RolloutBatch
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
        return get(getattr(self.actor, method).remote(self.buffer, *args), rpc_timeout(op_timeout, self.rpc_grace),
                   f"{self.name}.{method}({self.buffer!r})")

    # -- producers ------------------------------------------------------------------------------------------
    def acquire(self, k: int = 1, timeout: float | None = None, holder: str | None = None) -> list[int]:
        """``k`` tickets, waiting while the budget is spent (``rs.Timeout`` after ``timeout``)."""
        return self._call("online_acquire", k, timeout, holder, op_timeout=timeout)

    def try_acquire(self, k: int = 1, holder: str | None = None) -> list[int]:
        """``k`` tickets if the budget allows them now, else ``[]``."""
        return self._call("online_try_acquire", k, holder)

    def renew(self, tickets: Iterable[int]) -> None:
        """Restart the tickets' time-to-live (heartbeat)."""
        self._call("online_renew", list(tickets))

    def abandon(self, tickets: Iterable[int]) -> None:
        """Give tickets back; their pending groups are dropped."""
        self._call("online_abandon", list(tickets))

    def finish(self, tickets: Iterable[int], accepted: bool = True) -> None:
        """End tickets whose rollouts are stored elsewhere (e.g. the fragment buffer)."""
        self._call("online_finish", list(tickets), bool(accepted))

    def discard(self, n: int) -> None:
        """``n`` accepted rollouts stored elsewhere left untrained: give their budget back."""
        self._call("online_discard", n)

    def add(self, data: Any, group: Hashable | None = None, versions: Any = None, length: int | None = None,
            group_size: int | None = None) -> str:
        """Add a rollout to its group; ``"pending"``, ``"complete"`` or ``"stale"``."""
        return self._call("online_add", data, group, versions, length, group_size)

    # -- trainers ----------------------------------------------------------------------------------------------
    def sample(self, num_groups: int, timeout: float | None = None) -> RolloutBatch:
        """``num_groups`` whole groups (``rs.Timeout`` after ``timeout``)."""
        return self._call("online_sample", num_groups, timeout, op_timeout=timeout)

    def set_version(self, version: int) -> int:
        """Set the policy version; returns how many groups were dropped as stale."""
        return self._call("online_set_version", int(version))

    @property
    def version(self) -> int:
        """The buffer's policy version (one call)."""
        return self._call("online_version")

    def stats(self) -> dict[str, Any]:
        """The buffer's stats (totals)."""
        return self._call("online_stats")

    def report(self) -> dict[str, float]:
        """The window's scalars since the last report (also written to the service's sinks)."""
        return self._call("online_report")

    def expire(self) -> None:
        """Run the buffer's expiry now."""
        self._call("online_expire")


__all__ = ["OnlineClient"]
