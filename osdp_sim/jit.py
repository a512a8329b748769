"""numba's njit with its machine code cached, for the search's compiled loops (costmodel/fold.py,
planner/bounds.py, planner/dominance.py, planner/labelbounds.py, planner/labelfold.py). Those modules are imported
only when a search or a fold runs, so numba's import (about half a second) is not paid by
commands that never search.

The first compile takes a few seconds; the code is cached in the __pycache__ beside the module
(numba's in-tree cache) or, where that is read-only, in the user's cache directory
(~/.cache/numba, or NUMBA_CACHE_DIR). With no writable place at all it warns once and compiles
again in every process. On a fresh machine the first search also compiles part of them in a
second process meanwhile (jitwarm.py).

Keep each loop at one compiled signature: every argument type (an array's layout, a literal
constant passed to a helper that is not inlined) compiles the whole function again, and so does
code whose failure message numba must format (a slice assignment's shape check); jitwarm.py's
table and its test list them."""

import warnings

from numba import njit

REGISTRY: dict = {}
"""'module.name' -> the dispatcher of every compiled loop that is not inlined (jitwarm.py)."""


def compiled(fn=None, *, inline: bool = False):
    """njit with its code cached. inline: a small helper of a hot loop, inlined into each caller
    (numba's inline="always") so that the caller's loop is compiled as one."""
    if fn is None:
        return lambda f: compiled(f, inline=inline)
    opts = {"inline": "always"} if inline else {}
    try:
        disp = njit(cache=True, **opts)(fn)
    except RuntimeError as e:                 # numba: "cannot cache function ...: no locator available"
        warnings.warn(f"osdp_sim: the search's compiled loops cannot be cached ({e}); they are compiled "
                      "again in every process (set NUMBA_CACHE_DIR to a writable directory)")
        disp = njit(**opts)(fn)
    if not inline:
        REGISTRY[f"{fn.__module__}.{fn.__name__}"] = disp
    return disp
