"""numba's njit with its machine code cached, for the search's compiled loops (costmodel/fold.py,
planner/bounds.py, planner/dominance.py, planner/labelbounds.py, planner/labelfold.py). Those modules are imported
only when a search or a fold runs, so numba's import (about half a second) is not paid by
commands that never search.

The first compile takes a few seconds; the code is cached in the __pycache__ beside the module
(numba's in-tree cache) or, where that is read-only, in the user's cache directory
(~/.cache/numba, or NUMBA_CACHE_DIR). With no writable place at all it warns once and compiles
again in every process."""

import warnings

from numba import njit


def compiled(fn=None, *, inline: bool = False):
    """njit with its code cached. inline: a small helper of a hot loop, inlined into each caller
    (numba's inline="always") so that the caller's loop is compiled as one."""
    if fn is None:
        return lambda f: compiled(f, inline=inline)
    opts = {"inline": "always"} if inline else {}
    try:
        return njit(cache=True, **opts)(fn)
    except RuntimeError as e:                 # numba: "cannot cache function ...: no locator available"
        warnings.warn(f"osdp_sim: the search's compiled loops cannot be cached ({e}); they are compiled "
                      "again in every process (set NUMBA_CACHE_DIR to a writable directory)")
        return njit(**opts)(fn)
