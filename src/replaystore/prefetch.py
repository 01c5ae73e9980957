"""SampleIterator: a background thread that keeps ``prefetch`` samples ready.

Sampling (and the tensor conversion, when asked for) overlaps with the consumer's training step.
The queue is bounded, so the thread never runs more than ``prefetch`` batches ahead. Contracts:

- Batches are yielded in the order the thread drew them (for a ``Fifo`` queue table: FIFO order).
- An exception in the thread (other than the end conditions below) is re-raised in the consumer
  at the position it occurred; batches drawn before it are delivered first.
- Iteration ends (``StopIteration``) after ``max_batches`` batches, when the table is closed, or
  after :meth:`close`. A sample that waits longer than ``timeout`` raises
  :class:`~replaystore.Timeout` in the consumer.
- :meth:`close` stops the thread and joins it (bounded by ``join_timeout``); it is idempotent and
  runs on ``with`` exit and on garbage collection.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .errors import Closed, InvalidArgument, Timeout
from .items import Sample


class Sampleable(Protocol):
    """What a :class:`SampleIterator` draws from: a :class:`~replaystore.Table` (or alike).

    Its ``sample(batch_size, timeout=, as_tensor=, device=, pin_memory=)`` is :meth:`replaystore.Table.sample`'s.
    """

    name: str
    sample: Callable[..., Sample]


_POLL = 0.05  # seconds: how often a waiting thread checks for close()
_END = object()


class SampleIterator:
    """Iterate over samples of ``table`` drawn ahead of time by a daemon thread."""

    def __init__(
        self,
        table: Sampleable,
        batch_size: int,
        prefetch: int = 2,
        timeout: float | None = None,
        max_batches: int | None = None,
        as_tensor: bool = False,
        device: Any = None,
        pin_memory: bool = False,
        join_timeout: float = 5.0,
    ) -> None:
        if prefetch < 1:
            raise InvalidArgument(f"prefetch must be >= 1, got {prefetch}")
        self.table = table
        self.batch_size = int(batch_size)
        self.timeout = timeout
        self.max_batches = max_batches
        self.convert = dict(as_tensor=as_tensor, device=device, pin_memory=pin_memory)
        self.join_timeout = join_timeout
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name=f"replaystore-prefetch-{table.name}", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _draw(self) -> Sample:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            wait = _POLL if deadline is None else min(_POLL, max(0.0, deadline - time.monotonic()))
            try:
                return self.table.sample(self.batch_size, timeout=wait, **self.convert)
            except Timeout:
                if self._stop.is_set():
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout(
                        f"no sample of {self.batch_size} from table {self.table.name!r} within {self.timeout}s"
                    ) from None

    def _run(self) -> None:
        count = 0
        try:
            while not self._stop.is_set() and (self.max_batches is None or count < self.max_batches):
                sample = self._draw()
                if not self._put(sample):
                    return
                count += 1
            self._put(_END)
        except Closed:
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
            if not self._stop.is_set():
                self._put(e)

    def __iter__(self) -> "SampleIterator":
        return self

    def __next__(self) -> Sample:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_POLL)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise StopIteration from None
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def close(self) -> None:
        """Stop the thread and wait for it (at most ``join_timeout`` seconds). Idempotent."""
        self._stop.set()
        self._done = True
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(self.join_timeout)

    @property
    def alive(self) -> bool:
        """Whether the background thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> "SampleIterator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
