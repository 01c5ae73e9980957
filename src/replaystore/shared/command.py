"""``replaystore shm list|rm``: the shared tables of a directory, and removal of leftovers.

``list`` prints one line per table (name, state, size, attached pids, path); a table no process
has open is a *leftover* (its processes crashed or exited without closing it, or it was kept on
purpose). ``rm NAME ...`` removes leftovers by name, ``rm --all`` every leftover; a table that is
still open is removed only with ``--force`` (its processes keep their mapping until they close).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from .directory import default_directory, list_segments
from .errors import SharedTableExists, SharedTableNotFound


def add_parser(sub: Any) -> None:
    """Register the ``shm`` subcommand (``shm list``, ``shm rm``) on an ``argparse`` subparsers object.

    ``list`` and ``rm`` are subcommands of their own, so options go anywhere after them
    (``rm --force NAME`` as well as ``rm NAME --force``); ``--dir`` also before them.
    """
    shm = sub.add_parser(
        "shm",
        help="list shared tables, remove leftovers of crashed runs",
        description="List the shared-memory tables of a directory (default /dev/shm) "
        "and remove leftovers that no process has open.",
    )
    dir_help = f"directory of the tables (default {default_directory()})"
    shm.add_argument("--dir", default=None, help=dir_help)
    actions = shm.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = actions.add_parser("list", help="the tables of the directory, open or leftover")
    rm = actions.add_parser("rm", help="remove tables by name, or every leftover (--all)")
    rm.add_argument("names", nargs="*", help="the tables to remove")
    rm.add_argument("--all", action="store_true", help="every leftover")
    rm.add_argument("--force", action="store_true", help="also tables that are still open")
    for p in (ls, rm):  # (SUPPRESS: an absent --dir here keeps the one given before the action)
        p.add_argument("--dir", default=argparse.SUPPRESS, help=dir_help)
    shm.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``replaystore shm``; returns the exit status.

    1 when a named table could not be removed; 2 for ``rm`` with neither a name nor ``--all``.
    """
    from . import remove

    infos = list_segments(args.dir)
    if args.action == "list":
        if not infos:
            print(f"no shared tables in {args.dir or default_directory()}")
        for s in infos:
            state = "leftover" if s["orphaned"] else "open"
            extra = f" ({s['error']})" if "error" in s else ""
            print(
                f"{s['name']:24s} {state:8s} {s.get('held', 0) / 2**20:10.1f} MiB held "
                f"(of {s.get('bytes', 0) / 2**20:.1f})  "
                f"capacity {s.get('capacity', '?')}  pids {s.get('pids') or '-'}  {s['path']}{extra}"
            )
        return 0
    if not args.names and not args.all:
        print("replaystore shm rm: name the tables to remove, or pass --all (every leftover)", file=sys.stderr)
        return 2
    names = list(args.names) + (
        [s["name"] for s in infos if s["orphaned"] and not s.get("incomplete")] if args.all else []
    )
    status = 0
    for s in infos:
        if args.all and s.get("incomplete"):
            shutil.rmtree(s["path"], ignore_errors=True)
            print(f"removed {s['name']} (incomplete)")
    for name in dict.fromkeys(names):
        try:
            remove(name, args.dir, force=args.force)
            print(f"removed {name}")
        except (SharedTableNotFound, SharedTableExists) as e:
            print(f"not removed: {e}")
            status = 1
    return status
