"""Write docs/api.md from the docstrings of replaystore's public names.

Usage: python docs/gen_api.py > docs/api.md
"""

from __future__ import annotations

import inspect

import replaystore as rs


def _doc(obj: object) -> str:
    return inspect.cleandoc(obj.__doc__ or "(no docstring)")


def main() -> None:
    """Print the reference to stdout."""
    print("# API reference\n")
    print("Generated from the docstrings by `python docs/gen_api.py > docs/api.md`; do not edit by hand.\n")
    for name in sorted(n for n in rs.__all__ if not n.startswith("_")):
        obj = getattr(rs, name)
        if not inspect.isclass(obj):
            continue
        try:
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = ""
        print(f"## `{name}{sig}`\n")
        print(_doc(obj) + "\n")
        for mname, member in sorted(vars(obj).items()):
            if mname.startswith("_") or not callable(getattr(obj, mname, None)):
                continue
            func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if not inspect.isfunction(func) or not func.__doc__:
                continue
            print(f"- `{mname}{inspect.signature(func)}`: " + _doc(func).replace("\n", "\n  ") + "\n")


if __name__ == "__main__":
    main()
