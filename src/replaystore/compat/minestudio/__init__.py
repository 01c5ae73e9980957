"""MineStudio's online replay buffer on replaystore: same names and semantics, minus its failures.

Covers ``minestudio.online.rollout.replay_buffer`` and the trainer's data loading
(``minestudio.online.utils.train.data``).

```python
from replaystore.compat.minestudio import ReplayBufferInterface, FragmentMetadata, data_iter, create_loader_pool

buf = ReplayBufferInterface({"max_chunks": 4800, "max_staleness": 2, "max_reuse": 2, "fragments_per_chunk": 1,
                             "fragments_per_report": 40,
                             "database_config": {"path": "output/replay_buffer_cache", "num_shards": 8}})
buf.add_fragment(fragment, FragmentMetadata(model_version, session_id, worker_uuid, fid))  # producers
buf.update_model_version(session_id, model_version)                                        # trainer
records = buf.fetch_fragments(400, timeout=600)
for batch in data_iter(create_loader_pool(4, 0.1), records, batch_size=8, prefetch_batches=2):
    ...
```

See ``docs/compat/minestudio.md`` for the differences and the benchmark.
"""

from .actor import ReplayBufferActor, buffer_config, create_replay_buffer
from .data import FragmentLoader, batchify_next_obs, create_loader_pool, data_iter, prepare_batch
from .datatypes import FragmentDataDict, FragmentIndex, FragmentMetadata, SampleFragment, StepRecord
from .fragment_store import FragmentStore
from .interface import FetchedFragments, ReplayBufferInterface
from .utils import auto_stack, auto_to_numpy, auto_to_torch

__all__ = [
    "FetchedFragments",
    "FragmentDataDict",
    "FragmentIndex",
    "FragmentLoader",
    "FragmentMetadata",
    "FragmentStore",
    "ReplayBufferActor",
    "ReplayBufferInterface",
    "SampleFragment",
    "StepRecord",
    "auto_stack",
    "auto_to_numpy",
    "auto_to_torch",
    "batchify_next_obs",
    "buffer_config",
    "create_loader_pool",
    "create_replay_buffer",
    "data_iter",
    "prepare_batch",
]
