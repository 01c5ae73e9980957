"""A griffe extension for the API reference: the Table methods generated from the contract.

``ReplayClient``, ``LoggedTable``, ``OnlineClient``, ``FragmentClient`` and the service's
``OnlineService`` (its ``online_*`` calls, ``ReplayServer``'s base) and ``FragmentService`` get
some of their methods from the contract
(``replaystore.table.contract.install`` and the like) at import time, which static analysis cannot
see; so do the step writes of ``ShardedEpisodes`` (``ShardedClient``'s base). For those classes
this extension inspects the imported class and adds the generated methods (with the Table's, or
the rollout buffer's, signatures and docstrings) to what the reference shows; subclasses list them
through mkdocstrings' ``inherited_members``. ``ReplayServer``'s own table calls are left out: users
make them through ``ReplayClient`` (the Table's docstrings name client-side arguments, such as
``as_tensor``, that the service's signatures drop).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import griffe

# import the package from this checkout's src/ (the tree griffe reads statically, mkdocs.yml's
# ``paths: [src]``), not from whatever other copy is installed
SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

TABLE, ONLINE, FRAGMENTS = "replaystore.table.contract", "replaystore.online.contract", "replaystore.fragments.contract"
#: class -> (the module whose ``CALLS`` generated its methods, the prefix of their names)
TARGETS = {
    "replaystore.ray.client.ReplayClient": (TABLE, ""),
    "replaystore.ray.sharded.client.ShardedClient": (TABLE, ""),
    "replaystore.ray.sharded.episodes.ShardedEpisodes": (TABLE, ""),
    "replaystore.wal.logged.LoggedTable": (TABLE, ""),
    "replaystore.ray.online_client.OnlineClient": (ONLINE, ""),
    "replaystore.ray.server_online.OnlineService": (ONLINE, "online_"),
    # (the fragment contract's CALLS are keyed by the served names)
    "replaystore.ray.fragments.client.FragmentClient": (FRAGMENTS, ""),
    "replaystore.ray.fragments.service.FragmentService": (FRAGMENTS, ""),
}


class ContractMethods(griffe.Extension):
    """Add a class's contract-generated methods to its static griffe object."""

    def on_class_members(self, *, cls: griffe.Class, agent: Any = None, **kwargs: Any) -> None:  # noqa: D102
        if cls.path not in TARGETS:
            return
        contract, prefix = TARGETS[cls.path]
        calls = importlib.import_module(contract).CALLS
        module = importlib.import_module(cls.module.path)
        live = getattr(module, cls.name)
        # the loader's docstring style (google), so the generated methods' Args/Returns/Raises
        # sections are parsed (and checked) like the rest, not shown as raw text
        inspected = griffe.inspect(
            cls.module.path,
            filepath=None,
            import_paths=None,
            docstring_parser=getattr(agent, "docstring_parser", None),
            docstring_options=getattr(agent, "docstring_options", None),
        )[cls.name]
        for name in (prefix + call for call in calls):
            if name not in cls.members and name in inspected.members and callable(getattr(live, name, None)):
                member = inspected.members[name]
                member.parent = cls
                cls.set_member(name, member)
