"""The fragment buffer's calls the fragment service forwards as they are, as data.

:data:`CALLS` maps the name a call is served under (several keep MineStudio's names: a declared
rename) to the :class:`~replaystore.fragments.FragmentBuffer` call it forwards. The service's methods
and the client's :data:`CLIENT` calls are generated from it with the Table's mechanism (the buffer
method's docstring and signature); the calls that do more than forward are written by hand
(docs/architecture.md, "Next").
"""

from __future__ import annotations

import functools

from ..table.contract import Call
from .buffer import FragmentBuffer

_call = functools.partial(Call, of=FragmentBuffer, mutating=True)

#: served name -> the FragmentBuffer call it forwards as is
CALLS: dict[str, Call] = {
    "release": _call("release"),
    "renew_lease": _call("renew"),
    "update_model_version": _call("set_version"),
    "compact_store": _call("compact"),
    "drain": _call("drain"),
    "check_nodes": _call("check_nodes"),
}

#: the served calls the client (``FragmentClient``) forwards under the same name
CLIENT = ("update_model_version", "drain", "check_nodes")

__all__ = ["CALLS", "CLIENT"]
