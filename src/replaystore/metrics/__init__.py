"""Metrics: time series of a replay buffer, exporters, and a live dashboard (docs/metrics.md).

- sources (:mod:`.sources`): one snapshot of a local table (:class:`TableSource`), a Ray service
  (:class:`ServiceSource`), a sharded table (:class:`ShardedSource`), a shared table
  (:class:`SharedSource`), read through their public ``stats()``.
- :class:`Recorder` (:mod:`.series`): reads a source on a period, derives rates (inserts/s,
  samples/s, the sample-to-insert ratio, time blocked in the rate limiter, evictions by reason).
- exporters: Prometheus (:mod:`.prometheus`, ``prometheus_client``), Ray's metrics and TensorBoard
  (:mod:`.exporters`).
- :func:`serve_dashboard` (:mod:`.dashboard`): the page, for ``replaystore dashboard`` too.

Nothing here touches a table's ``extend`` / ``sample`` path: the cost is one ``stats()`` per period.
"""

from __future__ import annotations

from .dashboard import Dashboard, serve_dashboard
from .exporters import RayMetricsExporter, TensorBoardExporter
from .prometheus import PrometheusCollector, metrics_text, serve_prometheus
from .series import Recorder, table_row
from .sources import ServiceSource, ShardedSource, SharedSource, TableSource, merge_shards

__all__ = [
    "Dashboard",
    "PrometheusCollector",
    "RayMetricsExporter",
    "Recorder",
    "ServiceSource",
    "ShardedSource",
    "SharedSource",
    "TableSource",
    "TensorBoardExporter",
    "merge_shards",
    "metrics_text",
    "serve_dashboard",
    "serve_prometheus",
    "table_row",
]
