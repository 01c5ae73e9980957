"""WalConfig: how the Tables of a replay service are logged (``serve(..., wal=WalConfig(...))``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import InvalidArgument

FsyncPolicy = Literal["always", "interval", "never"]


@dataclass(frozen=True)
class WalConfig:
    """Write-ahead logging of the Tables of a replay service (``serve(..., wal=WalConfig(...))``).

    Args:
        dir: directory of the logs; table ``t`` logs to ``<dir>/<t>/``.
        fsync: ``"always"`` (fsync once per group commit, before any call in the group returns),
            ``"interval"`` (write per group, fsync every ``interval`` seconds) or ``"never"``.
        interval: seconds between fsyncs with ``"interval"``.
        log_samples: log what samples change (``times_sampled``, retirements by
            ``max_times_sampled``, the sampler's epoch, the rate limiter's sample count). Off:
            samples are not delayed by the log, and a restart forgets them.
        max_log_bytes: when a table's log grows past this many bytes the service checkpoints the
            table (needs ``checkpoint_dir``), which truncates its log (``None``: only the
            service's ``checkpoint_period`` and explicit ``save()`` calls do).
        retry_period: after a failed write, retry the queued records this often (seconds).
    """

    dir: str
    fsync: FsyncPolicy = "always"
    interval: float = 0.05
    log_samples: bool = True
    max_log_bytes: int | None = 256 << 20
    retry_period: float = 0.5

    def __post_init__(self) -> None:
        if self.fsync not in ("always", "interval", "never"):
            raise InvalidArgument(f"fsync must be 'always', 'interval' or 'never', got {self.fsync!r}")
        if not self.interval > 0:
            raise InvalidArgument(f"interval must be > 0, got {self.interval}")
        if not self.retry_period > 0:
            raise InvalidArgument(f"retry_period must be > 0, got {self.retry_period}")
        if self.max_log_bytes is not None and self.max_log_bytes <= 0:
            raise InvalidArgument(f"max_log_bytes must be positive or None, got {self.max_log_bytes}")
