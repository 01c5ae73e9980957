"""Build the optional compiled hot path (``replaystore._rows``); everything else is in pyproject.toml.

The extension is ``optional``: when no C compiler is available the install still succeeds and
``replaystore.rows`` uses its pure-Python fallback (same behaviour, slower small calls).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("replaystore._rows", ["src/replaystore/_rows.c"], optional=True,
                             extra_compile_args=["-O2"])])
