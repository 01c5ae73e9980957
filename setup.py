"""Build the optional compiled parts (``replaystore._rows``, ``replaystore._ring``, ``replaystore.shared._sync``).

Everything else is in pyproject.toml.

Both extensions are ``optional``: when no C compiler is available the install still succeeds,
``replaystore.rows`` uses its pure-Python fallback (same behaviour, slower small calls) and shared
tables lock with ``flock`` instead of a process-shared mutex (slower calls). ``_ring`` (a ring-mode
Table's whole ``add`` / small ``extend`` in one call) needs NumPy's headers at build time (a build
requirement in pyproject.toml); without them it is skipped and ``Table.add`` / ``extend`` stay the
Python methods.
"""

from setuptools import Extension, setup

try:
    import numpy

    _ring = [
        Extension(
            "replaystore._ring",
            ["src/replaystore/_ring.c"],
            optional=True,
            extra_compile_args=["-O2"],
            include_dirs=[numpy.get_include()],
        ),
        # a Tianshou buffer's add (replaystore.compat.tianshou); without it the Python reference path
        Extension(
            "replaystore.compat.tianshou._native",
            ["src/replaystore/compat/tianshou/_native.c"],
            optional=True,
            extra_compile_args=["-O2"],
            include_dirs=[numpy.get_include()],
        ),
    ]
    # (with NumPy's headers, shared tables' small ring-mode inserts are one compiled call: RingInserter)
    _sync_numpy = {"include_dirs": [numpy.get_include()], "define_macros": [("RS_WITH_NUMPY", "1")]}
except ImportError:  # no NumPy in the build environment: Table.add / extend stay Python
    _ring = []
    _sync_numpy = {}

setup(
    ext_modules=[
        Extension("replaystore._rows", ["src/replaystore/_rows.c"], optional=True, extra_compile_args=["-O2"]),
        # the row copies of the TorchRL buffers' fast paths (integrations/torchrl/fastpath.py)
        Extension(
            "replaystore.integrations.torchrl._native",
            ["src/replaystore/integrations/torchrl/_native.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        *_ring,
        # shared tables' robust process-shared mutex (POSIX); without it they lock with flock()
        Extension(
            "replaystore.shared._sync",
            ["src/replaystore/shared/_sync.c"],
            optional=True,
            extra_compile_args=["-O2"],
            libraries=["pthread"],
            **_sync_numpy,
        ),
    ]
)
