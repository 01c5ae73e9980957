"""Prometheus: the last snapshot of a :class:`~replaystore.metrics.Recorder` as metric families.

Needs ``prometheus_client`` (the ``[metrics]`` extra; Ray's ``ray[default]`` brings it too).
Every table series has the labels ``source`` (the service, table or shared table's name),
``table`` and ``shard`` (``""`` for a table that is not sharded; per shard otherwise, so
Prometheus sums them). Counters (``replaystore_inserts_total``, ``..._evictions_total``,
``..._sample_blocked_seconds_total``, ...), gauges (``replaystore_size``, ``..._capacity``,
``..._sample_to_insert_ratio``, ``..._sample_waiting``, ...), histograms
(``replaystore_priority``, ``replaystore_times_sampled``, ``replaystore_staleness``), per node of a
fragment service ``replaystore_node_free_bytes`` and friends, per shared table its lock, and
``replaystore_up`` (0 while the source cannot be read).

:func:`serve_prometheus` serves ``/metrics`` on its own port; the dashboard serves it too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..errors import PortInUse
from ..table.state import COUNTERS
from .series import Recorder

_COUNTERS = COUNTERS  # the Table's counters (Table.stats())
_GAUGES = (
    "size",
    "capacity",
    "version",
    "sample_to_insert_ratio",
    "insert_waiting",
    "sample_waiting",
    "priority_min",
    "priority_max",
    "priority_mean",
    "times_sampled_mean",
    "times_sampled_max",
)
_NODE = ("payloads", "disk_bytes", "live_bytes", "free_bytes", "leases", "leased_fragments", "loader_queue")
_LABELS = ["source", "table", "shard"]


def _need_client() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core  # noqa: F401 - the metric families
    except ImportError as e:  # pragma: no cover - only without the extra
        raise ImportError("Prometheus export needs prometheus_client: pip install 'replaystore[metrics]'") from e
    return prometheus_client


def bin_bound(label: str) -> float:
    """The upper bound of a ``stats()`` histogram bin label: ``"3"`` -> 3, ``"2^-2"`` -> 0.5, ``"<2^-5"``."""
    if label.startswith(">="):
        return float("inf")
    if label.startswith("<2^"):
        return 2.0 ** int(label[3:])
    if label.startswith("2^"):
        return 2.0 ** (int(label[2:]) + 1)
    return float(label)


def histogram_buckets(hist: dict[str, int]) -> list[tuple[str, float]]:
    """A ``stats()`` histogram as Prometheus buckets: cumulative ``(le, count)``, ending with ``+Inf``."""
    out, total = [], 0
    for label, c in sorted(hist.items(), key=lambda kv: bin_bound(kv[0])):
        total += c
        b = bin_bound(label)
        if b != float("inf"):
            out.append((repr(float(b)), total))
    out.append(("+Inf", total))
    return out


def _name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


class PrometheusCollector:
    """A ``prometheus_client`` collector of a recorder's last snapshot (register it on a registry).

    ``collect()`` is thread-safe and reads nothing from the source itself: a scrape costs the table
    nothing beyond the recorder's period.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[Any]:
        """The metric families of the last snapshot (``replaystore_up`` alone before the first)."""
        core = _need_client().core
        last = self.recorder.points()[-1:]
        up = core.GaugeMetricFamily("replaystore_up", "1 while the source answers, else 0", labels=["source"])
        up.add_metric([self.recorder.source.name], 1.0 if last and last[0]["ok"] else 0.0)
        yield up
        snap = self.recorder.latest()
        if snap is None:
            return
        src = snap["name"]
        fams: dict[str, Any] = {}
        for k in _COUNTERS:
            fams[k] = core.CounterMetricFamily(f"replaystore_{k}", f"the table's {k} counter", labels=_LABELS)
        for side in ("insert", "sample"):
            k = f"{side}_blocked_seconds"
            fams[k] = core.CounterMetricFamily(
                f"replaystore_{k}", f"seconds {side} calls spent blocked by the rate limiter", labels=_LABELS
            )
        for k in _GAUGES:
            fams[k] = core.GaugeMetricFamily(f"replaystore_{k}", f"the table's {k}", labels=_LABELS)
        fams["target"] = core.GaugeMetricFamily(
            "replaystore_sample_to_insert_target", "the rate limiter's samples_per_insert", labels=_LABELS
        )
        hists = {
            k: core.HistogramMetricFamily(f"replaystore_{k}", f"the live items' {k}", labels=_LABELS)
            for k in ("priority", "times_sampled", "staleness")
        }
        for tname, t in snap["tables"].items():
            rows = [("", t["stats"])] if "shards" not in t else [(str(i), s) for i, s in enumerate(t["shards"])]
            for shard, st in rows:
                if st is None:
                    continue
                labels = [src, tname, shard]
                for k in _COUNTERS:
                    if k in st:
                        fams[k].add_metric(labels, float(st[k]))
                for side in ("insert", "sample"):
                    v = float(st.get(f"{side}_blocked_s", 0.0)) + float(st.get(f"{side}_blocked_now_s", 0.0))
                    fams[f"{side}_blocked_seconds"].add_metric(labels, v)
                for k in _GAUGES:
                    if isinstance(st.get(k), (int, float)):
                        fams[k].add_metric(labels, float(st[k]))
                target = (st.get("config") or {}).get("target_sample_to_insert_ratio")
                if target is not None:
                    fams["target"].add_metric(labels, float(target))
                for k, fam in hists.items():
                    h = st.get(f"{k}_histogram") or {}
                    mean = st.get(f"{k}_mean", 0.0) if k != "staleness" else 0.0
                    fam.add_metric(labels, histogram_buckets(h), float(mean) * sum(h.values()))
        yield from fams.values()
        yield from hists.values()
        yield from self._nodes(core, src, (snap.get("fragments") or {}).get("nodes"))
        yield from self._lock(core, src, snap.get("lock"))
        yield from self._online(core, src, snap.get("online"))

    @staticmethod
    def _nodes(core: Any, src: str, nodes: dict | None) -> Iterator[Any]:
        if not nodes:
            return
        for k in _NODE:
            fam = core.GaugeMetricFamily(f"replaystore_node_{k}", f"a fragment store's {k}", labels=["source", "node"])
            for label, n in nodes.items():
                if isinstance(n, dict) and isinstance(n.get(k), (int, float)):
                    fam.add_metric([src, label], float(n[k]))
            yield fam

    @staticmethod
    def _lock(core: Any, src: str, lock: dict | None) -> Iterator[Any]:
        if not lock:
            return
        c = core.CounterMetricFamily("replaystore_lock_acquisitions", "critical sections entered", labels=["source"])
        c.add_metric([src], float(lock["acquisitions"]))
        yield c
        for k in ("held_fraction", "waiting_mean", "recoveries"):
            if lock.get(k) is not None:
                g = core.GaugeMetricFamily(f"replaystore_lock_{k}", f"the shared table's lock {k}", labels=["source"])
                g.add_metric([src], float(lock[k]))
                yield g

    @staticmethod
    def _online(core: Any, src: str, online: dict | None) -> Iterator[Any]:
        from ..monitor import flatten_scalars

        if not online:
            return
        fams: dict[str, Any] = {}
        for buf, st in online.items():
            for k, v in flatten_scalars(st).items():
                name = f"replaystore_online_{_name(k)}"
                fam = fams.get(name)
                if fam is None:
                    fam = fams[name] = core.GaugeMetricFamily(name, f"rollout buffer {k}", labels=["source", "buffer"])
                fam.add_metric([src, buf], v)
        yield from fams.values()


def registry_of(recorder: Recorder) -> Any:
    """A fresh ``CollectorRegistry`` holding one :class:`PrometheusCollector` of ``recorder``."""
    pc = _need_client()
    registry = pc.CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(recorder))
    return registry


def metrics_text(recorder: Recorder) -> bytes:
    """The Prometheus text exposition of ``recorder``'s last snapshot."""
    return _need_client().generate_latest(registry_of(recorder))


def serve_prometheus(recorder: Recorder, port: int = 9464, addr: str = "127.0.0.1") -> tuple[Any, Any]:
    """Serve ``/metrics`` of ``recorder`` on ``addr:port`` (a daemon thread); returns ``(server, thread)``.

    Call ``server.shutdown()`` to stop. ``port=0`` picks a free port (``server.server_port``).

    Raises:
        PortInUse: another process listens on ``port``.
    """
    pc = _need_client()
    try:
        return pc.start_http_server(port, addr=addr, registry=registry_of(recorder))
    except OSError as e:
        raise PortInUse(f"cannot serve Prometheus metrics on {addr}:{port}: {e.strerror or e}") from None
