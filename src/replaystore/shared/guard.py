"""The lock of a shared table: a thread lock, the segment's cross-process mutex, and state sync.

A :class:`ProcessGuard` replaces a Table's own lock and Condition (``HostedTable.guard_with``,
:mod:`.host`), so every method of the one Table implementation runs inside a critical section that
spans processes. Entering it (outermost level) takes this process's thread lock, then the
segment's mutex (:mod:`replaystore.shared.lock`), repairs the table if the previous holder died
inside (the header's *busy* word still set: :mod:`replaystore.shared.recovery`), and brings the
state up to date: where the scalars live in the segment (mutex tables, :mod:`.scalars`) the
process's own structures catch up (``state_moved``) and leaving commits the words to the state
copy (``StateCopies.commit``); elsewhere (``flock`` tables) entering loads the current state copy
(``HostedTable.load_state_scalars``) and leaving publishes it (docs/shared.md "How it works"). The
busy word is set after the mutex is taken and cleared before it is released, ordered against the
section's writes (``set_word``), for samples that copy outside the lock (:mod:`.reads`).

Waiting (the rate limiter) polls: :meth:`ProcessGuard.wait`. ``notify_all`` does nothing.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ..errors import Closed
from . import header as H
from .copies import state_copies
from .header import COPY0, COPY_WORDS, VICTIMS, W_ACQUIRED, W_ACTIVE, W_BUSY, W_RECOVERIES, W_RESERVED, W_UNORDERED
from .recovery import reconcile
from .segment import Segment

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from ..table.host import HostedTable

try:
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("REPLAYSTORE_PURE_PYTHON is set")
    from ._sync import RingInserter, enter_section, leave_section, set_word
except ImportError:  # not built (a flock table): a plain store; no scalars in the segment
    enter_section = leave_section = RingInserter = None

    def set_word(words: memoryview, index: int, value: int) -> None:
        """``words[index] = value`` (no barrier: only a table without outside reads runs this)."""
        words[index] = value


try:
    if enter_section is None:
        raise ImportError("no compiled sections")
    from ._sync import RingSampler
except ImportError:  # (not built, REPLAYSTORE_PURE_PYTHON, or built without NumPy's headers)
    RingSampler = None

#: test hook: with ``REPLAYSTORE_SHM_TEST_HOOK=pause-before-publish:<file>``, a critical section
#: that changed the state touches ``<file>`` and sleeps before publishing (the crash tests kill it there)
_HOOK = os.environ.get("REPLAYSTORE_SHM_TEST_HOOK", "").partition("pause-before-publish:")[2]
#: test hook: with ``REPLAYSTORE_SHM_TEST_HOOK=pause-after-victims:<file>``, an insert that evicts
#: in place out of ring mode pauses so after noting its victims, before it overwrites their rows
_HOOK_VICTIMS = os.environ.get("REPLAYSTORE_SHM_TEST_HOOK", "").partition("pause-after-victims:")[2]


class ProcessGuard:
    """A re-entrant lock and Condition over threads and processes for one Table (see the module doc)."""

    def __init__(
        self, segment: Segment, table: "HostedTable", live: "np.ndarray | None" = None, parts_publish: bool = True
    ) -> None:
        """``live``: the words the table's scalars live in (:mod:`.scalars`), or None: a copy per process.

        ``parts_publish``: the table has parts that write their own state out when a section ends
        (``HostedTable.before_publish``: episodes); False skips that call.
        """
        self.segment = segment
        self.table = table
        self._live = live
        self._parts_publish = parts_publish
        self.names, codes = table.state_layout()  # every part's scalars (the placement's scalar hook)
        self._position = {name: i for i, name in enumerate(self.names)}
        #: where the table's ring_mode word is: entering after another process committed calls
        #: ``state_moved`` only when it can do something (ring mode over, or parts with state)
        self._ring_word = self._position.get("ring_mode", -1)
        self._moved_always = parts_publish or self._ring_word < 0
        #: the state copies in the header (:mod:`replaystore.shared.copies`)
        self.copies = state_copies(segment.mm, W_ACTIVE, COPY0, COPY_WORDS, codes)
        self._mutex = segment.mutex
        #: opens the section (mutex held, state current) with an insert's intent: one of the two kinds
        self._enter = self._enter_flock if live is None else self._enter_live
        # victims of the insert in progress, noted before their rows are overwritten (recovery)
        self._victims = segment.view(VICTIMS)
        self._noted = False
        self._tlock = threading.RLock()
        self._depth = 0
        self._gen = -1  # generation of the state the local Table holds
        self._values: tuple | None = None
        self.intent = 0  # rows the current insert may write (set by acquire(rows=))
        self._delay = 50e-6
        self._holding = False  # this process holds the mutex (entered and not yet left)
        #: called with the published generation when this process repairs the table after a crash
        #: (parts with state of their own undo a dead holder's writes: ``EpisodeSync.recover``)
        self.on_recover: Any = None
        #: True while this process repairs the table (``reconcile`` may load a state that is not final)
        self.recovering = False

    @property
    def generation(self) -> int:
        """The generation of the state the local Table holds (the published one, while holding the lock)."""
        return self._gen

    # -- state copies ---------------------------------------------------------------------------
    def start(self, values: tuple) -> None:
        """Publish the first state of a new segment (generation 0) as the one the local Table holds."""
        self.copies.publish(0, values)
        self._gen, self._values = 0, values

    def value(self, name: str) -> Any:
        """A scalar of the state the local Table holds (the last one loaded or published; live: now)."""
        if self._live is not None:
            return self.table.state_scalars()[self._position[name]]
        return self._values[self._position[name]]

    # -- enter / leave ------------------------------------------------------------------------------
    def _enter_flock(self, intent: int) -> None:
        """Open the section where each process holds a copy of the scalars (``self._enter`` there)."""
        seg = self.segment
        if seg.closed:
            raise Closed(f"shared table {self.table.name!r} was closed in this process")
        if not self._mutex.acquire(seg.lock_timeout):
            raise seg.lock_timed_out()
        try:
            words = seg.words
            if words[W_BUSY]:
                self._recover()
            set_word(words, W_BUSY, seg.pid)  # (before this section's writes: see .reads)
            copies = self.copies
            if copies.generation() != self._gen:  # another process published since: load its state
                gen, _, values = copies.read()
                self.table.load_state_scalars(values)
                self._gen, self._values = gen, values
            if intent:
                self.intent = intent
                copies.set_intent(intent)
        except BaseException:
            self._mutex.release()
            raise
        self._holding = True

    def _enter_live(self, intent: int) -> None:
        """Open the section where the scalars live in the segment (``self._enter`` there): one compiled call."""
        seg = self.segment
        if seg.closed:
            raise Closed(f"shared table {self.table.name!r} was closed in this process")
        code = enter_section(self._mutex, seg.lock_timeout, W_BUSY, self.copies, self._gen, intent)
        if code < 0:
            raise seg.lock_timed_out()
        if code == 1:  # the previous holder died inside: repair, then open the section
            self._open_after_dead_holder(intent)
            return
        if code:
            try:
                gen = self.copies.generation()
                if gen != self._gen:  # committed since: our structures catch up
                    self._gen = gen
                    # (a table without parts of its own, still in ring mode, has nothing to catch up)
                    if self._moved_always or not self._live[self._ring_word]:
                        self.table.state_moved()
            except BaseException:
                self._mutex.release()
                raise
        self.intent = intent
        self._holding = True

    def _open_after_dead_holder(self, intent: int) -> None:
        """(mutex held, the busy word still set by a holder that died inside) Repair, then open the section."""
        try:
            self._recover()
            set_word(self.segment.words, W_BUSY, self.segment.pid)
            if intent:
                self.copies.set_intent(intent)
            if self.copies.generation() != self._gen:  # committed since: our structures catch up
                self._gen = self.copies.generation()
                self.table.state_moved()
        except BaseException:
            self._mutex.release()
            raise
        self.intent = intent
        self._holding = True

    def ring_inserter(
        self, words: "np.ndarray", slots: bytes, capacity: int, max_rows: int, limits: tuple, parts: tuple
    ) -> Any:
        """A compiled ring insert over this guard's lock (``_sync.RingInserter``, see its source), or None.

        ``parts``: ``(names, columns, meta)`` (``meta``: the table's ``(capacity, 2)`` or
        ``(capacity, 1)`` int64 metadata rows). None where this guard cannot give one (the module
        built without NumPy's headers, or the scalars not in the segment).
        """
        if RingInserter is None or self._live is None:
            return None
        return RingInserter(
            self._mutex,
            self.copies,
            words,
            slots,
            capacity,
            max_rows,
            (W_BUSY, W_UNORDERED, W_RESERVED, H.W_WRITTEN_HI),
            limits,
            *parts,
            self.segment.lock_timeout,
        )

    def ring_sampler(
        self, words: "np.ndarray", slots: bytes, capacity: int, limits: tuple, parts: tuple, sampler: Any
    ) -> Any:
        """A compiled ring-mode uniform sample over this guard's lock (``_sync.RingSampler``, see its source), or None.

        ``parts``: ``(names, columns, meta, key_column)``: as for :meth:`ring_inserter`, and the
        table's ``(capacity,)`` key column (read once ring mode is over); ``limits``:
        ``(samples_per_insert, min_diff, min_size_to_sample)``; ``sampler``: the table's
        ``Uniform`` (its numbers come from ``sampler.rng``). None where this guard cannot give one.
        """
        if RingSampler is None or self._live is None:
            return None
        return RingSampler(
            self._mutex,
            self.copies,
            words,
            slots,
            capacity,
            self.segment.words,
            (W_BUSY, W_UNORDERED, W_ACQUIRED, H.W_WRITTEN_HI),
            limits,
            *parts,
            self.segment.lock_timeout,
            sampler,
        )

    def ring_insert(self, inserter: Any, data: dict, batched: bool = True) -> "np.ndarray | int | None":
        """A small ring-mode insert of ``data`` in one critical section, compiled (``inserter``: :meth:`ring_inserter`).

        ``batched``: ``data`` is a batch (``inserter.insert``), else one item (``inserter.add``).
        Returns the items' keys (the batch is in, committed; one item: its key), or None: not taken here, nothing
        changed, the lock is free again (this thread is inside the guard already, or the batch
        is not for the compiled path: the caller takes its Python path, which says why). A
        previous holder that died inside is recovered here first, as :meth:`acquire` does.
        (The compiled call does not take this guard's thread lock: the mutex keeps its section
        whole, see ``ring_insert_guarded`` in ``_sync.c``; callers on the hot path call it
        directly and pass an int result to :meth:`ring_insert_refused`.)

        Raises:
            Timeout: the lock was not had within the segment's ``lock_timeout``.
        """
        r = (inserter.insert if batched else inserter.add)(self, data)
        if type(r) is not int or r >= 0:  # (the keys, or the key of one item)
            return r
        self.ring_insert_refused(r)
        return None

    def ring_insert_refused(self, code: int) -> None:
        """Act on a compiled insert's int result (``RingInserter.insert``/``add``): -1 nothing to do.

        -2 (a previous holder died inside; the mutex is held): repair the table as :meth:`acquire`
        does, then release it; the caller takes its Python path.

        Raises:
            Timeout: ``code`` -3, the lock was not had within the segment's ``lock_timeout``.
        """
        if code == -2:
            self._open_after_dead_holder(0)
            self._leave()
        elif code == -3:
            raise self.segment.lock_timed_out()

    def _leave(self) -> None:
        if not self._holding:  # (a wait that could not re-enter: nothing to publish or release)
            return
        self._holding = False
        if self._live is not None:
            try:
                if self._parts_publish:
                    self.table.before_publish()
                if _HOOK and self.table.state_scalars() != self.copies.read()[2]:
                    _pause(_HOOK)
            finally:  # (commits, clears the notes and the busy word, releases: one compiled call)
                victims = self._victims if self._noted else None
                self._noted = False
                intent, self.intent = self.intent, 0
                self._gen = leave_section(
                    self._mutex, W_BUSY, W_UNORDERED, self.copies, self._live, self._gen, intent, victims
                )
            return
        try:
            values = self.table.state_scalars()
            if values != self._values:
                if _HOOK:
                    _pause(_HOOK)
                self._gen += 1
                self.copies.publish(self._gen, values)
                self._values = values
            elif self.intent:
                self.copies.set_intent(0)
            self.intent = 0
            if self._noted:
                self._noted = False
                self._victims[0] = 0
            set_word(self.segment.words, W_UNORDERED, 0)
            set_word(self.segment.words, W_BUSY, 0)  # (after this section's writes: see .reads)
        finally:
            self._mutex.release()  # (yields the CPU once when another process waits for it)

    def mark_unordered(self) -> None:
        """Mark the open section as writing payload rows before their keys (mutex held; cleared on leaving).

        A sample that copied outside the lock then waits for the section to end before it trusts
        the keys (:mod:`.reads`); ordered before the writes that follow.
        """
        set_word(self.segment.words, W_UNORDERED, 1)

    def note_victims(self, slots: "np.ndarray") -> None:
        """Note the slots an insert will overwrite in place (mutex held), before it writes them.

        A process that dies after this drops those items when the table is recovered (their
        rows may be torn). The notes are cleared when the critical section is left.
        """
        v = self._victims
        n = int(v[0])
        k = len(slots)
        if n + k >= len(v):  # (two inserts in one section: the first one is complete)
            n = 0
        v[1 + n : 1 + n + k] = slots
        v[0] = n + k
        self._noted = True
        if _HOOK_VICTIMS:
            _pause(_HOOK_VICTIMS)

    def _recover(self) -> None:
        """The previous holder died inside the critical section: make the table consistent."""
        gen, intent, values = self.copies.read()
        if self.on_recover is not None:
            self.on_recover(gen)
        # (victims are noted out of ring mode only, whose regions are reserved; a hole is not read)
        victims = self._victims[1 : 1 + int(self._victims[0])].copy() if self.segment.deferred_ready else None
        self.recovering = True  # (parts that follow the published state wait for the repaired one)
        try:
            if self._live is not None:  # the dead holder's half-made changes: back to the published state
                self.table.load_state_scalars(values)
            fixed, dropped = reconcile(self.table, self.segment, self.names, values, intent, victims)
            if self._live is not None:
                self.table.load_state_scalars(fixed)
        finally:
            self.recovering = False
        if victims is not None:
            self._victims[0] = 0
        self.copies.publish(gen + 1, fixed)
        words = self.segment.words
        words[W_RECOVERIES] += 1
        if dropped:
            import logging

            logging.getLogger("replaystore.shared").warning(
                "shared table %r: a process died inside the lock; %d item(s) it may have overwritten were dropped",
                self.table.name,
                dropped,
            )

    # -- the lock protocol ---------------------------------------------------------------------
    def acquire(self, blocking: bool = True, timeout: float = -1, rows: int = 0) -> bool:
        """Enter (re-entrant); blocks up to the segment's ``lock_timeout`` (``Timeout``). Returns True.

        ``rows``: an insert that may write that many rows (noted for recovery until released).
        """
        self._tlock.acquire()
        if self._depth:
            self._depth += 1
            if rows > self.intent:
                self.intent = rows
                self.copies.set_intent(rows)
            return True
        try:
            self._enter(rows)
        except BaseException:
            self._tlock.release()
            raise
        self._depth = 1
        return True

    def release(self) -> None:
        """Leave one level; the outermost publishes and releases the mutex."""
        if self._depth > 1:
            self._depth -= 1
            self._tlock.release()
            return
        self._depth = 0
        self._delay = 50e-6
        try:
            self._leave()
        finally:
            self._tlock.release()

    __enter__ = acquire

    def __exit__(self, *exc: Any) -> None:
        if self._depth > 1:  # (release's nested case, one call less: the Table's methods nest in ours)
            self._depth -= 1
            self._tlock.release()
        else:
            self.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Publish, release every level, sleep a little (at most ``timeout``), re-enter. Returns True.

        The sleeps double from 50 µs to 2 ms while a wait goes on. Raises ``Closed`` (or
        ``Timeout`` for the mutex) if it cannot re-enter; the caller's levels are then still
        counted, and leaving them releases nothing more.
        """
        delay = self._delay if timeout is None else max(0.0, min(self._delay, timeout))
        self._delay = min(self._delay * 2, 2e-3)
        self.pause(delay)
        return True

    def pause(self, seconds: float, until: "Callable[[], bool] | None" = None, poll: float = 20e-6) -> None:
        """Publish, release every level, sleep ``seconds``, re-enter (as :meth:`wait`, without its back-off).

        With ``until``: sleep until it returns True (called every ``poll`` seconds, without the
        lock: it may read only what a word of the segment says), at most ``seconds``.
        """
        depth, intent = self._depth, self.intent
        self._depth = 0
        try:
            try:
                self._leave()
            finally:
                for _ in range(depth):
                    self._tlock.release()
            if until is None:
                time.sleep(seconds)
            else:
                end = time.monotonic() + seconds
                while not until() and time.monotonic() < end:
                    time.sleep(poll)
        finally:  # (also on Ctrl-C in the sleep or as the section is left: re-enter, so the
            # caller's levels leave as usual; a signal can land when leave_section returns)
            for _ in range(depth):
                self._tlock.acquire()
            self._depth = depth
            if not self._holding:  # (still held only if the interrupt came before the release)
                self._enter(intent)

    def notify_all(self) -> None:
        """Nothing: waiters in every process poll."""

    notify = notify_all

    def after_fork(self) -> None:
        """In a forked child: a fresh thread lock (the parent's threads are not here)."""
        self._tlock = threading.RLock()
        self._depth = 0


def _pause(marker: str) -> None:
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)
