"""Write docs/api.md from the docstrings of replaystore's public names.

Usage: python docs/gen_api.py > docs/api.md
"""

from __future__ import annotations

import importlib
import inspect


def _doc(obj: object) -> str:
    return inspect.cleandoc(obj.__doc__ or "(no docstring)")


MODULES = [
    "replaystore",
    "replaystore.monitor",
    "replaystore.episodes",
    "replaystore.her",
    "replaystore.mixing",
    "replaystore.offline",
    "replaystore.online",
    "replaystore.prefetch",
    "replaystore.rows",
    "replaystore.storage.compressed",
    "replaystore.integrations.torch",
    "replaystore.integrations.gym",
    "replaystore.integrations.sb3",
    "replaystore.integrations.sb3_her",
    "replaystore.integrations.dataloader",
    "replaystore.ray",
    "replaystore.ray.wal",
    "replaystore.storage.fragments",
    "replaystore.compat.ding",
    "replaystore.compat.minestudio",
    "replaystore.compat.gfn",
]


def _public(module: object) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and getattr(v, "__module__", "").startswith(module.__name__)]
    return sorted(n for n in names if not n.startswith("_"))


def _document(name: str, obj: object) -> None:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        sig = ""
    print(f"### `{name}{sig}`\n")
    print(_doc(obj) + "\n")
    if not inspect.isclass(obj):
        return
    for mname, member in sorted(vars(obj).items()):
        if mname.startswith("_") or not callable(getattr(obj, mname, None)):
            continue
        func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if not inspect.isfunction(func) or not func.__doc__:
            continue
        print(f"- `{mname}{inspect.signature(func)}`: " + _doc(func).replace("\n", "\n  ") + "\n")


def main() -> None:
    """Print the reference to stdout."""
    print("# API reference\n")
    print("Generated from the docstrings by `python docs/gen_api.py > docs/api.md`; do not edit by hand.\n")
    for modname in MODULES:
        try:
            module = importlib.import_module(modname)
        except ImportError as e:  # an optional extra is missing
            print(f"## `{modname}`\n\n(not importable here: {e})\n")
            continue
        print(f"## `{modname}`\n")
        print(_doc(module).split("\n\n")[0] + "\n")
        for name in _public(module):
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                _document(name, obj)


if __name__ == "__main__":
    main()
