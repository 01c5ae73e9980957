"""One exception family for everything replaystore raises on purpose.

Every error derives from :class:`ReplayError`, and also from the built-in exception a Python
programmer would expect (``ValueError`` for bad input, ``KeyError`` for unknown keys,
``TimeoutError`` for timeouts), so both ``except rs.ReplayError`` and ``except ValueError`` work.

An operation that raises one of these has changed nothing: validation always runs before mutation.
"""

from __future__ import annotations

import errno


class ReplayError(Exception):
    """Base class of every error raised by replaystore."""


class SpecError(ReplayError, ValueError):
    """Data does not match the table's field spec (missing field, wrong shape or dtype)."""


class InvalidPriority(ReplayError, ValueError):
    """A priority is NaN, infinite, or negative where the sampler needs non-negative values."""


class KeyNotFound(ReplayError, KeyError):
    """A key is not (or no longer) in the table."""


class Timeout(ReplayError, TimeoutError):
    """A blocking call (rate limiter, fetch) did not proceed before its timeout passed."""


class Closed(ReplayError):
    """The table (or service) was closed; blocked and later calls raise this."""


class CheckpointError(ReplayError):
    """A checkpoint is missing, truncated, corrupted, or of an unknown format."""


class InvalidArgument(ReplayError, ValueError):
    """An argument or configuration value is out of range or impossible in the table's state.

    Examples: ``sample(0)``, keys that are not one-dimensional, ``capacity <= 0``, an unknown
    selector or rate limiter type, a sampler used as a remover that cannot remove.
    """


class CapacityError(InvalidArgument):
    """A batch can never fit.

    More items than the capacity of a table whose remover is not ``Fifo`` (a FIFO table keeps the
    newest ``capacity`` items instead), or more frames than a frame ring holds.
    """


class RateLimitError(InvalidArgument):
    """A call the rate limiter could never admit: waiting for it would block forever.

    A batch larger than ``max_diff - min_diff`` allows. Distinct from :class:`Timeout`, which a
    call that could proceed later raises when its time runs out.
    """


class InvalidType(ReplayError, TypeError):
    """A value of a type replaystore cannot handle here (e.g. a gym space with no array form)."""


class StorageError(ReplayError, OSError):
    """The file system refused a write or a read of replaystore's files (an I/O error).

    Attributes:
        path: the file or directory concerned (``None`` if unknown).
        wanted: bytes the operation needed (``None`` if unknown).

    The structure that raised it is as it was before the call: every item acknowledged earlier is
    still readable.
    """

    _errno = errno.EIO

    def __init__(self, message: str, path: str | None = None, wanted: int | None = None) -> None:
        OSError.__init__(self, self._errno, message, path)
        self.message, self.path, self.wanted = message, path, wanted

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple:  # OSError pickles (errno, strerror) only: keep path and wanted
        return (type(self), (self.message, self.path, self.wanted))


class DiskFull(StorageError):
    """No space left for a write (a full file system, or an LMDB shard at its ``map_size``).

    ``errno`` is ``ENOSPC``; :attr:`path` names the file and :attr:`wanted` the bytes the write
    needed. Nothing was changed: retry once space has been freed.
    """

    _errno = errno.ENOSPC


class InvalidRequest(InvalidArgument):
    """A request that can never be valid (a bad count, range, group size or budget request).

    Examples: a negative or non-integer count, a version range whose minimum exceeds its maximum, a
    group larger than the buffer, more tickets than a budget can ever grant.
    """


class UnknownTicket(KeyNotFound):
    """A rollout ticket that is not held: never acquired, already finished or abandoned, or expired."""


class TicketCancelled(UnknownTicket):
    """A rollout ticket that was cancelled (over-provisioning: its batch filled, or ``cancel_slowest``).

    The producer should stop generating for it; anything it sends for the ticket is refused.
    """


class AlreadySampled(InvalidRequest):
    """A group cannot be rejected: the trainer has already sampled it."""


class OverReservation(InvalidRequest):
    """A group (or a finished ticket) that used more budget units (tokens) than its ticket reserved.

    A token budget's staleness bound holds only if no group outgrows its reservation
    (``group_tokens`` or ``acquire(tokens=...)``): such a write is refused and changes nothing.
    The producer can ``reject`` the group, or write it truncated.
    """


class WouldDeadlock(InvalidRequest):
    """An ``acquire`` that can never be granted while its holder keeps the tickets it holds.

    Either the holder's tickets plus the request exceed what the budget ever admits at once, or the
    trainer waits for one of the holder's running groups (``fifo``/``in_order`` picks) while the
    holder waits for capacity that only the trainer's next version would bring.
    """


class WalCorrupt(CheckpointError):
    """A write-ahead log holds a corrupted record that is not a torn tail (see ``replaystore.wal.log``)."""


class EpisodeError(InvalidArgument):
    """Bad use of a table's episode structure.

    A bad stream id, ``n < 1``, ``gamma`` outside ``(0, 1]``, a plain ``extend``/``add`` on an
    episodic table, an episode method on a table without ``episodes=``.
    """


class UnknownStream(EpisodeError):
    """An episode end (or another stream operation) names a stream that never wrote a step."""


class NoValidSequence(EpisodeError):
    """No live position can start the requested sequence, or no complete episode is stored.

    In strict mode: ``length`` is longer than every stored run of consecutive steps of one episode.
    """


class MultiAgentError(EpisodeError):
    """Bad use of a multi-agent table (``replaystore.multiagent``).

    A step with no agent, agents whose fields differ, a per-agent priority update on a table that
    keeps joint priorities, a sample mode the table's sampler cannot give exactly.
    """


class UnknownAgent(MultiAgentError, KeyError):
    """An agent id that is not one of the table's agents."""


class MissingAgent(MultiAgentError):
    """A step lacks an agent the table requires, or a PettingZoo output lacks an acting agent."""


class AgentShapeMismatch(MultiAgentError, SpecError):
    """Agents sharing a field give it different shapes or dtypes (or differ from the stored field)."""


class InvalidState(ReplayError, RuntimeError):
    """A call that needs a set-up step first (e.g. an SB3 HER buffer sampled before ``set_env``)."""


class Unsupported(ReplayError, NotImplementedError):
    """A call that this mode of a table does not offer (see ``replaystore.table.contract``).

    Example: ``snapshot()`` of a served or sharded table (use ``save()`` and ``Table.load``).
    """


class NotConnected(InvalidState):
    """A Ray client call made in a process where Ray is not initialized.

    ``connect()`` finds a running service by name in the Ray cluster this process joined: call
    ``ray.init(address="auto")`` (or ``ray.init(address=...)``) first. It does not start a new
    local Ray instance, which could never hold the service.
    """


class Unavailable(ReplayError, ConnectionError):
    """A metrics source cannot be read now (no service, shard or shared table of that name; a restart).

    A dashboard keeps retrying; the message names the source.
    """


class PortInUse(ReplayError, OSError):
    """A dashboard or metrics endpoint cannot listen on the port it was given (another process has it)."""


class ReplayWarning(UserWarning):
    """Base class of every warning replaystore issues (filter them with ``rs.ReplayWarning``)."""


class BlockingWarning(ReplayWarning):
    """A table cannot do what a call waits for (e.g. a loaded table under ``MinSize`` it does not reach).

    Issued after :meth:`Table.load` when the rate limiter cannot admit a sample, and once by a
    blocking call without a timeout that has waited 10 s. The call still blocks; the message names
    the limiter, the table's size and the fix.
    """


__all__ = [
    "ReplayError",
    "SpecError",
    "InvalidPriority",
    "KeyNotFound",
    "Timeout",
    "Closed",
    "CheckpointError",
    "InvalidArgument",
    "CapacityError",
    "RateLimitError",
    "InvalidType",
    "StorageError",
    "DiskFull",
    "InvalidRequest",
    "UnknownTicket",
    "TicketCancelled",
    "AlreadySampled",
    "OverReservation",
    "WouldDeadlock",
    "WalCorrupt",
    "EpisodeError",
    "UnknownStream",
    "NoValidSequence",
    "MultiAgentError",
    "UnknownAgent",
    "MissingAgent",
    "AgentShapeMismatch",
    "InvalidState",
    "Unsupported",
    "NotConnected",
    "Unavailable",
    "PortInUse",
    "ReplayWarning",
    "BlockingWarning",
]
