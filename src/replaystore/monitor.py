"""Monitoring: write a stats dict (``Table.stats()``, the Ray service's stats) to sinks on a period.

A :class:`Sink` (:class:`LoggingSink`, the default; :class:`TensorBoardSink`; :class:`WandbSink`)
takes ``write(scalars, step)`` and ``close()``; :class:`StatsReporter` calls a stats function on a
daemon thread and writes its numeric entries, flattened by :func:`flatten_scalars`, to every sink.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

log = logging.getLogger("replaystore")


def flatten_scalars(stats: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of a (nested) stats dict as ``{"a/b": float}``; other values are dropped."""
    out: dict[str, float] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_scalars(value, name + "/"))
        elif isinstance(value, (int, float)):  # (bools too)
            out[name] = float(value)
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            out[name] = float(value.item())
    return out


def write_sinks(sinks: Iterable[Sink], scalars: dict[str, float], step: int) -> None:
    """``sink.write(scalars, step)`` on every sink in order; a sink that raises is logged and skipped.

    Monitoring must not break training or the service: an ``Exception`` from one sink is logged
    (``logging.getLogger("replaystore").exception``) and the next sink still gets the scalars;
    ``BaseException`` (``KeyboardInterrupt``) propagates. Not locked: callers serialise their steps.
    """
    for sink in sinks:
        try:
            sink.write(scalars, step)
        except Exception:  # noqa: BLE001 - monitoring must not break training
            log.exception("stats sink %r failed", sink)


class Sink(Protocol):
    """Where scalars go: ``write(scalars: dict[str, float], step: int)``, then ``close()``."""

    def write(self, scalars: dict[str, float], step: int) -> None:  # noqa: D102
        ...

    def close(self) -> None:  # noqa: D102
        ...


class LoggingSink:
    """Logs each report as one line at ``level`` on the ``replaystore`` logger (or ``logger``)."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.INFO, prefix: str = "") -> None:
        self.logger = logger or log
        self.level = level
        self.prefix = prefix

    def write(self, scalars: dict[str, float], step: int) -> None:
        """Log ``step`` and every scalar."""
        body = " ".join(f"{k}={v:.6g}" for k, v in scalars.items())
        self.logger.log(self.level, "%sstep=%d %s", self.prefix, step, body)

    def close(self) -> None:
        """Nothing to release."""


class TensorBoardSink:
    """Writes scalars to a TensorBoard ``SummaryWriter`` under ``tag_prefix``.

    ``writer``: yours; or ``None``: one it creates in ``logdir`` (``torch.utils.tensorboard`` or
    ``tensorboardX``, whichever is installed) and closes.
    """

    def __init__(self, writer: Any = None, logdir: str | None = None, tag_prefix: str = "replay/") -> None:
        self._owned = writer is None
        if writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                try:
                    from tensorboardX import SummaryWriter
                except ImportError as e:
                    raise ImportError("TensorBoardSink needs torch+tensorboard or tensorboardX") from e
            writer = SummaryWriter(logdir)
        self.writer = writer
        self.tag_prefix = tag_prefix

    def write(self, scalars: dict[str, float], step: int) -> None:
        """``add_scalar`` for each entry, then flush."""
        for k, v in scalars.items():
            self.writer.add_scalar(self.tag_prefix + k, v, step)
        self.writer.flush()

    def close(self) -> None:
        """Close the writer if this sink created it."""
        if self._owned:
            self.writer.close()


class WandbSink:
    """Logs scalars to the active Weights & Biases run (``wandb.init`` first)."""

    def __init__(self, tag_prefix: str = "replay/") -> None:
        import wandb

        self.wandb = wandb
        self.tag_prefix = tag_prefix

    def write(self, scalars: dict[str, float], step: int) -> None:
        """``wandb.log`` the scalars at ``step``."""
        self.wandb.log({self.tag_prefix + k: v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        """Nothing to release (the run belongs to the caller)."""


class StatsReporter:
    """Calls ``stats_fn`` every ``period`` seconds on a daemon thread and writes it to ``sinks``.

    Args:
        stats_fn: returns a stats dict, e.g. ``table.stats``.
        sinks: where to write (default: one :class:`LoggingSink`).
        period: seconds between reports.

    ``report()`` writes once, now (also usable without starting the thread). ``close()`` stops the
    thread, writes a final report and closes the sinks; it is idempotent. Errors from a sink are
    logged, not raised, so monitoring never stops training.
    """

    def __init__(
        self, stats_fn: Callable[[], Mapping[str, Any]], sinks: Iterable[Sink] | None = None, period: float = 30.0
    ) -> None:
        self.stats_fn = stats_fn
        self.sinks = list(sinks) if sinks is not None else [LoggingSink()]
        self.period = float(period)
        self.step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> "StatsReporter":
        """Start the reporting thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="replaystore-stats", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.report()

    def report(self) -> dict[str, float]:
        """Write the current stats to every sink; return the scalars written."""
        scalars = flatten_scalars(self.stats_fn())
        write_sinks(self.sinks, scalars, self.step)
        self.step += 1
        return scalars

    def close(self) -> None:
        """Stop, write a last report, close the sinks. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.report()
        for sink in self.sinks:
            sink.close()

    def __enter__(self) -> "StatsReporter":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
