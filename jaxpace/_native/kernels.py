"""Compiled kernels for the simulator's step loop and `adaptive`'s kept-order windows.

`_jaxpace_kernels*.so` is built by `pip install` (setup.py) from `kernels.cc` with a plain C++
compiler (no JAX headers, no Python C API) and loaded with ctypes. Each kernel gives the same
bits as the NumPy code it stands in for, which stays as the fallback: without a compiler, if
the library fails to load, or with `JAXPACE_KERNELS=0`, the callers run NumPy and nothing
changes but speed. `available()` says which, and why.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from jaxpace._native import find_built, load_once

__all__ = ["ABI_VERSION", "available", "order_insert", "order_pick", "run_buckets"]

ABI_VERSION = 2
_lock = threading.Lock()
_state: dict = {"lib": None, "reason": None, "path": None}


def _path() -> str | None:
    return find_built("_jaxpace_kernels")


def _load():
    return load_once(
        _state,
        _lock,
        env="JAXPACE_KERNELS",
        path=lambda: _path(),  # late-bound: tests replace `_path`
        missing="kernel library not built (no C++ compiler at install time?)",
        declare=_declare,
        abi_fn="jaxpace_kernels_abi_version",
        abi=ABI_VERSION,
        what="kernel library",
    )


def _declare(lib) -> None:
    i64, dbl, vp = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
    sigs = {
        "jaxpace_kernels_abi_version": (ctypes.c_int, []),
        "jaxpace_run_buckets": (
            None,
            [i64, i64, i64, i64, vp, vp, vp, vp, dbl, dbl, ctypes.c_int, dbl] + [vp] * 8,
        ),
        "jaxpace_order_insert_i8": (None, [i64, i64, i64, i64, vp, vp, vp, vp]),
        "jaxpace_order_pick_i8": (None, [i64, i64, i64, vp, vp, i64, i64, vp, vp, vp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def available() -> tuple[bool, str]:
    """`(True, "where it was loaded from")`, or `(False, why not)`."""
    lib = _load()
    if lib is None:
        return False, str(_state["reason"])
    return True, f"compiled kernels ({os.path.basename(_state['path'])})"


def _f64(a: np.ndarray) -> bool:
    return a.dtype == np.float64 and a.flags.c_contiguous


def run_buckets(a, D, jit, tc, *, buckets, sites, fwd_frac, bwd_frac, spin, slow):
    """`_run_buckets`' loop: `(step ends (L,), arrive (S, L, R), ends (B, L), starts (B, L, R))`,
    or None when the library is absent or an input is not a C-contiguous float64 array."""
    lib = _load()
    if lib is None or not (_f64(a) and _f64(D) and _f64(tc) and (jit is None or _f64(jit))):
        return None
    (L, R), B, S = a.shape, int(buckets), int(sites)
    end_prev, arrive = np.empty(L), np.empty((S, L, R))
    ends, starts = np.empty((B, L)), np.empty((B, L, R))
    scratch = np.empty((3, L * R))
    ptr = np.empty(L * R, dtype=np.int64)
    lib.jaxpace_run_buckets(
        L, R, B, S, a.ctypes.data, D.ctypes.data, 0 if jit is None else jit.ctypes.data,
        tc.ctypes.data, float(fwd_frac), float(bwd_frac), int(bool(spin)), float(slow),
        end_prev.ctypes.data, arrive.ctypes.data, ends.ctypes.data, starts.ctypes.data,
        scratch[0].ctypes.data, scratch[1].ctypes.data, scratch[2].ctypes.data, ptr.ctypes.data,
    )  # fmt: skip
    return end_prev, arrive, ends, starts


def _kept_ok(h: np.ndarray, o: np.ndarray) -> bool:
    return o.dtype == np.int8 and _f64(h) and o.flags.c_contiguous and h.shape == o.shape


def order_insert(h: np.ndarray, o: np.ndarray, r0: int, x: np.ndarray) -> bool:
    """`_insert`'s order upkeep for every site at row `r0` (int8 order), in place; False when
    the kernel cannot take these arrays (the caller then runs NumPy)."""
    lib = _load()
    if lib is None or not (_kept_ok(h, o) and _f64(x)):
        return False
    S, W, R = h.shape
    scratch = np.empty(4 * R, dtype=np.int8)
    lib.jaxpace_order_insert_i8(
        S, W, R, int(r0), h.ctypes.data, o.ctypes.data, x.ctypes.data, scratch.ctypes.data
    )
    return True


def order_pick(h: np.ndarray, o: np.ndarray, k0: int, k1: int):
    """`(_at_rank(h, o, k0), _at_rank(h, o, k1))` in one pass, or None (NumPy then)."""
    lib = _load()
    if lib is None or not _kept_ok(h, o):
        return None
    S, W, R = h.shape
    a, b = np.empty((S, R)), np.empty((S, R))
    scratch = np.empty(2 * R, dtype=np.uint8)
    lib.jaxpace_order_pick_i8(
        S, W, R, h.ctypes.data, o.ctypes.data, int(k0), int(k1), a.ctypes.data, b.ctypes.data,
        scratch.ctypes.data,
    )  # fmt: skip
    return a, b
