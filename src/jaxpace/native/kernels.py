"""Compiled kernels for the simulator's step loop and `adaptive`'s kept-order windows.

`_jaxpace_kernels*.so` is built by `pip install` (setup.py) from `kernels.cc` with a plain C++
compiler (no JAX headers, no Python C API) and loaded with ctypes. Each kernel gives the same
bits as the NumPy code it stands in for, which stays as the fallback: without a compiler, if
the library fails to load, or with `JAXPACE_KERNELS=0`, the callers run NumPy and nothing
changes but speed. `available()` says which, and why.

The NumPy twin of each kernel is named in kernels.cc's header comment. The numbers both
sides rely on (ABI version, the int8 order's largest window, scratch sizes) are `CONSTANTS`
here and `jaxpace_kernels_constant` there; a library whose numbers differ is not used.
`JAXPACE_KERNELS_LIBRARY=/path/to/lib.so` loads another build of kernels.cc (the sanitizer
build of benchmarks/sanitize.sh).
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from jaxpace.native.loader import find_built, load_once

__all__ = [
    "ABI_VERSION",
    "CONSTANTS",
    "ORDER_MAX_WINDOW",
    "available",
    "node_coupled",
    "order_insert",
    "order_pick",
    "paced_delays",
    "run_buckets",
    "window_step",
]

ABI_VERSION = 5
# The int8 order's largest window (`jaxpace.policy._window_order.order_dtype`).
ORDER_MAX_WINDOW = 127
# What kernels.cc's `jaxpace_kernels_constant(name)` must return for each name.
CONSTANTS = {
    "abi_version": ABI_VERSION,
    "order_max_window": ORDER_MAX_WINDOW,
    "insert_scratch_per_rank": 4,  # bytes
    "pick_scratch_per_rank": 2,  # bytes
    "window_step_scratch_per_rank": 4,  # bytes
    "coupled_scratch_per_gpu": 2,  # doubles
}
_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_state: dict = {"lib": None, "reason": None, "path": None}


def _path() -> str | None:
    return os.environ.get("JAXPACE_KERNELS_LIBRARY") or find_built(_HERE, "_jaxpace_kernels")


def constants_mismatch(constant) -> str | None:
    """Why the library's constants (`constant(name) -> value`) differ from `CONSTANTS`, or
    None if they all agree."""
    wrong = []
    for name, want in CONSTANTS.items():
        got = constant(name.encode())
        if got != want:
            wrong.append(f"`{name}` is {got} there, {want} here")
    if not wrong:
        return None
    return (
        f"its constants disagree with this jaxpace's ({'; '.join(wrong)}); rebuild it from "
        "this checkout (python setup.py build_ext --inplace, or reinstall)"
    )


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
            [i64, i64, i64, i64, vp, vp, vp, vp, dbl, dbl, ctypes.c_int, dbl] + [vp] * 11,
        ),
        "jaxpace_order_insert_i8": (None, [i64, i64, i64, i64, vp, vp, vp, vp]),
        "jaxpace_order_pick_i8": (None, [i64, i64, i64, vp, vp, i64, i64, vp, vp, vp]),
        "jaxpace_node_coupled": (None, [i64, i64, vp, vp, dbl, dbl, vp, vp]),
        "jaxpace_paced_delays": (ctypes.c_int, [i64, i64, i64, i64, dbl, dbl, dbl] + [vp] * 6),
        "jaxpace_window_step_i8": (
            ctypes.c_int,
            [i64, i64, i64, i64, vp, vp, vp, vp, i64, i64, ctypes.c_int, dbl, dbl, vp, vp, vp],
        ),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    try:
        constant = lib.jaxpace_kernels_constant
    except AttributeError:
        return  # a build older than the constants: the ABI check that follows says so
    constant.restype, constant.argtypes = i64, [ctypes.c_char_p]
    why = constants_mismatch(constant)
    if why is not None:
        raise OSError(why)  # `load_once` keeps it as the reason the library is not used


def available() -> tuple[bool, str]:
    """`(True, "where it was loaded from")`, or `(False, why not)`."""
    lib = _load()
    if lib is None:
        return False, str(_state["reason"])
    return True, f"compiled kernels ({os.path.basename(_state['path'])})"


def _addr(a: np.ndarray) -> int:
    """`a.ctypes.data`, four times faster where the array's buffer is writable."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def _f64(a: np.ndarray) -> bool:
    return a.dtype == np.float64 and a.flags.c_contiguous


def _fail(fn: str, shapes=(), indices=()) -> None:
    """Raises ValueError naming the first argument of kernel wrapper `fn` whose shape
    (`shapes`: `(name, array, expected shape)`) or index (`indices`: `(name, value, size)`,
    wanted in `[0, size)`) is not what the kernel reads and writes: a wrong one would make
    the C++ read or write past an array. The wrappers test all of them in one expression and
    call this only when one is wrong."""
    for name, a, want in shapes:
        if np.shape(a) != tuple(want):
            raise ValueError(
                f"kernels.{fn}: `{name}` must have shape {tuple(want)}, got {np.shape(a)}; "
                "the other arguments fix that shape (see the function's docstring)."
            )
    for name, value, size in indices:
        if not 0 <= int(value) < size:
            raise ValueError(f"kernels.{fn}: `{name}` must be in [0, {size}), got {value}.")


def _window_ok(fn: str, h: np.ndarray) -> None:
    if h.ndim != 3:
        raise ValueError(f"kernels.{fn}: `h` must be 3-D (sites, window, ranks), got {h.shape}.")
    if h.shape[1] > ORDER_MAX_WINDOW:
        raise ValueError(
            f"kernels.{fn}: the int8 order holds windows up to {ORDER_MAX_WINDOW}, "
            f"got {h.shape[1]}."
        )


def run_buckets(a, D, jit, tc, *, buckets, sites, fwd_frac, bwd_frac, spin, slow):
    """`sim._cluster._run_buckets`' loop: `(step ends (L,), arrive (S, L, R), ends (B, L),
    starts (B, L, R))`, or None when the library is absent or an input is not a C-contiguous
    float64 array. `a` (L, R), `D` (L, sites, R), `jit` (L, buckets, R) or None, `tc` (L,)."""
    lib = _load()
    if lib is None or not (_f64(a) and _f64(D) and _f64(tc) and (jit is None or _f64(jit))):
        return None
    if a.ndim != 2:
        raise ValueError(f"kernels.run_buckets: `a` must be 2-D (steps, ranks), got {a.shape}.")
    (L, R), B, S = a.shape, int(buckets), int(sites)
    if D.shape != (L, S, R) or tc.shape != (L,) or (jit is not None and jit.shape != (L, B, R)):
        _fail("run_buckets", (("D", D, (L, S, R)), ("tc", tc, (L,)), ("jit", jit, (L, B, R))))
    end_prev, arrive = np.empty(L), np.empty((S, L, R))
    ends, starts = np.empty((B, L)), np.empty((B, L, R))
    scratch, rows = np.empty((3, L * R)), np.empty((2, R))
    ptr, again = np.empty(L * R, dtype=np.int64), np.empty(R, dtype=np.uint8)
    lib.jaxpace_run_buckets(
        L, R, B, S, _addr(a), _addr(D), 0 if jit is None else _addr(jit),
        _addr(tc), float(fwd_frac), float(bwd_frac), int(bool(spin)), float(slow),
        _addr(end_prev), _addr(arrive), _addr(ends), _addr(starts),
        _addr(scratch[0]), _addr(scratch[1]), _addr(scratch[2]), _addr(ptr), _addr(rows[0]),
        _addr(rows[1]), _addr(again),
    )  # fmt: skip
    return end_prev, arrive, ends, starts


def node_coupled(a, d0, g, k_pow, k_host):
    """`sim._cluster._node_coupled_compute` of `a` (ranks,) with `d0` (ranks,) the first site's delays, or
    None when nobody sleeps; None when the library is absent or an input is not a C-contiguous
    float64 array (NumPy then)."""
    lib = _load()
    if lib is None or not (_f64(a) and (d0 is None or _f64(d0))):
        return None
    g = int(g)
    if a.ndim != 1 or g < 1 or a.size % g:
        raise ValueError(
            f"kernels.node_coupled: `a` must be 1-D with a multiple of `g`={g} entries, "
            f"got shape {a.shape}."
        )
    if d0 is not None:
        if d0.shape != a.shape:
            _fail("node_coupled", (("d0", d0, a.shape),))
    out, scratch = np.empty(a.shape), np.empty(CONSTANTS["coupled_scratch_per_gpu"] * g)
    lib.jaxpace_node_coupled(
        a.size // int(g), int(g), _addr(a), 0 if d0 is None else _addr(d0),
        float(k_pow), float(k_host), _addr(out), _addr(scratch),
    )  # fmt: skip
    return out


def _kept_ok(h: np.ndarray, o: np.ndarray) -> bool:
    return o.dtype == np.int8 and _f64(h) and o.flags.c_contiguous and h.shape == o.shape


def order_insert(h: np.ndarray, o: np.ndarray, r0: int, x: np.ndarray) -> bool:
    """`policy._window_order.insert`'s order upkeep for every site at row `r0` (int8 order), in place; False when
    the kernel cannot take these arrays (the caller then runs NumPy)."""
    lib = _load()
    if lib is None or not (_kept_ok(h, o) and _f64(x)):
        return False
    _window_ok("order_insert", h)
    S, W, R = h.shape
    if x.shape != (S, R) or not 0 <= r0 < W:
        _fail("order_insert", (("x", x, (S, R)),), (("r0", r0, W),))
    scratch = np.empty(CONSTANTS["insert_scratch_per_rank"] * R, dtype=np.int8)
    lib.jaxpace_order_insert_i8(S, W, R, int(r0), _addr(h), _addr(o), _addr(x), _addr(scratch))
    return True


def order_pick(h: np.ndarray, o: np.ndarray, k0: int, k1: int):
    """`(_at_rank(h, o, k0), _at_rank(h, o, k1))` (`policy._window_order`) in one pass, or None (NumPy then)."""
    lib = _load()
    if lib is None or not _kept_ok(h, o):
        return None
    _window_ok("order_pick", h)
    S, W, R = h.shape
    if not (0 <= k0 < W and 0 <= k1 < W):
        _fail("order_pick", (), (("k0", k0, W), ("k1", k1, W)))
    a, b = np.empty((S, R)), np.empty((S, R))
    scratch = np.empty(CONSTANTS["pick_scratch_per_rank"] * R, dtype=np.uint8)
    lib.jaxpace_order_pick_i8(
        S, W, R, _addr(h), _addr(o), int(k0), int(k1), _addr(a), _addr(b),
        _addr(scratch),
    )  # fmt: skip
    return a, b


def window_step(h, o, odd, r0, x, read):
    """`policy._window_order.insert` at row `r0` of every site, then `_order_quantile`'s
    `read` = `(k0, k1, mode, t, omt)` (`quantile.quantile_read`) off the new order: mode 0
    is rank k0's entry; 1 `a + (b - a) t`; 2 `b - (b - a) omt`; all in one pass. Returns
    `(expected (S, R), spread (S,))`, or None, with nothing changed, when a window would hold
    NaN or -0.0 (per `odd`, and in `x`) or the kernel cannot run (NumPy then)."""
    k0, k1, mode, t, omt = read
    lib = _load()
    if lib is None or not (_kept_ok(h, o) and _f64(x)) or odd.dtype != np.int64:
        return None
    _window_ok("window_step", h)
    S, W, R = h.shape
    if (
        odd.shape != (S, W)
        or x.shape != (S, R)
        or not (0 <= r0 < W and 0 <= k0 < W and 0 <= k1 < W)
    ):
        _fail(
            "window_step",
            (("odd", odd, (S, W)), ("x", x, (S, R))),
            (("r0", r0, W), ("k0", k0, W), ("k1", k1, W)),
        )
    if not odd.flags.c_contiguous:
        return None
    expected, spread = np.empty((S, R)), np.empty(S)
    scratch = np.empty(CONSTANTS["window_step_scratch_per_rank"] * R, dtype=np.int8)
    done = lib.jaxpace_window_step_i8(
        S, W, R, int(r0), _addr(h), _addr(o), _addr(odd), _addr(x), int(k0), int(k1),
        int(mode), float(t), float(omt), _addr(expected), _addr(spread), _addr(scratch),
    )  # fmt: skip
    return (expected, spread) if done else None


def paced_delays(dh, slept, r0, expected, e, *, gain, max_delay_s, unbound):
    """`policy._adaptive_fast._budgeted_delays` for every site where no running sum `slept` exceeds `unbound`, then
    `_record_delays` at row `r0` (`dh` and `slept` updated in place): `(delays (S, R), paced
    (S,) bool)`, or None when the budget may bind or the kernel cannot run (NumPy then)."""
    lib = _load()
    if lib is None or not all(_f64(v) for v in (dh, slept, expected, e)):
        return None
    if dh.ndim != 3:
        raise ValueError(
            f"kernels.paced_delays: `dh` must be 3-D (sites, window, ranks), got {dh.shape}."
        )
    S, W, R = dh.shape
    if slept.shape != (S, R) or expected.shape != (S, R) or e.shape != (S, R) or not 0 <= r0 < W:
        _fail(
            "paced_delays",
            (("slept", slept, (S, R)), ("expected", expected, (S, R)), ("e", e, (S, R))),
            (("r0", r0, W),),
        )
    out, paced = np.empty((S, R)), np.empty(S, dtype=np.bool_)
    done = lib.jaxpace_paced_delays(
        S, W, R, int(r0), float(gain), float(max_delay_s), float(unbound), _addr(expected),
        _addr(e), _addr(dh), _addr(slept), _addr(out), _addr(paced),
    )  # fmt: skip
    return (out, paced) if done else None
