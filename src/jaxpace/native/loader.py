"""Finding and loading jaxpace's compiled libraries (ctypes), once each.

Shared by the native probes (`jaxpace.native.probes`) and the number kernels
(`jaxpace.native.kernels`), which otherwise do not know each other.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sysconfig

__all__ = ["find_built", "load_once"]


def find_built(directory: str, stem: str) -> str | None:
    """The library `stem` built in `directory` (beside its loader), or None.

    One checkout can hold builds for several Pythons (`stem.cpython-311-...so`,
    `...-312-...so`): this interpreter's comes first (each is built against its own jaxlib).
    """
    own = os.path.join(directory, stem + (sysconfig.get_config_var("EXT_SUFFIX") or ""))
    if os.path.isfile(own):
        return own
    found = sorted(glob.glob(os.path.join(directory, stem + "*.so")))
    return found[0] if found else None


def load_once(state: dict, lock, *, env: str, path, missing: str, declare, abi_fn: str,
              abi: int, what: str):  # fmt: skip
    """Loads a ctypes library once into `state` (`lib`, `path`, or the `reason` it did not).

    `env=0` switches it off; `path()` finds it (None: `missing` is the reason); `declare(lib)`
    sets its signatures; `abi_fn()` must return `abi`. Returns the library or None.
    """
    with lock:
        if state["lib"] is not None or state["reason"] is not None:
            return state["lib"]
        if os.environ.get(env, "1").strip().lower() in ("0", "false", "no", "off"):
            state["reason"] = f"disabled by {env}=0"
            return None
        found = path()
        if found is None:
            state["reason"] = missing
            return None
        try:
            lib = ctypes.CDLL(found)
            declare(lib)
            got = getattr(lib, abi_fn)()
        except (OSError, AttributeError) as e:
            state["reason"] = f"{what} {found} failed to load: {e}"
            return None
        if got != abi:
            state["reason"] = (
                f"{what} {found} has ABI {got}, this jaxpace expects {abi}; "
                "rebuild it (pip install -e . or reinstall)"
            )
            return None
        state["lib"], state["path"] = lib, found
        return lib
