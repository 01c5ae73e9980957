"""RolloutBufferConfig: a RolloutBuffer described as data, for the Ray service (``serve(online=...)``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields

from .buffer import DEFAULT_TICKET_TTL, RolloutBuffer
from .buffer_journal import OnlineJournal

_SERVICE_ONLY = ("path", "clear_on_start", "report_every")  # the fields that are not RolloutBuffer's arguments


@dataclass
class RolloutBufferConfig:
    """The arguments of :class:`~replaystore.online.RolloutBuffer`, plus persistence.

    The attributes not listed below are :class:`RolloutBuffer`'s arguments.

    Attributes:
        path: directory of the buffer's journal (``None``: nothing survives a restart).
        clear_on_start: wipe the journal when the service is first created (never when Ray
            restarts it after a crash).
        report_every: write :meth:`RolloutBuffer.report` to the service's sinks every this many
            samples (``None``: only on request).
    """

    capacity: int
    batch_size: int | None = None
    max_staleness: int | None = None
    pacing: bool | None = None
    drop_stale: bool | None = None
    group_size: int = 1
    pick: str = "fifo"
    staleness_end: str = "min"
    max_reuse: int = 1
    group_timeout: float | None = None
    ticket_ttl: float | None = DEFAULT_TICKET_TTL
    max_running: int | None = None
    batch_tokens: int | None = None
    group_tokens: int | None = None
    length_buckets: Sequence[int] = (16, 64, 256, 1024)
    seed: int | None = None
    path: str | None = None
    clear_on_start: bool = False
    report_every: int | None = None

    def __post_init__(self) -> None:
        if self.path is not None:
            self.path = os.path.abspath(self.path)

    def build(self, name: str, resume: bool = True) -> RolloutBuffer:
        """The buffer (validates every argument); resumes from the journal at ``path`` if any.

        With ``resume=False`` and ``clear_on_start`` the journal is wiped first.
        """
        journal = None
        if self.path is not None:
            journal = OnlineJournal(self.path)
            if not resume and self.clear_on_start:
                journal.clear()
        args = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _SERVICE_ONLY}
        try:
            return RolloutBuffer(**args, journal=journal, name=name)
        except BaseException:
            if journal is not None:
                journal.close()
            raise


__all__ = ["RolloutBufferConfig"]
