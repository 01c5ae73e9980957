"""Episodes: the options that turn on episode structure in a :class:`~replaystore.Table`."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import EpisodeError

#: stream ids must stay below this when ``max_streams`` is not given (per-stream state is an array
#: indexed by stream id, grown by doubling)
MAX_STREAM_ID = 1 << 20
#: the largest ``max_streams`` (a step's id packs its stream into the bits above position 2**40)
MAX_STREAMS_LIMIT = 1 << 23


@dataclass(frozen=True)
class Episodes:
    """Episode structure for a Table: steps know their stream and position.

    Args:
        max_streams: stream ids must lie in ``[0, max_streams)``; ``None``: any id below
            ``2**20``, per-stream state grows as ids appear. Stream ids index arrays: use small
            integers (environment indices), not hashes.
        sequence_length: the fixed window (``burn_in + length``) of prioritized sequences. With a
            ``Prioritized`` sampler, positions that cannot start such a window carry zero mass, so
            ``sample_sequences`` draws exactly in proportion to the priorities of valid starts.
            ``None``: prioritized sequence sampling is off (uniform sequences and n-step work).
        burn_in: the burn-in part of ``sequence_length`` (the priority of a sequence sits on its
            first step after the burn-in, the key ``sample_sequences`` returns).
        obs_field: the observation field (n-step bootstrap without ``next_obs_field``).
        next_obs_field: a field holding each step's next observation (n-step bootstraps from it,
            and every live step is a valid n-step start), or ``None`` (the next observation is the
            ``obs_field`` of the next step of the same episode).
        reward_field: the reward field (n-step returns).
    """

    max_streams: int | None = None
    sequence_length: int | None = None
    burn_in: int = 0
    obs_field: str = "obs"
    next_obs_field: str | None = None
    reward_field: str = "reward"

    def __post_init__(self) -> None:
        if self.max_streams is not None and not (
            isinstance(self.max_streams, int) and 1 <= self.max_streams <= MAX_STREAMS_LIMIT
        ):
            raise EpisodeError(
                f"max_streams must be an int in [1, {MAX_STREAMS_LIMIT}] or None, got {self.max_streams!r}"
            )
        if self.sequence_length is not None and not (
            isinstance(self.sequence_length, int) and self.sequence_length >= 1
        ):
            raise EpisodeError(f"sequence_length must be a positive int or None, got {self.sequence_length!r}")
        if not (isinstance(self.burn_in, int) and self.burn_in >= 0):
            raise EpisodeError(f"burn_in must be an int >= 0, got {self.burn_in!r}")
        if self.sequence_length is not None and self.burn_in >= self.sequence_length:
            raise EpisodeError(
                f"burn_in ({self.burn_in}) must be smaller than sequence_length ({self.sequence_length})"
            )
        for name in ("obs_field", "reward_field"):
            if not isinstance(getattr(self, name), str):
                raise EpisodeError(f"{name} must be a str, got {getattr(self, name)!r}")
        if self.next_obs_field is not None and not isinstance(self.next_obs_field, str):
            raise EpisodeError(f"next_obs_field must be a str or None, got {self.next_obs_field!r}")

    @property
    def stream_limit(self) -> int:
        """Exclusive upper bound of stream ids."""
        return MAX_STREAM_ID if self.max_streams is None else self.max_streams

    def config(self) -> dict:
        """Constructor arguments as JSON (for checkpoints)."""
        return asdict(self)
