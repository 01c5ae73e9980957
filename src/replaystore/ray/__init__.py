"""replaystore on Ray: a replay service (named async actor) hosting Tables and a fragment buffer.

- :func:`serve` starts the service, :func:`connect` finds it; :class:`ReplayClient` mirrors the
  Table API (``extend``, ``add``, ``sample``, ``update_priorities``, ``delete``, ``set_version``,
  ``stats``, ``save``) with timeouts, one Ray call per batch.
- :class:`FragmentClient` (``client.fragments``) is the large-payload path: payloads go to a
  :class:`~replaystore.storage.fragments.FragmentStore` (LMDB) on the service's node; only ids and
  metadata reach the service, which groups them into chunks (MineStudio's system, see
  :mod:`replaystore.fragments.buffer`).
- :class:`WalConfig` (``serve(..., wal=...)``): a write-ahead log per Table, so inserts acknowledged
  to a client survive a crash of the service (:mod:`replaystore.wal.log`,
  :mod:`replaystore.wal.logged`).
- :func:`serve_sharded` runs a Table as N shard services (placement over nodes) behind one
  :class:`ShardedClient` with the Table API; samples are drawn as from one table
  (:mod:`replaystore.sharding.sampling`), keys carry their shard. :class:`BatchingWriter` sends
  a writer's rows ``rows_per_call`` at a time (one Ray call per batch, not per row).
- :func:`create_loader_pool` and :func:`data_iter` read fetched fragments in parallel (per node,
  with node-local stores: ``FragmentBufferConfig(node_local=...)``, :mod:`replaystore.ray.fragments.node_stores`).

Importing this package does not import Ray; the first call that needs it does, after setting
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` and ``RAY_AUTH_MODE=disabled`` (unless already set) so a
local instance started by replaystore listens on loopback only. See ``docs/ray.md``.
"""

from ..fragments.buffer import FragmentBuffer, FragmentBufferConfig, FragmentRef
from ..samplers.uniform_distinct import UniformDistinct
from ..sharding.keys import ForeignKey
from ..wal.log import WalConfig, WriteAheadLog
from ..wal.logged import LoggedTable
from ._runtime import import_ray, init_local
from .batching_writer import BatchingWriter
from .client import ReplayClient, connect, serve
from .fragments.client import Fetch, FragmentClient
from .fragments.node_loaders import NodeLoaderPool
from .fragments.node_stores import NodeLost, label_of
from .loader import FragmentLoader, LocalLoaderPool, create_loader_pool, data_iter, detach
from .online_client import OnlineClient
from .server import ReplayServer
from .sharded.client import ShardedClient
from .sharded.placement import PlacementError
from .sharded.service import connect_sharded, serve_sharded

__all__ = [
    "BatchingWriter",
    "Fetch",
    "ForeignKey",
    "FragmentBuffer",
    "FragmentBufferConfig",
    "FragmentClient",
    "FragmentLoader",
    "FragmentRef",
    "LocalLoaderPool",
    "LoggedTable",
    "NodeLoaderPool",
    "NodeLost",
    "OnlineClient",
    "PlacementError",
    "ReplayClient",
    "ReplayServer",
    "ShardedClient",
    "UniformDistinct",
    "WalConfig",
    "WriteAheadLog",
    "connect",
    "connect_sharded",
    "create_loader_pool",
    "data_iter",
    "detach",
    "label_of",
    "import_ray",
    "init_local",
    "serve",
    "serve_sharded",
]
