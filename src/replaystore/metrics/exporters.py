"""Exporters that push a :class:`~replaystore.metrics.Recorder`'s points: Ray's metrics and TensorBoard.

Both subscribe to the recorder (``Recorder.subscribe``) and write after every successful read, so
their cost is the recorder's period, never the table's calls.

- :class:`RayMetricsExporter`: ``ray.util.metrics`` gauges (``replaystore_inserts_per_s``,
  ``replaystore_sample_blocked``, ``replaystore_fill``, ...; tags ``source``, ``table``,
  ``shard``), which Ray's dashboard and its Prometheus/Grafana show. Run it in a process connected
  to Ray (the driver, or an actor).
- :class:`TensorBoardExporter`: scalars (``replay/<table>/<metric>``) and histograms (priorities
  and times sampled, as ``add_histogram_raw`` of the ``stats()`` bins) on a ``SummaryWriter``.
"""

from __future__ import annotations

from typing import Any

from .prometheus import bin_bound
from .series import Recorder

#: the row values both exporters write (see :mod:`replaystore.metrics.series`)
SCALARS = (
    "inserts_per_s",
    "samples_per_s",
    "sample_calls_per_s",
    "ratio",
    "ratio_total",
    "ratio_target",
    "insert_blocked",
    "sample_blocked",
    "insert_waiting",
    "sample_waiting",
    "fill",
    "size",
    "staleness_mean",
    "evictions_per_s",
    "retired_per_s",
    "dropped_stale_per_s",
    "deletes_per_s",
    "skipped_updates_per_s",
)


def _rows(point: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(table, shard, row)`` for every table (``shard=""``) and every answering shard."""
    out = []
    for tname, row in point["tables"].items():
        out.append((tname, "", row))
        for i, s in enumerate(row.get("shards") or []):
            if s is not None:
                out.append((tname, str(i), s))
    return out


class RayMetricsExporter:
    """Sets ``ray.util.metrics`` gauges from every point of ``recorder`` (subscribes at once).

    Args:
        recorder: the recorder to follow.
        prefix: the metrics' name prefix.
    """

    def __init__(self, recorder: Recorder, prefix: str = "replaystore_") -> None:
        from ray.util import metrics

        self._metrics = metrics
        self.prefix = prefix
        self.source = recorder.source.name
        self._gauges: dict[str, Any] = {}
        self.writes = 0
        recorder.subscribe(self.write)

    def _gauge(self, name: str) -> Any:
        g = self._gauges.get(name)
        if g is None:
            g = self._gauges[name] = self._metrics.Gauge(
                self.prefix + name, f"replaystore {name}", tag_keys=("source", "table", "shard")
            )
        return g

    def write(self, point: dict[str, Any], snapshot: dict[str, Any] | None = None) -> None:
        """Set every gauge from ``point`` (values that are ``None`` are skipped)."""
        for tname, shard, row in _rows(point):
            tags = {"source": self.source, "table": tname, "shard": shard}
            for k in SCALARS:
                v = row.get(k)
                if v is not None:
                    self._gauge(k).set(float(v), tags=tags)
        self.writes += 1


class TensorBoardExporter:
    """Writes every point of ``recorder`` to a TensorBoard ``SummaryWriter`` (subscribes at once).

    Args:
        recorder: the recorder to follow.
        writer: a ``SummaryWriter`` (``torch.utils.tensorboard`` or ``tensorboardX``), or ``None``
            to create one in ``logdir`` (closed by :meth:`close`).
        tag_prefix: tags are ``<tag_prefix><table>[/shard<i>]/<metric>``.

    The step is the point's sequence number.
    """

    def __init__(
        self, recorder: Recorder, writer: Any = None, logdir: str | None = None, tag_prefix: str = "replay/"
    ) -> None:
        from ..monitor import TensorBoardSink

        self._sink = TensorBoardSink(writer, logdir, tag_prefix="")
        self.writer = self._sink.writer
        self.tag_prefix = tag_prefix
        recorder.subscribe(self.write)

    def write(self, point: dict[str, Any], snapshot: dict[str, Any] | None = None) -> None:
        """``add_scalar`` for each value, ``add_histogram_raw`` for the priority and times-sampled bins."""
        step = point["seq"]
        for tname, shard, row in _rows(point):
            tag = f"{self.tag_prefix}{tname}{'/shard' + shard if shard else ''}/"
            for k in SCALARS:
                v = row.get(k)
                if v is not None:
                    self.writer.add_scalar(tag + k, float(v), step)
            for k in ("priority_histogram", "times_sampled_histogram"):
                self._histogram(tag + k, row.get(k) or {}, step)
        self.writer.flush()

    def _histogram(self, tag: str, hist: dict[str, int], step: int) -> None:
        if not hist:
            return
        bins = sorted(((bin_bound(label), c) for label, c in hist.items()), key=lambda bc: bc[0])
        finite = [b for b, _ in bins if b != float("inf")]
        top = (max(finite) * 2 if finite else 1.0) if bins[-1][0] == float("inf") else bins[-1][0]
        limits = [b if b != float("inf") else top for b, _ in bins]
        counts = [c for _, c in bins]
        n = sum(counts)
        self.writer.add_histogram_raw(
            tag,
            min=0.0,
            max=float(limits[-1]),
            num=n,
            sum=float(sum(lim * c for lim, c in zip(limits, counts))),
            sum_squares=float(sum(lim * lim * c for lim, c in zip(limits, counts))),
            bucket_limits=[float(x) for x in limits],
            bucket_counts=[float(c) for c in counts],
            global_step=step,
        )

    def close(self) -> None:
        """Close the writer if this exporter created it."""
        self._sink.close()
