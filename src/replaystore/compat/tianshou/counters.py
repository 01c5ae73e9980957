"""The per-sub-buffer counters of a Tianshou buffer manager, advanced for a whole ``add`` in one compiled call.

Tianshou's ``ReplayBufferManager.add`` calls each sub-buffer's ``_update_state_pre_add`` in a
Python loop (one per environment). :func:`advance` does the same bookkeeping for all rows of a
batch in one numba call (Tianshou depends on numba, so this adds nothing to install). Rows are
processed in order, so repeated sub-buffer ids behave as Tianshou's loop does.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def advance(  # noqa: PLR0913
    ids: np.ndarray,
    rew: np.ndarray,
    done: np.ndarray,
    cap: np.ndarray,
    ins: np.ndarray,
    lengths: np.ndarray,
    ret: np.ndarray,
    eplen: np.ndarray,
    start: np.ndarray,
    last_local: np.ndarray,
    last_global: np.ndarray,
    offset: np.ndarray,
    out_pos: np.ndarray,
    out_ret: np.ndarray,
    out_len: np.ndarray,
    out_start: np.ndarray,
) -> bool:
    """Advance the counters of sub-buffers ``ids`` by one transition each (rewards ``rew``, ends ``done``).

    Writes each row's global insertion index, finished-episode return and length (0 while the
    episode runs) and global episode start into the ``out_*`` arrays. Returns False, changing
    nothing, when a sub-buffer's episode start lies beyond its stored transitions (Tianshou's
    ``MalformedBufferError``; checked for the batch's first row of each sub-buffer).
    """
    n = len(ids)
    for j in range(n):
        b = ids[j]
        if start[b] > min(lengths[b] + 1, cap[b]):
            return False
    for j in range(n):
        b = ids[j]
        cur = ins[b]
        last_local[b] = cur
        lengths[b] = min(lengths[b] + 1, cap[b])
        nxt = (cur + 1) % cap[b]
        ins[b] = nxt
        r = ret[b] + rew[j]
        k = eplen[b] + 1
        p = cur + offset[b]
        last_global[b] = p
        out_pos[j] = p
        out_start[j] = start[b] + offset[b]
        if done[j]:
            out_ret[j] = r
            out_len[j] = k
            ret[b] = 0.0
            eplen[b] = 0
            start[b] = nxt
        else:
            out_ret[j] = 0.0
            out_len[j] = 0
            ret[b] = r
            eplen[b] = k
    return True
