"""Large NumPy arrays from pyarrow's memory pool (`empty`), for the report's pass over the sites
of a fleet-sized run.

A site of a fleet-sized run is tens of megabytes a column (8M rows at 8192 ranks x 1000
steps: 65 MB), and the pass over the sites makes a dozen such arrays for each of them.
NumPy takes each one fresh from the system, which fills it page by page as it is first
written and takes it back when it is freed, so every site pays again for its memory: at
262M rows about a third of the report's CPU was the kernel's. pyarrow's pool (mimalloc or
jemalloc, whichever pyarrow uses) keeps what a site before let go and hands it out again.

An array from `empty` is an ordinary NumPy array (writable, freed when the last
reference goes). Arrays under `MIN_ELEMENTS` are NumPy's own, so a small run never
imports pyarrow for this.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

__all__ = ["MIN_ELEMENTS", "empty", "release"]

# Below this many elements an array is NumPy's own (the system's small allocations are
# reused already).
MIN_ELEMENTS = 1 << 20


def empty(shape: int | tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    """`np.empty(shape, dtype)`, from pyarrow's memory pool when it is large."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = math.prod(shape)
    dtype = np.dtype(dtype)
    if n < MIN_ELEMENTS:
        return np.empty(shape, dtype)
    import pyarrow as pa

    return np.frombuffer(pa.allocate_buffer(n * dtype.itemsize), dtype).reshape(shape)


def release() -> None:
    """Hands back to the system what pyarrow's pool holds unused (the arrays of a pass over
    the sites, once it has ended), so the stages after the pass do not stand on it. Nothing
    when pyarrow was never imported."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()
