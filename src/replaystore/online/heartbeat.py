"""KeepAlive: renew a producer's tickets in the background while it generates.

A ticket acquired with a time-to-live is abandoned when its holder stops renewing it (a producer
that died gives its permission back). A live producer whose rollouts take longer than the TTL
renews from a daemon thread:

```python
[t] = buf.acquire(1, timeout=60)              # or an OnlineClient
with KeepAlive(buf, [t], every=10.0):
    for c in generate(prompt):
        buf.add(c, group=t)
```
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from ..errors import InvalidRequest, ReplayError

log = logging.getLogger("replaystore")


class KeepAlive:
    """Calls ``owner.renew(tickets)`` every ``every`` seconds until closed (a context manager).

    Args:
        owner: anything with ``renew(tickets)``: a RolloutBuffer, a StalenessBudget, an OnlineClient.
        tickets: the tickets to keep.
        every: seconds between renewals (a third of the TTL is a good choice).

    Renewal stops by itself when a ticket is no longer held (the group completed, or it expired);
    other errors are logged and renewal goes on. ``close()`` is idempotent and waits for the thread.
    """

    def __init__(self, owner: Any, tickets: Iterable[int], every: float) -> None:
        if not every > 0:
            raise InvalidRequest(f"every must be > 0 seconds, got {every!r}")
        self.owner, self.tickets, self.every = owner, list(tickets), float(every)
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replaystore-keepalive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.owner.renew(self.tickets)
                self.renewals += 1
            except KeyError:  # UnknownTicket: finished or expired; nothing left to keep
                return
            except ReplayError as e:  # Timeout, Closed: the owner is unreachable or gone
                log.warning("keep-alive of tickets %s: %s", self.tickets[:5], e)
                if type(e).__name__ == "Closed":
                    return

    def close(self) -> None:
        """Stop renewing (idempotent)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self.every + 5.0)

    def __enter__(self) -> "KeepAlive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["KeepAlive"]
