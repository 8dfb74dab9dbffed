"""Errors raised by jaxpace; each class says what went wrong and how to fix it."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConfigMismatchError",
    "JaxpaceError",
    "LaunchError",
    "RecordsError",
    "ScenarioError",
    "StallError",
    "TopologyError",
    "TracedConfigChangeError",
    "UnboundAxisError",
]


class JaxpaceError(Exception):
    """Base class of every error jaxpace raises on purpose.

    Catch this to handle any jaxpace problem; the message always says what was
    expected, what came, and how to fix it.
    """


class ConfigError(JaxpaceError, ValueError):
    """A configuration value is out of range or of the wrong type.

    Cause: a policy or `Pacer` field got a value it cannot use (negative,
    NaN, inf, bool where a number is expected, above the safety cap).
    Fix: pass a value in the range the message names.
    """


class ConfigMismatchError(JaxpaceError, RuntimeError):
    """Processes of one job configured jaxpace differently.

    Cause: `enabled`, `granularity`, `sample_every` or the policy differ between
    processes, so their traced programs would differ and a collective could
    pair the wrong operands. Every process raises this same error.
    Fix: build the `Pacer` from the same settings (and environment) everywhere.
    """


class TracedConfigChangeError(JaxpaceError, RuntimeError):
    """A setting that shapes the traced program was changed after the first trace.

    Cause: jit caches compiled programs, so a flag flipped after the first call
    would be silently ignored on some paths and honoured on others.
    Fix: configure once, before the first traced call, or build a new `Pacer`.
    """


class UnboundAxisError(JaxpaceError, NameError):
    """A collective named an axis that is not bound where it was called.

    Cause: the axis name is misspelled, or the call is outside the
    `shard_map`/`pmap` (or `vmap(axis_name=...)`) that binds it.
    Fix: use one of the bound axis names the message lists, or move the call
    inside the mapped function.
    """


class LaunchError(JaxpaceError, RuntimeError):
    """A local multi-process launch failed: a rank exited non-zero or timed out.

    Cause: the launched program failed on one rank (its traceback is in that
    rank's output), or the job ran past `--timeout`.
    Fix: read the rank's prefixed output above the error; raise `--timeout` if
    the job is slow rather than hung.
    """


class RecordsError(JaxpaceError, ValueError):
    """Timing records could not be read or do not belong together.

    Cause: a truncated or foreign JSONL file, records of different runs mixed in
    one directory, or no records at all.
    Fix: point `jaxpace report` at one run's directory, as written by
    `Pacer.export` / `jaxpace demo`.
    """


class TopologyError(JaxpaceError, ValueError):
    """Topology input (sysfs, `nvidia-smi topo -m` text, JSON) could not be parsed.

    Cause: a malformed or foreign file; the message names the file and line.
    Fix: correct that file, or pass `topology=None` to fall back to JAX's
    device order.
    """


class ScenarioError(JaxpaceError, ValueError):
    """A simulator scenario is unknown or has an invalid field.

    Cause: a preset name that does not exist, or a scenario field out of range.
    Fix: use one of the preset names the message lists, or correct the field
    it names in your scenario file.
    """


class StallError(JaxpaceError, RuntimeError):
    """This process sat inside one measured collective longer than `stall_after_s`.

    Cause: another process never arrived (stuck loader, hung filesystem, swap,
    a skipped collective). Raised in the main thread by the stall watchdog with
    `Pacer(on_stall="raise")`; the message names who is missing.
    Fix: read the message and the `stall-p*.json` records (`jaxpace report`);
    raise `stall_after_s` if the wait was legitimate.
    """
