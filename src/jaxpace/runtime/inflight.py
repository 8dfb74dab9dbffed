"""Steps still in flight when the user reads results: wait for them (bounded) and count the rest.

JAX dispatches steps asynchronously, so right after a training loop most steps
may not have run yet; `Pacer.stats()` / `records()` / `export()` first wait
(bounded) for this process's dispatched work, then drain the probes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxpace.runtime.interface import PacerState

__all__ = ["DEFAULT_TIMEOUT_S", "settle"]

DEFAULT_TIMEOUT_S = 10.0

log = logging.getLogger("jaxpace")


def _wait_live_arrays(timeout_s: float) -> None:
    """Waits until every live array is ready or `timeout_s` passed, on the calling thread, by
    polling `is_ready()`: never a wait that could outlast the bound, and no helper thread (none
    left blocked on a step that never ends, and none needed at interpreter exit, where Python
    3.12 starts no new thread)."""
    import jax

    deadline = time.monotonic() + timeout_s
    pending = list(jax.live_arrays())
    while pending and time.monotonic() < deadline:
        left = []
        for a in pending:
            try:
                if not a.is_ready():
                    left.append(a)
            except Exception:  # noqa: BLE001 - deleted/donated meanwhile: nothing to wait for
                pass
        pending = left
        if pending:
            time.sleep(0.001)


# A step's outputs can be ready before its native done probes have run (XLA:CPU: 2 and 4 of
# 40 fresh programs in two runs here, each record there 50 ms later), so a read right after
# the last step would miss that step's record. How long `settle` waits for them, at most.
CLOSE_WAIT_S = 0.5


def _wait_native_closed(pacer: PacerState, timeout_s: float) -> None:
    """Waits (polling, at most `timeout_s`) until no rank of a native site is inside a measured
    collective: every measured arrival has its done record."""
    from jaxpace.native import probes as _native

    sites = [s for s in list(pacer.sites.values()) if s.native is not None]
    deadline = time.monotonic() + timeout_s
    while any(_native.in_collective(s.native[0], s.num_slots) for s in sites):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.0005)


def settle(pacer: PacerState, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, int]:
    """Waits up to `timeout_s` for dispatched steps, drains every site: `{site: steps in flight}`.

    Waits on this process's live arrays (the outputs of every dispatched step the
    program still holds), polling, so a peer that never arrives costs at most
    `timeout_s`. Never call it from a JAX callback. The count returned is
    the measured collectives that arrived but have not finished (io_callback
    probes); a step whose output was dropped and that has not started yet
    cannot be seen.
    """
    if pacer.sites and timeout_s > 0:
        deadline = time.monotonic() + timeout_s
        _wait_live_arrays(timeout_s)
        _wait_native_closed(pacer, min(max(deadline - time.monotonic(), 0.0), CLOSE_WAIT_S))
    in_flight: dict[str, int] = {}
    for name, site in list(pacer.sites.items()):
        site.flush()
        for st in list(site.ranks.values()):
            with st.lock:
                if st.open_step is not None:
                    in_flight[name] = in_flight.get(name, 0) + 1
    if in_flight:
        log.warning(
            "jaxpace: %d measured step(s) still in flight after waiting %.1f s; stats and "
            "records cover finished steps only. Call jax.block_until_ready on the last "
            "step's outputs first, or pass a longer timeout_s.",
            sum(in_flight.values()),
            timeout_s,
        )
    return in_flight
