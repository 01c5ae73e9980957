"""A griffe extension for the docs site: Sphinx roles in docstrings become cross-reference links.

The docstrings use Sphinx/reST roles (``:class:`~replaystore.Table```, ``:meth:`sample```,
``:mod:`replaystore.shared```) that mkdocstrings' Google-style parser would show as literal text.
Once griffe has loaded the package, this extension rewrites each role into an autorefs
cross-reference to the object it names: the name is resolved the way Sphinx does (as written,
then relative to the documented object's class, module and parent packages, then as the unique
object whose dotted path ends with it) and emitted as an *optional* autorefs reference, so it
renders as a link when the target is on some page of the site and as code otherwise (never as a
warning, never as a raw role). ``~`` shortens the text to the last component, as in Sphinx.

Loaded by ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``); only the
docs build uses it, the package never imports it.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|meth|func|attr|exc|data|obj|const|type):`(?P<text>[^`]+)`")


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    """Every real (non-alias) object under ``obj``, ``obj`` included."""
    out = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            out.extend(_walk(member))  # type: ignore[arg-type]
    return out


class RstRoles(griffe.Extension):
    """Rewrites Sphinx roles in every docstring of a loaded package into autorefs references."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Once the package is loaded: rewrite the roles of every docstring in it (in place)."""
        objects = _walk(pkg)
        paths: dict[str, str] = {o.path: o.path for o in objects}  # dotted path -> canonical path
        aliases: dict[str, str] = {}
        for o in objects:
            for member in o.members.values():
                if member.is_alias:
                    aliases[member.path] = member.target_path  # type: ignore[union-attr]
        for path in aliases:
            target, seen = aliases[path], {path}
            while target in aliases and target not in seen:  # an alias of an alias
                seen.add(target)
                target = aliases[target]
            if target in paths:
                paths[path] = target
        by_tail: dict[str, set[str]] = {}
        for path, canonical in paths.items():
            parts = path.split(".")
            for i in range(1, len(parts)):
                by_tail.setdefault(".".join(parts[i:]), set()).add(canonical)

        def resolve(name: str, where: griffe.Object) -> str | None:
            name = name.strip().rstrip("()").lstrip(".")
            if name in paths:
                return paths[name]
            scope: griffe.Object | None = where
            while scope is not None:
                candidate = f"{scope.path}.{name}"
                if candidate in paths:
                    return paths[candidate]
                scope = scope.parent
            found = by_tail.get(name, set())
            return next(iter(found)) if len(found) == 1 else None

        def rewrite(where: griffe.Object, text: str) -> str:
            def one(match: re.Match[str]) -> str:
                raw = match["text"].strip()
                if raw.endswith(">") and "<" in raw:  # :class:`title <target>`
                    title, target = raw[:-1].split("<", 1)
                    title, target = title.strip(), target.strip()
                else:
                    target = raw.lstrip("!~")
                    title = target.rsplit(".", 1)[-1] if raw.startswith("~") else target
                canonical = resolve(target.lstrip("!~"), where)
                code = f"<code>{html.escape(title)}</code>"
                if canonical is None:
                    return code
                return f'<autoref identifier="{html.escape(canonical)}" optional>{code}</autoref>'

            return ROLE.sub(one, text)

        for obj in objects:
            if obj.docstring is not None and ROLE.search(obj.docstring.value):
                obj.docstring.value = rewrite(obj, obj.docstring.value)
