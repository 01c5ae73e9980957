"""The rollout buffer's calls as data: the served client and the service's dispatch derive from it.

:data:`CALLS` lists the :class:`~replaystore.online.RolloutBuffer` calls a served rollout buffer
offers (``serve(online=...)``, :class:`~replaystore.ray.OnlineClient`), each a
:class:`~replaystore.table.contract.Call` with ``of=RolloutBuffer``: whether it may wait (it takes
``timeout``) and whether it changes the buffer. The client's methods and the service's
``online_<call>`` methods are generated from it with the Table's mechanism
(:func:`~replaystore.table.contract.forward`: the buffer method's name, docstring and
signature), so a new rollout-buffer call is served by adding it here.
"""

from __future__ import annotations

import functools

from ..table.contract import Call
from .buffer import RolloutBuffer

_call = functools.partial(Call, of=RolloutBuffer)

#: the served calls, producers' first, then the trainer's and the buffer's
CALLS: dict[str, Call] = {
    c.name: c
    for c in (
        _call("acquire", blocking=True, mutating=True),
        _call("try_acquire", mutating=True),
        _call("held"),
        _call("version_of"),
        _call("renew", mutating=True),
        _call("abandon", mutating=True),
        _call("finish", mutating=True),
        _call("discard", mutating=True),
        _call("cancel_slowest", mutating=True),
        _call("pause", mutating=True),
        _call("resume", mutating=True),
        _call("add", mutating=True),
        _call("add_group", mutating=True),
        _call("reject", mutating=True),
        _call("sample", blocking=True, mutating=True),
        _call("set_version", mutating=True),
        _call("wait_for_version", blocking=True),
        _call("stats"),
        _call("report", mutating=True),
        _call("close", mutating=True),
        _call("expire", mutating=True),
    )
}

__all__ = ["CALLS"]
