"""Arrays that grow by doubling: the arenas of the search's tables, keys and stages."""

import numpy as np


def grown(a: np.ndarray, n: int, fill) -> np.ndarray:
    """a with at least n rows (doubling), new rows set to fill."""
    if n <= len(a):
        return a
    out = np.full((max(n, 2 * len(a)),) + a.shape[1:], fill, dtype=a.dtype)
    out[:len(a)] = a
    return out
