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

import functools
import numbers
from collections.abc import AsyncIterator, Iterable
from typing import Any

from ..online.buffer_trainer import follow_versions
from ..online.contract import CALLS
from ..online.tickets import Ticket
from ..table import contract
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

    # -- the RolloutBuffer's calls: generated from replaystore.online.contract (see _send) -------------------
    def version_of(self, ticket: int) -> int:
        """The policy version ``ticket`` was admitted under (a :class:`Ticket` answers without a call)."""
        if isinstance(ticket, Ticket):
            return ticket.version
        return self._call("online_version_of", ticket)

    @property
    def version(self) -> int:
        """The buffer's policy version (one call)."""
        return self._call("online_version")

    async def versions(
        self, after: int | None = None, timeout: float | None = None, poll: float = 5.0
    ) -> AsyncIterator[int]:
        """An async iterator of version changes (each newer version seen); ends when the service closes.

        Each wait is one Ray call of at most ``poll`` seconds, awaited without blocking the event loop.
        ``rs.Timeout`` if no new version comes within ``timeout`` seconds.
        """
        seen = (await self.actor.online_version.remote(self.buffer)) if after is None else int(after)
        wait = functools.partial(self.actor.online_wait_for_version.remote, self.buffer)
        async for v in follow_versions(wait, seen, timeout, poll, self.buffer):
            yield v


def _send(client: OnlineClient, method: str, call: contract.Call, a: dict[str, Any]) -> Any:
    """``OnlineClient.<call>``: one Ray call of the service's ``online_<call>`` on this client's buffer.

    Sent positionally; tickets go as a list (or one bare ticket); a blocking call waits
    ``timeout`` plus ``rpc_grace``.
    """
    if "tickets" in a:
        a["tickets"] = _tickets(a["tickets"])
    return client._call(method, *a.values(), op_timeout=a["timeout"] if call.blocking else 0.0)


def _tickets(tickets: Any) -> Any:
    """A list of tickets as a list, one bare ticket as itself (the service validates both)."""
    if isinstance(tickets, numbers.Integral) or not isinstance(tickets, Iterable) or isinstance(tickets, (str, bytes)):
        return tickets
    return list(tickets)


contract.forward(OnlineClient, CALLS, send=_send, prefix="online_")

__all__ = ["OnlineClient"]
