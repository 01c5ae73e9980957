"""``replaystore dashboard``: the live dashboard of a Ray service, a sharded table or a shared table.

For a table of your own process, call :func:`replaystore.metrics.serve_dashboard` instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..errors import PortInUse, Unavailable


def add_parser(sub: Any) -> None:
    """Add the ``dashboard`` command to the ``replaystore`` command's subparsers."""
    p = sub.add_parser(
        "dashboard",
        help="serve a live dashboard (charts, tables, Prometheus /metrics) of a replay service, "
        "sharded table or shared table",
        description="Serve a live dashboard page of a running replay buffer: inserts/s, samples/s, "
        "the sample-to-insert ratio against the rate limiter's target, time blocked in the rate "
        "limiter, fill, evictions by reason, staleness, priority and times-sampled histograms "
        "(per shard, per node where they exist), the tables' configuration, and Prometheus "
        "/metrics on the same port. Default: the Ray service named 'replaystore' in the running "
        "Ray cluster. For a table of your own process use replaystore.metrics.serve_dashboard(table).",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--service", metavar="NAME", help="a replay service (replaystore.ray.serve) by name")
    which.add_argument("--sharded", metavar="NAME", help="a sharded table (replaystore.ray.serve_sharded) by name")
    which.add_argument("--shared", metavar="NAME", help="a shared-memory table (replaystore.shared) by name")
    p.add_argument("--namespace", help="the Ray namespace of the service or shards")
    p.add_argument("--address", default="auto", help="the Ray cluster to join (default: auto, the running one)")
    p.add_argument("--directory", help="with --shared: the segment directory (default /dev/shm)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port of the page and /metrics (default 8765; 0: any)")
    p.add_argument("--period", type=float, default=1.0, help="seconds between reads of stats() (default 1)")
    p.add_argument("--wait", action="store_true", help="start even when the source is not there yet (keep retrying)")
    p.add_argument("--tensorboard", metavar="LOGDIR", help="also write the series to TensorBoard in LOGDIR")
    p.add_argument("--ray-metrics", action="store_true", help="also export Ray metrics (ray.util.metrics gauges)")
    p.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    p.set_defaults(func=run)


def _source(args: argparse.Namespace) -> Any:
    from .sources import ServiceSource, ShardedSource, SharedSource

    if args.shared:
        return SharedSource(args.shared, args.directory)
    from ..ray import import_ray

    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=args.address, namespace=args.namespace, include_dashboard=False, log_to_driver=False)
    if args.sharded:
        return ShardedSource(args.sharded, args.namespace)
    return ServiceSource(args.service or "replaystore", args.namespace)


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C (or ``--duration``); 2 with a message when the source or port is not usable."""
    from . import RayMetricsExporter, TensorBoardExporter
    from .dashboard import DashboardServer
    from .series import Recorder

    if args.period <= 0:
        print(f"replaystore dashboard: --period must be > 0, got {args.period}", file=sys.stderr)
        return 2
    try:
        source = _source(args)
        if not args.wait:
            source.read()
    except Unavailable as e:
        print(f"replaystore dashboard: {e}; start it first, or pass --wait to keep retrying", file=sys.stderr)
        return 2
    except ConnectionError as e:
        print(
            f"replaystore dashboard: no Ray cluster at {args.address!r} ({e}); start the service's cluster "
            "(ray start --head) or pass --address",
            file=sys.stderr,
        )
        return 2
    recorder = Recorder(source, period=args.period)
    try:
        server = DashboardServer(recorder, args.host, args.port)
    except PortInUse as e:
        recorder.close()
        print(f"replaystore dashboard: {e}", file=sys.stderr)
        return 2
    tb = TensorBoardExporter(recorder, logdir=args.tensorboard) if args.tensorboard else None
    if args.ray_metrics and source.kind != "shared":
        RayMetricsExporter(recorder)
    recorder.start()
    print(f"replaystore dashboard of {source.kind} {source.name!r}: {server.url} (Prometheus: {server.url}metrics)")
    try:
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        recorder.close()
        if tb is not None:
            tb.close()
    return 0
