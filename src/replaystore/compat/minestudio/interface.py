"""ReplayBufferInterface: MineStudio's handle on the replay buffer, with timeouts and leases.

``ReplayBufferInterface(config)`` creates the buffer actor (``ValueError`` if it exists);
``ReplayBufferInterface()`` connects to it (``ValueError`` if there is none). Payloads go to the
fragment store directly; only ids and metadata reach the actor.

Differences from the original, all additive: ``fetch_fragments`` takes ``timeout=`` and returns a
:class:`FetchedFragments` list that also carries its lease; ``prepared_fragments(fetch)`` returns
that fetch's records (no argument: the last fetch by anyone, as the original); ``release(fetch)``
lets the payloads go at once (otherwise this interface's next fetch releases them, the original's
lifetime); ``add_fragment`` returns the buffer's verdict (``"pending"``, ``"chunk"``, ``"stale"``,
``"duplicate"``); ``stats()``.
"""

from __future__ import annotations

from typing import Any

from ...ray import ReplayClient, import_ray
from .actor import DEFAULT_NAME, create_replay_buffer
from .datatypes import FragmentIndex, FragmentMetadata, SampleFragment
from .fragment_store import FragmentStore


class FetchedFragments(list):
    """The ``[(FragmentIndex, fragment_id), ...]`` of one fetch, plus its ``lease_id``."""

    def __init__(self, records: list[tuple[FragmentIndex, str]], lease_id: str) -> None:
        super().__init__(records)
        self.lease_id = lease_id


def _lookup(name: str, namespace: str | None) -> Any:
    """The named actor, or ``None`` when there is none."""
    try:
        return import_ray().get_actor(name, namespace=namespace)
    except ValueError:
        return None


def _records(refs: list) -> list[tuple[FragmentIndex, str]]:
    return [(FragmentIndex(r.stream, r.seq), r.fragment_id) for r in refs]


class ReplayBufferInterface:
    """Create or connect to the replay buffer actor (see the module doc).

    Args:
        config: a ``replay_buffer_config`` (dict or DictConfig) to create the actor; ``None`` to
            connect to the existing one.
        name: the actor's name (MineStudio: ``"replay_buffer"``).
        namespace: its Ray namespace (default: the job's).
        rpc_grace: seconds to wait for calls that never block, and beyond a fetch's timeout.

    Raises:
        ValueError: ``"Replay buffer already initialized"`` / ``"Replay buffer not initialized"``.
    """

    def __init__(
        self,
        config: Any = None,
        name: str = DEFAULT_NAME,
        namespace: str | None = None,
        rpc_grace: float | None = 120.0,
    ) -> None:
        existing = _lookup(name, namespace)
        if config is not None:
            if existing is not None:
                raise ValueError("Replay buffer already initialized")
            self.client = create_replay_buffer(config, name, namespace)
            self.client.rpc_grace = rpc_grace
        else:
            if existing is None:
                raise ValueError("Replay buffer not initialized")
            self.client = ReplayClient(existing, name, rpc_grace=rpc_grace)
        self.actor = self.client.actor
        self.fragments = self.client.fragments
        info = self.fragments.store_info
        self.database_config = {"path": info["path"], "num_shards": info["num_shards"]}
        self.store = FragmentStore(self.fragments.store)

    def update_training_session(self) -> None:
        """A no-op, as in the original (kept for API compatibility)."""

    def add_fragment(self, fragment: SampleFragment, metadata: FragmentMetadata) -> str:
        """Write the fragment to the store, then acknowledge it to the actor.

        Returns the buffer's verdict. Duplicates and out-of-order fragments never raise.
        """
        fragment_id = self.store.add_fragment(fragment)
        return self.fragments.add(
            fragment_id, metadata.worker_uuid, metadata.fid_in_worker, metadata.model_version, metadata.session_id
        )

    def load_fragment(self, fragment_id: str) -> SampleFragment:
        """Read a fragment from the store (``rs.KeyNotFound`` if it was deleted)."""
        return self.store.get_fragment(fragment_id)

    def fetch_fragments(self, num_fragments: int, timeout: float | None = None) -> FetchedFragments:
        """Pick ``num_fragments / fragments_per_chunk`` chunks uniformly without replacement.

        Waits while too few chunks exist; raises ``rs.Timeout`` after ``timeout`` seconds
        (``None``: wait, as the original). ``ValueError`` for an impossible request.
        """
        fetch = self.fragments.fetch(num_fragments, timeout=timeout)
        return FetchedFragments(_records(fetch.records), fetch.lease_id)

    def prepared_fragments(self, fetch: FetchedFragments | str | None = None) -> list[tuple[FragmentIndex, str]]:
        """The records of one fetch.

        ``fetch`` is a result of :meth:`fetch_fragments` or its lease id; ``None`` gives the last
        fetch by anyone (the original's behaviour).
        """
        lease = fetch.lease_id if isinstance(fetch, FetchedFragments) else fetch
        return _records(self.fragments.prepared(lease))

    def release(self, fetch: FetchedFragments | str) -> int:
        """Release a fetch now (its payloads may be deleted); returns its size."""
        return self.fragments.release(fetch.lease_id if isinstance(fetch, FetchedFragments) else fetch)

    def update_model_version(self, session_id: str, model_version: int) -> int:
        """Set session and model version; drops every stale chunk (returns how many)."""
        return self.fragments.update_model_version(session_id, model_version)

    def stats(self) -> dict[str, Any]:
        """The buffer's counters and gauges."""
        return self.fragments.stats()
