"""The header page of a shared table's segment: its words, and the checks of its configuration.

The header (int64 words): magic, layout version, sizes, creator pid, the pid of the process inside
the critical section (``busy``, zero outside it), which of the two state copies is current, the pid
of a process waiting for the mutex, the lock kind, the acquisitions counter, the *unordered* and
*reserved* words (:mod:`replaystore.shared.reads`, :mod:`replaystore.shared.reserve`), two copies of
the Table's scalar state (``HostedTable.state_scalars``) each led by a generation number and an
insert *intent* (rows an insert in progress may be writing), the attached pids, whether the deferred
regions are reserved, *written_hi* (:mod:`replaystore.shared.reads`), and at ``lock.MUTEX_BYTE`` the
mutex itself. How the state copies are written: :mod:`replaystore.shared.copies`.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np

from .errors import LayoutMismatch
from .lock import MUTEX_BYTE, MUTEX_BYTES, init_mutex

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
COPY_WORDS = 120  # generation, intent, then the scalars (HostedTable.state_layout)
COPY0 = 16  # first word of state copy 0; copy 1 follows
PIDS = COPY0 + 2 * COPY_WORDS  # the table of attached pids
MAX_PIDS = 128
#: 1 once the deferred regions (if any) hold their blocks and initial contents, else 0
W_DEFERRED = PIDS + MAX_PIDS
#: in ring mode one past the newest key whose row a write may have begun (set before the payload:
#: the keys are implicit, shared.reads checks a sampled key against it), -1 once ring mode is over
W_WRITTEN_HI = W_DEFERRED + 1
HEADER_BYTES = PAGE
assert (W_WRITTEN_HI + 1) * 8 <= MUTEX_BYTE < HEADER_BYTES - 64, "the header's words overlap its mutex"
#: the region where an insert notes the slots it overwrites in place (count, then slots)
VICTIMS = "shared.victims"


def pid_max() -> int:
    """The largest process id this system hands out (``/proc/sys/kernel/pid_max``; else Linux's 2**22)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 22


#: words that hold a pid (or 0): creator, the critical section's holder, a waiter, a reserver
PID_WORDS = (W_CREATOR, W_BUSY, W_WAITING, W_RESERVED)
#: words that hold 0 or 1
FLAG_WORDS = (W_ACTIVE, W_UNORDERED, W_DEFERRED, W_LOCK_KIND)
#: counters (>= 0)
COUNT_WORDS = (W_CREATED, W_RECOVERIES, W_ACQUIRED)


def check_words(words: memoryview, path: Path) -> None:
    """Range-check the header's words (untrusted): pids, flags, counters, the state copies' generations.

    Raises:
        LayoutMismatch: a word out of its range (a pid that is negative or above ``pid_max``, a
            flag other than 0 or 1, a negative counter).
    """
    top = pid_max()
    bad = [(w, words[w]) for w in PID_WORDS if not 0 <= words[w] <= top]
    bad += [(w, words[w]) for w in range(PIDS, PIDS + MAX_PIDS) if not 0 <= words[w] <= top]
    bad += [(w, words[w]) for w in FLAG_WORDS if words[w] not in (0, 1)]
    bad += [(w, words[w]) for w in COUNT_WORDS if words[w] < 0]
    bad += [(W_WRITTEN_HI, words[W_WRITTEN_HI])] if words[W_WRITTEN_HI] < -1 else []
    bad += [(w, words[w]) for w in (COPY0, COPY0 + COPY_WORDS, COPY0 + 1, COPY0 + COPY_WORDS + 1) if words[w] < 0]
    if words[W_CREATOR] == 0 or words[W_HEADER] != HEADER_BYTES or words[W_JSON_OFF] != HEADER_BYTES:
        bad.append((W_CREATOR, words[W_CREATOR]))
    if bad:
        w, v = bad[0]
        raise LayoutMismatch(f"{path / 'segment'}: header word {w} holds {v}, out of its range (a damaged header)")


def check_state(names: tuple[str, ...], codes: str, values: tuple, capacity: int, path: Path) -> None:
    """Range-check a Table's published scalars read from the segment (untrusted) against its capacity.

    Integers are ``>= -1`` (``-1`` is the parts' "none"); the item count, the
    free slots and a selector's live count at most ``capacity``; the ring's key range inside the
    keys handed out; floats finite and ``>= 0``; flags 0 or 1.

    Raises:
        LayoutMismatch: naming the first value out of its range.
    """
    v = dict(zip(names, values))
    bad = [n for n, c in zip(names, codes) if c == "q" and v[n] < -1]  # (-1: "none", a sentinel)
    bad += [n for n, c in zip(names, codes) if c == "d" and not (np.isfinite(v[n]) and v[n] >= 0)]
    bad += [n for n in names if (n in ("size", "nfree") or n.endswith(".size")) and v[n] > capacity]
    if v.get("ring_mode", 0) not in (0, 1):
        bad.append("ring_mode")
    if "size" in v and "nfree" in v and v["size"] + v["nfree"] > capacity:
        bad.append("size + nfree")
    if {"ring_lo", "ring_hi", "next_key"} <= v.keys() and not (
        v["ring_lo"] <= v["ring_hi"] <= v["next_key"] and v["ring_hi"] - v["ring_lo"] <= capacity
    ):
        bad.append("ring_lo/ring_hi")
    if bad:
        raise LayoutMismatch(
            f"{path / 'segment'}: the table's state in its header is damaged ({bad[0]} = {v.get(bad[0])!r})"
        )


_FRESH: list[bytes | None] = []


def _fresh_mutex() -> bytes | None:
    """The bytes of a freshly initialised robust mutex (``None`` without the compiled module)."""
    if not _FRESH:
        fresh = None
        if init_mutex is not None:
            with mmap.mmap(-1, HEADER_BYTES) as buf:
                init_mutex(buf, MUTEX_BYTE)
                fresh = bytes(buf[MUTEX_BYTE : MUTEX_BYTE + MUTEX_BYTES])
        _FRESH.append(fresh)
    return _FRESH[0]


def check_mutex(mm: mmap.mmap, path: Path) -> None:
    """Compare the robust mutex's type field with a freshly initialised one's.

    Only the glibc layout (40 bytes, ``__kind`` at byte 16) is checked; a damaged type field would
    make every lock call fail with ``EINVAL``.

    Raises:
        LayoutMismatch: the type field differs.
    """
    fresh = _fresh_mutex()
    if fresh is None or len(fresh) != 40:
        return
    if bytes(mm[MUTEX_BYTE + 16 : MUTEX_BYTE + 20]) != fresh[16:20]:
        raise LayoutMismatch(f"{path / 'segment'}: the mutex in its header is damaged (its type field)")


def _int(v: object, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def check_schema(config: object) -> None:
    """The configuration's keys and types (untrusted JSON). Raises ValueError naming the first bad field."""
    if not isinstance(config, dict):
        raise ValueError("not an object")
    need = {"name": str, "capacity": int, "spec": dict, "sampler": dict, "remover": dict, "rate_limiter": dict}
    need.update(max_times_sampled=int, regions=list, deferred=dict)
    for k, t in need.items():
        if type(config.get(k)) is not t:
            raise ValueError(f"field {k!r} is missing or not a {t.__name__}")
    if config["capacity"] < 1 or config["max_times_sampled"] < 0:
        raise ValueError("capacity or max_times_sampled out of range")
    ms, dt = config.get("max_staleness"), config.get("default_timeout")
    if "max_staleness" not in config or not (ms is None or _int(ms)):
        raise ValueError(f"max_staleness {ms!r}")
    if "default_timeout" not in config or not (dt is None or type(dt) in (int, float)):
        raise ValueError(f"default_timeout {dt!r}")
    if not (config.get("episodes") is None or isinstance(config.get("episodes"), dict)):
        raise ValueError("episodes")
    for k in ("sampler", "remover", "rate_limiter"):
        if type(config[k].get("type")) is not str:
            raise ValueError(f"{k} has no type")
    for f in config["spec"].values():
        if not isinstance(f, dict) or not isinstance(f.get("shape"), list) or not isinstance(f.get("dtype"), str):
            raise ValueError(f"spec field {f!r}")
        if not all(_int(d) for d in f["shape"]) or np.dtype(f["dtype"]).hasobject:
            raise ValueError(f"spec field {f!r}")


def check_regions(config: dict, size: int, json_end: int) -> None:
    """Regions inside the file, page-aligned, past the configuration, not overlapping; deferred ones last.

    Raises:
        ValueError: naming the first region that breaks a rule.
    """
    deferred = config["deferred"]
    start, fills = deferred.get("offset"), deferred.get("fill")
    if not _int(start) or start % PAGE or not json_end <= start <= size or not isinstance(fills, dict):
        raise ValueError(f"the deferred regions' offset {start!r} is not a page inside the file")
    spans = []
    for r in config["regions"]:
        if not isinstance(r, dict) or type(r.get("name")) is not str or not _int(r.get("offset")):
            raise ValueError(f"region {r!r} has no name or offset")
        shape, dtype = r.get("shape"), r.get("dtype")
        if not isinstance(shape, list) or not all(_int(d) for d in shape) or type(dtype) is not str:
            raise ValueError(f"region {r['name']!r} has a bad shape or dtype")
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise ValueError(f"region {r['name']!r} holds Python objects")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        off, name = r["offset"], r["name"]
        if off % PAGE or off < json_end or off + nbytes > size:
            raise ValueError(f"region {name!r} at {off} is not a page past the configuration and inside the file")
        if (off < start) if name in fills else (off + nbytes > start):
            raise ValueError(f"region {name!r} is on the wrong side of the deferred regions' offset {start}")
        spans.append((off, off + nbytes, name))
    spans.sort()
    for (_, end, a), (off, _, b) in zip(spans, spans[1:]):
        if off < end:
            raise ValueError(f"regions {a!r} and {b!r} overlap")
    if len({n for _, _, n in spans}) != len(spans):
        raise ValueError("two regions have the same name")
    for name, fill in fills.items():
        if name not in {n for _, _, n in spans} or type(fill) not in (bool, int, float):
            raise ValueError(f"deferred region {name!r} (fill {fill!r}) is not a region past {start}")


def read_config(mm: mmap.mmap, path: Path, size: int) -> dict:
    """The configuration of the segment ``mm`` (``size`` bytes, at ``path``), checked: it is untrusted input.

    Raises:
        LayoutMismatch: not a table segment of this layout version, a header word out of its
            range, or a configuration that does not fit the file (its fields, regions outside the
            file, misaligned or overlapping, deferred regions and their fills).
    """
    words = memoryview(mm).cast("q")
    try:
        magic, version, total = words[W_MAGIC], words[W_VERSION], words[W_TOTAL]
        off, length = words[W_JSON_OFF], words[W_JSON_LEN]
        if magic == MAGIC and version == LAYOUT_VERSION:
            check_words(words, path)
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
        check_schema(config)
        check_regions(config, size, off + length)
    except (ValueError, KeyError, TypeError, OverflowError, AttributeError, SyntaxError) as e:  # (np.dtype parses)
        raise LayoutMismatch(f"{path / 'segment'}: unreadable configuration ({e})") from None
    return config
