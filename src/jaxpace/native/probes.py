"""Native probes: the compiled library (XLA FFI handlers + a C API) and its ctypes bindings.

The library `_jaxpace_probe*.so` is built by `pip install` (setup.py) from `probe.cc` with the
FFI headers of the installed jaxlib. When it is missing (no compiler at install time), fails to
load, or is disabled with `JAXPACE_NATIVE=0`, `available()` says so and why, and jaxpace uses
its `io_callback` probes instead.

Everything here runs off the hot path: registering sites, setting delays, draining records.
The hot path is the FFI handlers themselves (see `primitive.py`).
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
import sysconfig
import threading

import numpy as np

from jaxpace.native import loader as _loader
from jaxpace.native.loader import load_once

__all__ = [
    "ABI_VERSION",
    "MAX_SITES",
    "allocate_site_id",
    "NATIVE_RECORD_DTYPE",
    "PROGRESS_FIELDS",
    "RANK_FROM_DEVICE",
    "available",
    "counters",
    "cuda_available",
    "cudart_candidates",
    "drain",
    "find_built",
    "in_collective",
    "library_path",
    "now_ns",
    "load_once",
    "pending",
    "rearm",
    "register_site",
    "release_all",
    "release_site",
    "released",
    "set_delay",
    "set_max_delay",
    "set_site_max_delay",
    "set_site_wake",
    "set_site_devices",
    "site_progress",
    "wait_records",
]

ABI_VERSION = 7
MAX_SITES = 4096
# A probe's rank operand meaning "look it up in the site's table of ranks per local device
# ordinal" (`set_site_devices`): a program then computes no ranks. Must match kRankFromDevice
# in probe.cc.
RANK_FROM_DEVICE = -2
_HERE = os.path.dirname(os.path.abspath(__file__))

# Must match `RecordOut` in probe.cc (56 bytes). `run_id`: XLA's RunId of the program
# execution the record's arrive ran in (the same for every probe of one execution).
NATIVE_RECORD_DTYPE = np.dtype(
    [
        ("step", np.int64),
        ("arrive_ns", np.int64),
        ("done_ns", np.int64),
        ("delay_ns", np.int64),
        ("wait_ns", np.int64),
        ("rank", np.int32),
        ("flags", np.int32),
        ("run_id", np.int64),
    ]
)
assert NATIVE_RECORD_DTYPE.itemsize == 56

_lock = threading.Lock()
_state: dict = {"lib": None, "reason": None, "path": None, "cuda": None}


def library_path() -> str | None:
    """Path of the compiled library: `JAXPACE_NATIVE_LIB`, else the one built next to this file."""
    env = os.environ.get("JAXPACE_NATIVE_LIB")
    if env:
        return env
    return find_built("_jaxpace_probe")


def find_built(stem: str) -> str | None:
    """The library `stem` built next to this file, or None (see `jaxpace.native.loader.find_built`)."""
    return _loader.find_built(_HERE, stem)


def _load():
    """Loads the library once; returns it or None (the reason is kept for `available`)."""
    return load_once(
        _state,
        _lock,
        env="JAXPACE_NATIVE",
        path=library_path,
        missing="native library not built (no C++ compiler at install time?); reinstall with "
        "a C++17 compiler: pip install --force-reinstall --no-deps jaxpace",
        declare=_declare,
        abi_fn="jaxpace_abi_version",
        abi=ABI_VERSION,
        what="native library",
    )


def _declare(lib) -> None:
    i64, i32, u64 = ctypes.c_int64, ctypes.c_int32, ctypes.c_uint64
    vp = ctypes.c_void_p
    sigs = {
        "jaxpace_abi_version": (ctypes.c_int, []),
        "jaxpace_now_ns": (i64, []),
        "jaxpace_register_site": (ctypes.c_int, [i64, i32, i64, i32, i64, i32]),
        "jaxpace_set_delay_ns": (ctypes.c_int, [i64, i32, i64]),
        "jaxpace_set_site_devices": (ctypes.c_int, [i64, vp, i32, i32]),
        "jaxpace_set_max_delay_ns": (None, [i64]),
        "jaxpace_set_site_max_delay_ns": (ctypes.c_int, [i64, i64]),
        "jaxpace_release_all": (None, []),
        "jaxpace_rearm": (None, []),
        "jaxpace_release_site": (ctypes.c_int, [i64]),
        "jaxpace_released": (ctypes.c_int, []),
        "jaxpace_drain": (i64, [i64, i64, vp, vp]),
        "jaxpace_site_counters": (ctypes.c_int, [i64, vp]),
        "jaxpace_site_pending": (i64, [i64]),
        "jaxpace_set_site_wake": (ctypes.c_int, [i64, i32]),
        "jaxpace_site_progress": (i64, [i64, vp, i64]),
        "jaxpace_wait_records": (u64, [u64, i64]),
        "jaxpace_cuda_load": (ctypes.c_int, [ctypes.c_char_p]),
        "jaxpace_cuda_error": (ctypes.c_char_p, []),
        "jaxpace_test_arrive_cuda": (ctypes.c_int, [vp, i32, i64, vp, vp, i64]),
        "jaxpace_test_done_cuda": (ctypes.c_int, [vp, i32, i64, vp, i64, vp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def _lib():
    lib = _state["lib"]  # loaded once: no lock on the drain thread's per-record calls
    if lib is not None:
        return lib
    lib = _load()
    if lib is None:
        raise RuntimeError(f"jaxpace native probes unavailable: {_state['reason']}")
    return lib


def available() -> tuple[bool, str]:
    """`(True, "where it was loaded from")`, or `(False, why not)`. Also registers FFI targets."""
    lib = _load()
    if lib is None:
        return False, str(_state["reason"])
    from jaxpace.native import primitive

    ok, why = primitive.register_targets(lib, cuda_available)
    if not ok:
        return False, why
    return True, f"native XLA FFI probes ({os.path.basename(_state['path'])})"


def cudart_candidates() -> list[str]:
    """Where the CUDA runtime for the GPU handlers is looked for, in order ("" last: the
    loader's own names `libcudart.so.13`, `.so.12`, `libcudart.so` on the search path).

    `JAXPACE_CUDART` (a path) alone when set. Otherwise a libcudart this process already has
    mapped (the one XLA's CUDA plugin uses), then the NVIDIA wheels in site-packages: CUDA 13's
    (`nvidia/cu13/lib`) and CUDA 12's (`nvidia/cuda_runtime/lib`), the major of the installed
    `jax-cuda*-plugin` first.
    """
    env = os.environ.get("JAXPACE_CUDART", "").strip()
    if env:
        return [env]
    paths = _mapped_cudart()
    wheel = {13: ("nvidia", "cu13", "lib"), 12: ("nvidia", "cuda_runtime", "lib")}
    for major in _plugin_majors():
        for root in _site_dirs():
            paths += sorted(glob.glob(os.path.join(root, *wheel[major], "libcudart.so*")))
    seen: set[str] = set()
    return [p for p in [*paths, ""] if not (p in seen or seen.add(p))]


def _mapped_cudart() -> list[str]:
    """The libcudart files mapped into this process (Linux), e.g. by jaxlib's CUDA plugin."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            names = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return []
    return sorted(n for n in names if os.path.isfile(n))


def _plugin_majors() -> list[int]:
    """CUDA majors to try, that of the installed jax CUDA plugin first (13 when unknown)."""
    from importlib import metadata

    for major in (13, 12):
        try:
            metadata.version(f"jax-cuda{major}-plugin")
        except metadata.PackageNotFoundError:
            continue
        return [major, 25 - major]
    return [13, 12]


def _site_dirs() -> list[str]:
    import site

    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # some virtualenvs' site module
        pass
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def cuda_available() -> tuple[bool, str]:
    """Loads the CUDA runtime for the GPU handlers (dlopen, from `cudart_candidates()`).
    `(False, why)` when there is none."""
    lib = _lib()
    with _lock:
        if _state["cuda"] is not None:
            return _state["cuda"]
        res = (False, "no CUDA runtime")
        for p in cudart_candidates():
            if lib.jaxpace_cuda_load(p.encode() if p else None) == 1:
                res = (True, f"CUDA runtime {p or 'libcudart (system)'}")
                break
            res = (False, lib.jaxpace_cuda_error().decode(errors="replace"))
        _state["cuda"] = res
        return res


# ---------------------------------------------------------------------- C API wrappers


def now_ns() -> int:
    """The handlers' clock (steady_clock), in ns."""
    return int(_lib().jaxpace_now_ns())


_next_site_id = [0]


def allocate_site_id() -> int:
    """A native site id no one else in this process uses (ids are never reused).

    Raises:
      RuntimeError: all MAX_SITES ids are taken.
    """
    with _lock:
        if _next_site_id[0] >= MAX_SITES:
            raise RuntimeError(f"native site table full ({MAX_SITES} sites in this process)")
        sid = _next_site_id[0]
        _next_site_id[0] += 1
        return sid


def register_site(
    site_id: int,
    num_slots: int,
    *,
    capacity: int = 4096,
    fixed_rank: int = -1,
    sample_every: int = 1,
    payload_len: int = 0,
) -> None:
    """Creates (or replaces) native site `site_id` before a program using it runs.

    Args:
      site_id: 0 <= id < MAX_SITES, the `site` attribute the primitives carry.
      num_slots: ranks of the site (payload slots).
      capacity: records kept before the oldest undrained ones are dropped (power of two).
      fixed_rank: >= 0 makes every active shard this rank (one measuring shard per process:
        the process index); -1 takes the rank operand.
      sample_every: only every k-th arrival per rank is timed and recorded.
      payload_len: floats of the reduced exchange payload kept per record (0: none).
    """
    rc = _lib().jaxpace_register_site(
        int(site_id),
        int(num_slots),
        int(capacity),
        int(fixed_rank),
        int(sample_every),
        int(payload_len),
    )
    if rc != 0:
        raise ValueError(
            f"register_site: bad arguments site_id={site_id} (0..{MAX_SITES - 1}), "
            f"num_slots={num_slots} (>= 1), capacity={capacity} (1..2**24), "
            f"fixed_rank={fixed_rank} (-1 or < num_slots), sample_every={sample_every} (>= 1), "
            f"payload_len={payload_len} (>= 0)"
        )


def set_site_devices(site_id: int, rank_of_ordinal, *, cuda: bool = True) -> None:
    """The rank measured on each local device ordinal (-1: not measured there).

    With `cuda` and a CUDA runtime loaded this also makes, per measured device, the events
    and pinned memory its handlers use (never made inside a handler). `cuda=False`: the
    table only, for the CPU handlers (`RANK_FROM_DEVICE`).

    Raises:
      RuntimeError: a CUDA call failed (the caller falls back to the io_callback probes).
    """
    arr = np.ascontiguousarray(np.asarray(rank_of_ordinal, dtype=np.int32).reshape(-1))
    lib = _lib()
    rc = lib.jaxpace_set_site_devices(int(site_id), arr.ctypes.data, int(arr.size), int(cuda))
    if rc == -2:
        why = lib.jaxpace_cuda_error().decode(errors="replace")
        raise RuntimeError(f"set_site_devices: setting up the CUDA events failed ({why})")
    if rc != 0:
        raise ValueError(f"set_site_devices: unknown site {site_id} or too many devices")


def set_delay(site_id: int, rank: int, delay_s: float) -> None:
    """The delay the next arrival of (site, rank) sleeps (clamped to `set_max_delay`)."""
    ns = int(delay_s * 1e9) if math.isfinite(delay_s) and delay_s > 0 else 0
    if _lib().jaxpace_set_delay_ns(int(site_id), int(rank), ns) != 0:
        raise ValueError(f"set_delay: unknown site {site_id} or rank {rank} out of range")


def set_max_delay(max_delay_s: float) -> None:
    """Upper bound of every native delay (0 disables delays)."""
    ns = int(max_delay_s * 1e9) if np.isfinite(max_delay_s) and max_delay_s > 0 else 0
    _lib().jaxpace_set_max_delay_ns(ns)


def set_site_max_delay(site_id: int, max_delay_s: float) -> None:
    """Upper bound of the native delays of one site (overrides `set_max_delay` there)."""
    ns = int(max_delay_s * 1e9) if np.isfinite(max_delay_s) and max_delay_s > 0 else 0
    if _lib().jaxpace_set_site_max_delay_ns(int(site_id), ns) != 0:
        raise ValueError(f"set_site_max_delay: unknown native site {site_id}")


def release_all() -> None:
    """Ends every native sleep now and makes later ones return at once (SIGTERM, shutdown)."""
    lib = _load()
    if lib is not None:
        lib.jaxpace_release_all()


def release_site(site_id: int) -> None:
    """Ends the native sleeps of one site now, and its later ones (its pacer closed)."""
    lib = _load()
    if lib is not None:
        lib.jaxpace_release_site(int(site_id))


def rearm() -> None:
    """Undoes `release_all` (a new run in the same process)."""
    _lib().jaxpace_rearm()


def released() -> bool:
    return bool(_lib().jaxpace_released())


def drain(site_id: int, payload_len: int = 0, max_n: int = 4096, *, out=None):
    """Finished records of a site, oldest first, and their reduced payloads.

    Args:
      out: optional `(records, payloads)` buffers to fill (reused by the drain thread);
        `max_n` is then their length.

    Returns:
      `(records, payloads)`: a NATIVE_RECORD_DTYPE array and a float32 `(len, payload_len)`
      array (zero columns when the site keeps no payload); views of `out` when given.
    """
    if out is None:
        recs = np.zeros(max_n, NATIVE_RECORD_DTYPE)
        pays = np.zeros((max_n, max(payload_len, 0)), np.float32)
    else:
        recs, pays = out
        max_n = len(recs)
    n = _lib().jaxpace_drain(
        int(site_id), int(max_n), recs.ctypes.data, pays.ctypes.data if payload_len > 0 else None
    )
    if n < 0:
        raise ValueError(f"drain: unknown native site {site_id}")
    return recs[:n], pays[:n]


def set_site_wake(site_id: int, on: bool) -> None:
    """Whether the site's records wake the drain thread (its policy may delay now) or wait for
    the thread's timer."""
    if _lib().jaxpace_set_site_wake(int(site_id), int(bool(on))) != 0:
        raise ValueError(f"set_site_wake: unknown native site {site_id}")


def pending(site_id: int) -> int:
    """Records a drain of the site would find now, plus its GPU steps not yet read."""
    n = int(_lib().jaxpace_site_pending(int(site_id)))
    if n < 0:
        raise ValueError(f"pending: unknown native site {site_id}")
    return n


def counters(site_id: int) -> dict:
    """Records pushed, dropped (overwritten before drained, or a GPU step with the drain
    `kGpuDepth` behind), unsampled and overlapping arrivals, the ring's capacity; GPU: CUDA
    calls that failed, measured steps left unrecorded by one, and whether the site's CUDA
    handlers were disabled after repeated failures (1)."""
    out = np.zeros(8, np.int64)
    if _lib().jaxpace_site_counters(int(site_id), out.ctypes.data) != 0:
        raise ValueError(f"counters: unknown native site {site_id}")
    keys = ("pushed", "dropped", "unsampled", "overlaps", "capacity", "cuda_errors",
            "gpu_invalid", "gpu_disabled")  # fmt: skip
    return {k: int(v) for k, v in zip(keys, out, strict=True)}


PROGRESS_FIELDS = ("arrived_step", "arrived_ns", "done_step", "arrivals")


def in_collective(site_id: int, num_slots: int) -> bool:
    """Whether a rank of the site has arrived at a measured step it has not finished (its done
    record is not written yet). False for an unknown site."""
    try:
        prog = site_progress(site_id, num_slots)
    except ValueError:  # an unknown (closed) site has nothing in flight
        return False
    return bool((prog[:, 0] > prog[:, 2]).any())


def site_progress(site_id: int, num_slots: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """Each rank's progress at a native site, for the stall watchdog (lock-free, no drain).

    Returns an int64 array of shape `(ranks, 4)`, columns `PROGRESS_FIELDS`: the last measured
    step the rank arrived at (-1: none), when (`now_ns()` clock, taken after the pacing sleep),
    the last measured step it finished (-1: none), and its arrivals counted. A rank with
    `arrived_step > done_step` is inside the collective. `out` (shape `(num_slots, 4)`, int64,
    C-contiguous) is reused when given.
    """
    if out is None:
        out = np.zeros((max(int(num_slots), 0), 4), np.int64)
    elif out.dtype != np.int64 or out.ndim != 2 or out.shape[1] != 4 or not out.flags.c_contiguous:
        raise ValueError(
            f"site_progress: `out` must be a C-contiguous int64 array of shape (ranks, 4), got "
            f"{out.dtype} {out.shape}; pass None to allocate one"
        )
    n = _lib().jaxpace_site_progress(int(site_id), out.ctypes.data, int(out.shape[0]))
    if n < 0:
        raise ValueError(f"site_progress: unknown native site {site_id}")
    return out[:n]


def wait_records(seen: int, timeout_s: float) -> int:
    """Blocks (without the GIL) until records beyond `seen` exist, or timeout/release."""
    return int(_lib().jaxpace_wait_records(int(seen), int(max(timeout_s, 0.0) * 1e9)))
