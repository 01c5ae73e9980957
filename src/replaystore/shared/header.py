"""The header page of a shared table's segment: its words, and the checks of its configuration.

The header (int64 words): magic, layout version, sizes, creator pid, the pid of the process inside
the critical section (``busy``, zero outside it), which of the two state copies is current, the
pid of a process waiting for the mutex, the lock kind, the acquisitions counter, the *unordered*
and *reserved* words (:mod:`replaystore.shared.reads`, :mod:`replaystore.shared.reserve`), two
copies of the Table's scalar state (``Table.state_scalars``) each led by a generation number and
an insert *intent* (rows an insert in progress may be writing), the attached pids, whether the
deferred regions are reserved, and at ``lock.MUTEX_BYTE`` the mutex itself. A writer fills the
state copy that is not current and then flips the selector (one aligned 8-byte store), so a
reader, or a process that recovers after a writer died, always finds one complete copy.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np

from .errors import LayoutMismatch
from .lock import MUTEX_BYTE

MAGIC = int.from_bytes(b"RSSHMTB1", "little")
# 2: state copies of 120 words (every part's scalars), out-of-ring regions; 3: the lock kind word;
# 4: slot stamps (samples copy outside the lock); 5: no stamps (the keys tell: replaystore.shared.reads);
# 6: ring reservations (W_RESERVED); 7: deferred regions (W_DEFERRED)
LAYOUT_VERSION = 7
PAGE = 4096

# header words
W_MAGIC, W_VERSION, W_HEADER, W_TOTAL, W_JSON_OFF, W_JSON_LEN, W_CREATOR, W_CREATED = range(8)
W_BUSY, W_ACTIVE, W_RECOVERIES, W_WAITING, W_LOCK_KIND, W_ACQUIRED = 8, 9, 10, 11, 12, 13
#: set while the open critical section writes payload rows before their keys (shared.reads)
W_UNORDERED = 14
#: the pid of the process copying a batch into ring slots it reserved, or 0 (shared.table: inserts wait)
W_RESERVED = 15
COPY_WORDS = 120  # generation, intent, then the scalars (Table.state_layout)
COPY0 = 16  # first word of state copy 0; copy 1 follows
PIDS = COPY0 + 2 * COPY_WORDS  # the table of attached pids
MAX_PIDS = 128
#: 1 once the deferred regions (if any) hold their blocks and initial contents, else 0
W_DEFERRED = PIDS + MAX_PIDS
HEADER_BYTES = PAGE
assert (W_DEFERRED + 1) * 8 <= MUTEX_BYTE < HEADER_BYTES - 64, "the header's words overlap its mutex"
#: the region where an insert notes the slots it overwrites in place (count, then slots)
VICTIMS = "shared.victims"


def read_config(mm: mmap.mmap, path: Path, size: int) -> dict:
    """The configuration of the segment ``mm`` (``size`` bytes, at ``path``), checked: it is untrusted input.

    Raises:
        LayoutMismatch: not a table segment of this layout version, or a configuration that does
            not fit the file (regions, deferred regions and their fills).
    """
    words = memoryview(mm).cast("q")
    try:
        magic, version, total = words[W_MAGIC], words[W_VERSION], words[W_TOTAL]
        off, length = words[W_JSON_OFF], words[W_JSON_LEN]
    finally:
        words.release()
    if magic != MAGIC:
        raise LayoutMismatch(f"{path / 'segment'} is not a replaystore shared table (bad magic)")
    if version != LAYOUT_VERSION:  # (version 1 had no lock kind word: it locked with flock)
        raise LayoutMismatch(
            f"{path / 'segment'} has layout version {version}; this replaystore reads "
            f"version {LAYOUT_VERSION}: open it with the version that created it"
        )
    if total != size or not (HEADER_BYTES <= off and 0 < length and off + length <= size):
        raise LayoutMismatch(f"{path / 'segment'}: header sizes do not match the file ({size} bytes)")
    try:
        config = json.loads(bytes(mm[off : off + length]))
        for r in config["regions"]:
            nbytes = int(np.prod(r["shape"], dtype=np.int64)) * np.dtype(r["dtype"]).itemsize
            if r["offset"] < HEADER_BYTES or r["offset"] + nbytes > size:
                raise ValueError(f"region {r['name']!r} lies outside the file")
        deferred = config["deferred"]
        start, fills = deferred["offset"], deferred["fill"]
        if type(start) is not int or start % PAGE or not HEADER_BYTES <= start <= size:
            raise ValueError(f"the deferred regions' offset {start!r} is not a page inside the file")
        names = {r["name"]: r["offset"] for r in config["regions"]}
        for name, fill in fills.items():
            if names.get(name, -1) < start or type(fill) not in (bool, int, float):
                raise ValueError(f"deferred region {name!r} (fill {fill!r}) is not a region past {start}")
    except (ValueError, KeyError, TypeError) as e:
        raise LayoutMismatch(f"{path / 'segment'}: unreadable configuration ({e})") from None
    return config
