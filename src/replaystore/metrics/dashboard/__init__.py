"""The live dashboard: :func:`serve_dashboard` (a table of this process, or any metrics source).

``replaystore dashboard`` (``replaystore.cli``) serves the same page for a named Ray service, a
sharded table or a shared table. See docs/metrics.md.
"""

from __future__ import annotations

from typing import Any

from ..series import Recorder
from ..sources import TableSource
from .server import DashboardServer


class Dashboard:
    """A running dashboard: a :class:`Recorder` and its :class:`DashboardServer` (close both with :meth:`close`)."""

    def __init__(self, recorder: Recorder, server: DashboardServer) -> None:
        self.recorder = recorder
        self.server = server

    @property
    def url(self) -> str:
        """The page's address."""
        return self.server.url

    def close(self) -> None:
        """Stop the server and the recorder. Idempotent."""
        self.server.close()
        self.recorder.close()

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_dashboard(
    source: Any, port: int = 8765, host: str = "127.0.0.1", period: float = 1.0, history: int = 600
) -> Dashboard:
    """Serve the live dashboard of ``source`` at ``http://host:port/`` (daemon threads; returns at once).

    Args:
        source: a Table (or ``{name: table}``, or anything with ``stats()``), or a source of
            :mod:`replaystore.metrics.sources` (``ServiceSource``, ``ShardedSource``, ``SharedSource``).
        port: ``0`` picks a free port (``Dashboard.url`` says which).
        host: the address to listen on (default: this machine only).
        period: seconds between reads of ``stats()`` (the page refreshes as often).
        history: points kept (the charts' window is ``period * history`` seconds).

    Raises:
        PortInUse: ``port`` is taken (nothing is left running).
    """
    if not hasattr(source, "read"):
        source = TableSource(source)
    recorder = Recorder(source, period=period, history=history)
    try:
        server = DashboardServer(recorder, host=host, port=port)
    except BaseException:
        recorder.close()
        raise
    recorder.start()
    return Dashboard(recorder, server)


__all__ = ["Dashboard", "DashboardServer", "serve_dashboard"]
