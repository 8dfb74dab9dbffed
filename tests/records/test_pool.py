"""`records.pool`: large arrays from pyarrow's memory pool are ordinary NumPy arrays (their own
memory, writable, the shape and type asked), small ones NumPy's own; `release` hands the
pool's unused memory back."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pyarrow as pa

from jaxpace.records import pool


def test_a_large_array_is_its_own_writable_memory_from_the_pool():
    before = pa.default_memory_pool().bytes_allocated()
    a = pool.empty((pool.MIN_ELEMENTS // 4, 8), np.int64)
    b = pool.empty(pool.MIN_ELEMENTS * 2, bool)
    assert a.shape == (pool.MIN_ELEMENTS // 4, 8) and a.dtype == np.int64
    assert b.shape == (pool.MIN_ELEMENTS * 2,) and b.dtype == bool
    assert a.flags.writeable and a.flags.c_contiguous
    assert pa.default_memory_pool().bytes_allocated() >= before + a.nbytes + b.nbytes
    a[:] = 7
    b[:] = True
    assert not np.shares_memory(a, b)
    assert int(a.sum()) == 7 * a.size and b.all()
    del a, b
    gc.collect()
    assert pa.default_memory_pool().bytes_allocated() == before  # (freed with the arrays)
    pool.release()


def test_a_small_array_is_numpys_own():
    a = pool.empty(10, np.float64)
    assert a.base is None and a.shape == (10,)


def test_release_without_pyarrow_imported_does_nothing():
    code = (
        "import sys; from jaxpace.records import pool; pool.empty(5); pool.release(); "
        "print('pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
