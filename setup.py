"""Build the optional compiled parts (``replaystore._rows``, ``replaystore.shared._sync``).

Everything else is in pyproject.toml.

Both extensions are ``optional``: when no C compiler is available the install still succeeds,
``replaystore.rows`` uses its pure-Python fallback (same behaviour, slower small calls) and shared
tables lock with ``flock`` instead of a process-shared mutex (slower calls).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("replaystore._rows", ["src/replaystore/_rows.c"], optional=True, extra_compile_args=["-O2"]),
        # shared tables' robust process-shared mutex (POSIX); without it they lock with flock()
        Extension(
            "replaystore.shared._sync",
            ["src/replaystore/shared/_sync.c"],
            optional=True,
            extra_compile_args=["-O2"],
            libraries=["pthread"],
        ),
    ]
)
