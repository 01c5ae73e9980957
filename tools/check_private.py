"""No module uses another module's private members (issue 21): an ``ast`` check of ``src/replaystore``.

Usage::

    python tools/check_private.py [SRC_DIR]     # default: src/replaystore next to this file

Prints one line per violation (``path:line:col: code message``) and exits 1 if there is any, 0
otherwise. Two rules:

- **PRV001 private attribute**: ``x._name`` (not a dunder) where ``x`` is not ``self``, ``cls`` or
  ``super()``, and ``_name`` is not defined in the same module (a module-level name, a class
  attribute or method, ``self._name = ...``, a ``__slots__`` entry; an imported name does not
  count). So ``other._count`` inside
  the class that defines ``_count`` passes; ``table._insert(...)`` in a module that is not the
  Table's fails.
- **PRV002 private import**: ``from M import _name`` (or importing a private module,
  ``from ..ray import _runtime`` / ``import replaystore.ray._runtime``) where ``M`` belongs to
  another *unit*.

A unit is one top-level module or package of ``replaystore`` (``replaystore.table``,
``replaystore.ray``, ...); inside ``compat`` and ``integrations``, which only group independent
packages, each child is its own unit (``replaystore.compat.ding``). Modules of one unit may
import each other's private names (a package shares its internals); private *attributes* are
shared across modules only in the units of :data:`SHARED_UNITS`.

The allow-lists below are short on purpose; each entry says why.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "replaystore"
#: Packages that only group independent packages: each child is a unit of its own.
NAMESPACES = {"compat", "integrations"}
#: Units whose modules may use each other's private attributes: the Table is one object whose
#: code is split into several modules of its own package (issue 21: ring bookkeeping, fast paths,
#: stats); they share its state.
SHARED_UNITS = {"replaystore.table"}
#: Private names of *other* libraries' public APIs: the namedtuple methods (documented with a
#: leading underscore to avoid clashes with field names).
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
#: Private modules that are the other half of a unit: ``_rows`` (and ``_ring``, the compiled
#: Table.add / small extend) is the compiled version of
#: ``rows.py`` (same contract, ``rows`` falls back to NumPy when it is not built).
UNIT_OF_PRIVATE_MODULE = {"replaystore._rows": "replaystore.rows", "replaystore._ring": "replaystore.rows"}
#: ``(module, attribute)`` pairs allowed despite PRV001, each for a reason outside our control.
ALLOWED_ATTRIBUTES = {
    # torch.distributed: ``Work._source_rank()`` is the only way to learn who sent the message an
    # ``irecv`` from any source received (``recv`` returns it, but blocks).
    ("replaystore.compat.gfn.torch_backend", "_source_rank"),
    # TorchRL 0.14's sampler contract: a sampler learns the storage's fill state, write cursor and
    # mutation counter only from these attributes (TorchRL's own SliceSampler reads them), and a
    # sampler class declares its replacement=False variant in this registry (re-exported by
    # torchrl.data.replay_buffers.samplers for that purpose).
    ("replaystore.integrations.torchrl.slices", "_mutation_revision"),
    ("replaystore.integrations.torchrl.slices", "_is_full"),
    ("replaystore.integrations.torchrl.slices", "_last_cursor_index"),
    ("replaystore.integrations.torchrl.slices", "_REPLACEMENT_DISPATCH"),
    # The TorchRL buffers' fast sample (issue 35) builds TensorDicts as TensorDict builds its own
    # results: ``_new_unsafe`` (no re-validation of what it just gathered), reading the source's
    # ``_tensordict`` / ``_device`` / ``_td_dim_names`` (the public ``items()``/``device``/``names``
    # cost more than the gather they serve); and reads TorchRL's storage contents and generator
    # (``_storage``, ``_rng``: what TorchRL's own samplers and ``_rand_given_ndim`` read).
    ("replaystore.integrations.torchrl.fastpath", "_new_unsafe"),
    ("replaystore.integrations.torchrl.fastpath", "_tensordict"),
    ("replaystore.integrations.torchrl.fastpath", "_device"),
    ("replaystore.integrations.torchrl.fastpath", "_td_dim_names"),
    ("replaystore.integrations.torchrl.fastpath", "_storage"),
    ("replaystore.integrations.torchrl.fastpath", "_rng"),
    # (the same TensorDict internals for the one-call gather's plans and the priority update's
    # read of a sample's "index" and priority entries)
    ("replaystore.integrations.torchrl.rows", "_new_unsafe"),
    ("replaystore.integrations.torchrl.rows", "_tensordict"),
    ("replaystore.integrations.torchrl.rows", "_device"),
    ("replaystore.integrations.torchrl.rows", "_td_dim_names"),
    # (rows._direct writes what ``TensorDict._new_unsafe`` writes, without its per-object
    # ``torch.backends.mps.is_available()``; checked at import to build the same object)
    ("replaystore.integrations.torchrl.rows", "_batch_size"),
    ("replaystore.integrations.torchrl.rows", "_has_mps_val"),
    ("replaystore.integrations.torchrl.prioritized", "_tensordict"),
    # The buffers' fast extend runs TorchRL 0.14's round-robin writer steps in its order with its own
    # helpers (cursor, write count, the storage's last cursor / length / mutation revision,
    # generations, attached entities): the writer's contract lives only in these members.
    ("replaystore.integrations.torchrl.writes", "_tensordict"),
    ("replaystore.integrations.torchrl.writes", "_writer"),
    ("replaystore.integrations.torchrl.writes", "_storage"),
    ("replaystore.integrations.torchrl.writes", "_td_dim_names"),
    ("replaystore.integrations.torchrl.writes", "_device"),
    ("replaystore.integrations.torchrl.writes", "_cursor"),
    ("replaystore.integrations.torchrl.writes", "_write_count"),
    ("replaystore.integrations.torchrl.writes", "_set_last_cursor"),
    ("replaystore.integrations.torchrl.writes", "_get_new_len"),
    ("replaystore.integrations.torchrl.writes", "_bump_mutation_revision"),
    ("replaystore.integrations.torchrl.writes", "_bump_generation"),
    ("replaystore.integrations.torchrl.writes", "_replicate_index"),
    ("replaystore.integrations.torchrl.writes", "_mark_update_entities"),
}
#: ``(importing module, private module)`` pairs allowed despite PRV002, each with its reason.
ALLOWED_IMPORTS = {
    # ``ray._runtime.get`` (``ray.get`` with replaystore's Timeout/Closed and the remote error
    # re-raised) is not exported by ``replaystore.ray`` yet; the demo's learner needs exactly it.
    # Remove once ``replaystore.ray`` exports it (one line in ray/__init__.py).
    ("replaystore.demo.distributed", "replaystore.ray._runtime"),
}
#: Self-like receivers.
SELF_NAMES = {"self", "cls", "mcs"}


@dataclass(frozen=True)
class Violation:
    """One finding."""

    path: Path
    line: int
    col: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"


def is_private(name: str) -> bool:
    """``_name`` but not ``__dunder__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def unit_of(module: str) -> str:
    """The unit a dotted module name belongs to (see the module docstring)."""
    for private, unit in UNIT_OF_PRIVATE_MODULE.items():
        if module == private or module.startswith(private + "."):
            return unit
    parts = module.split(".")
    depth = 3 if len(parts) >= 3 and parts[1] in NAMESPACES else 2
    return ".".join(parts[:depth])


def module_name(path: Path, src: Path) -> str:
    """Dotted name of ``path`` (a file under ``src``, the package directory)."""
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """Absolute module name of ``from <node.module> import ...`` written in ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def defined_private_names(tree: ast.AST) -> set[str]:
    """Every private name this module defines (for itself or its classes' instances)."""
    names: set[str] = set()

    def add_target(t: ast.AST) -> None:
        if isinstance(t, ast.Name):
            names.add(t.id)
        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in SELF_NAMES:
            names.add(t.attr)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                add_target(e)
        elif isinstance(t, ast.Starred):
            add_target(t.value)

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                add_target(t)
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
                for c in ast.walk(node.value):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        names.add(c.value)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            add_target(node.target)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            add_target(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            add_target(node.optional_vars)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if is_private(n)}


def is_self_like(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``."""
    if isinstance(node, ast.Name):
        return node.id in SELF_NAMES
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def check_file(path: Path, src: Path, unit_privates: dict[str, set[str]]) -> Iterator[Violation]:
    """The violations of one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = module_name(path, src)
    is_package = path.name == "__init__.py"
    unit = unit_of(module)
    own = defined_private_names(tree)
    if unit in SHARED_UNITS:
        own |= unit_privates.get(unit, set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            if (
                is_self_like(node.value)
                or node.attr in own
                or node.attr in PUBLIC_UNDERSCORE
                or (module, node.attr) in ALLOWED_ATTRIBUTES
            ):
                continue
            yield Violation(
                path,
                node.lineno,
                node.col_offset,
                "PRV001",
                f"private member {node.attr!r} of {ast.unparse(node.value)!r}, which this module does not define",
            )
        elif isinstance(node, ast.ImportFrom):
            source = resolve_from(module, is_package, node)
            if not (source == PACKAGE or source.startswith(PACKAGE + ".")) or unit_of(source) == unit:
                continue
            if (module, source) in ALLOWED_IMPORTS:
                continue
            if any(is_private(p) for p in source.split(".")):
                yield Violation(
                    path,
                    node.lineno,
                    node.col_offset,
                    "PRV002",
                    f"imports from private module {source!r} of another unit than {unit!r}",
                )
                continue
            for a in node.names:
                if is_private(a.name):
                    yield Violation(
                        path,
                        node.lineno,
                        node.col_offset,
                        "PRV002",
                        f"imports private {a.name!r} from {source!r}, another unit than {unit!r}",
                    )
        elif isinstance(node, ast.Import):
            for a in node.names:
                if (
                    a.name.startswith(PACKAGE + ".")
                    and unit_of(a.name) != unit
                    and any(is_private(p) for p in a.name.split("."))
                ):
                    yield Violation(
                        path,
                        node.lineno,
                        node.col_offset,
                        "PRV002",
                        f"imports private module {a.name!r} of another unit than {unit!r}",
                    )


def check_tree(src: Path) -> list[Violation]:
    """All violations under ``src`` (the ``replaystore`` package directory), sorted."""
    files = sorted(src.rglob("*.py"))
    unit_privates: dict[str, set[str]] = {}
    for f in files:
        unit = unit_of(module_name(f, src))
        if unit in SHARED_UNITS:
            unit_privates.setdefault(unit, set()).update(defined_private_names(ast.parse(f.read_text())))
    out: list[Violation] = []
    for f in files:
        out.extend(check_file(f, src, unit_privates))
    return sorted(out, key=lambda v: (str(v.path), v.line, v.col))


def main(argv: list[str] | None = None) -> int:
    """Print the violations; exit status 1 if any."""
    args = sys.argv[1:] if argv is None else argv
    src = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "src" / PACKAGE
    violations = check_tree(src)
    for v in violations:
        print(v)
    if violations:
        print(
            f"{len(violations)} use(s) of another module's private members "
            "(add a public or documented internal method instead; see docs/architecture.md, 'Layers')"
        )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
