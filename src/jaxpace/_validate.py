"""The one validator of user-given settings: numbers in a range, booleans, choices."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from jaxpace.errors import ConfigError

__all__ = [
    "check_bool",
    "check_callable",
    "check_callables",
    "check_choice",
    "check_instance",
    "check_number",
    "check_rank_groups",
]


def check_number(
    name: str,
    value: Any,
    *,
    lo: float,
    hi: float,
    lo_open: bool = False,
    integer: bool = False,
    error: type[Exception] = ConfigError,
) -> None:
    """Raises `error` unless `lo <= value <= hi` (or `lo < value` if `lo_open`).

    Booleans, strings, NaN and inf are rejected; `integer=True` also rejects
    non-integral floats. The message names the field, the range, what came,
    and how to fix it.

    >>> check_number("gain", 0.5, lo=0.0, hi=1.0)
    >>> check_number("gain", float("nan"), lo=0.0, hi=1.0)
    Traceback (most recent call last):
    ...
    jaxpace.errors.ConfigError: `gain` must be a number in [0.0, 1.0], got nan. Pass a value in [0.0, 1.0].
    """
    kind = "an integer" if integer else "a number"
    bound = f"{'(' if lo_open else '['}{lo}, {hi}]"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise error(
            f"`{name}` must be {kind} in {bound}, got {value!r} of type {type(value).__name__}."
        )
    v = float(value)
    if integer and (not math.isfinite(v) or int(v) != v):
        raise error(f"`{name}` must be an integer in {bound}, got {value!r}.")
    if not math.isfinite(v) or v > hi or v < lo or (lo_open and v == lo):
        raise error(f"`{name}` must be {kind} in {bound}, got {value!r}. Pass a value in {bound}.")


def check_bool(name: str, value: Any, *, error: type[Exception] = ConfigError) -> None:
    """Raises `error` unless `value` is exactly True or False (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise error(f"`{name}` must be True or False, got {value!r}.")


def check_choice(
    name: str, value: Any, choices: Iterable[Any], *, error: type[Exception] = ConfigError
) -> None:
    """Raises `error` unless `value` is one of `choices`, listing them."""
    choices = tuple(choices)
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise error(f"`{name}` must be one of {listed}, got {value!r}.")


def check_instance(
    name: str,
    value: Any,
    types: type | tuple[type, ...],
    *,
    expected: str,
    fix: str,
    allow_none: bool = False,
    error: type[Exception] = ConfigError,
) -> None:
    """Raises `error` unless `value` is an instance of `types` (or None if `allow_none`)."""
    if allow_none and value is None:
        return
    if not isinstance(value, types):
        raise error(f"`{name}` must be {expected}, got {_show(value)}. {fix}")


def check_callable(
    name: str,
    value: Any,
    *,
    fix: str,
    allow_none: bool = False,
    error: type[Exception] = ConfigError,
) -> None:
    """Raises `error` unless `value` is callable (or None if `allow_none`).

    >>> check_callable("clock", "x", fix="Pass time.perf_counter_ns.")
    Traceback (most recent call last):
    ...
    jaxpace.errors.ConfigError: `clock` must be callable, got 'x' of type str. Pass time.perf_counter_ns.
    """
    if allow_none and value is None:
        return
    if not callable(value):
        raise error(f"`{name}` must be callable, got {_show(value)}. {fix}")


def check_callables(
    name: str, value: Any, *, fix: str, error: type[Exception] = ConfigError
) -> list[Callable[..., Any]]:
    """Returns `value` as a list after checking it is an iterable of callables.

    A string, a mapping or a single callable is refused (a likely mistake).

    >>> check_callables("sinks", [print], fix="")
    [<built-in function print>]
    >>> check_callables("sinks", 42, fix="Pass a list of functions.")
    Traceback (most recent call last):
    ...
    jaxpace.errors.ConfigError: `sinks` must be a list of callables, got 42 of type int. Pass a list of functions.
    """
    what = "a list of callables"
    if callable(value):
        raise error(
            f"`{name}` must be {what}, got the single callable {value!r}. "
            f"Wrap it in a list: [{getattr(value, '__name__', 'f')}]."
        )
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise error(f"`{name}` must be {what}, got {_show(value)}. {fix}")
    items = list(value)
    for i, item in enumerate(items):
        if not callable(item):
            raise error(f"`{name}[{i}]` must be callable, got {_show(item)}. {fix}")
    return items


def check_rank_groups(
    name: str, value: Any, *, error: type[Exception] = ConfigError
) -> dict[str, dict[int, str]] | None:
    """Returns `{kind: {rank: label}}` as plain dicts after checking its shape, or None.

    Kinds and labels are non-empty strings; ranks are non-negative integers
    (not bools).

    >>> check_rank_groups("rank_groups", {"numa": {0: "s0", 1: "s1"}})
    {'numa': {0: 's0', 1: 's1'}}
    >>> check_rank_groups("rank_groups", {"numa": ["s0"]})
    Traceback (most recent call last):
    ...
    jaxpace.errors.ConfigError: `rank_groups['numa']` must be a dict {rank: label}, got ['s0'] of type list. Pass e.g. rank_groups={"numa": {0: "socket0", 1: "socket1"}}.
    """
    fix = 'Pass e.g. rank_groups={"numa": {0: "socket0", 1: "socket1"}}.'
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise error(f"`{name}` must be a dict {{kind: {{rank: label}}}}, got {_show(value)}. {fix}")
    out: dict[str, dict[int, str]] = {}
    for kind, mapping in value.items():
        if not isinstance(kind, str) or not kind:
            raise error(
                f"`{name}` keys must be non-empty strings (a group kind), got {kind!r}. {fix}"
            )
        where = f"{name}[{kind!r}]"
        if not isinstance(mapping, Mapping):
            raise error(f"`{where}` must be a dict {{rank: label}}, got {_show(mapping)}. {fix}")
        ranks: dict[int, str] = {}
        for rank, label in mapping.items():
            if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
                raise error(f"`{where}` keys must be ranks (integers >= 0), got {rank!r}. {fix}")
            if not isinstance(label, str) or not label:
                raise error(
                    f"`{where}[{int(rank)}]` must be a non-empty string label, got {_show(label)}. "
                    f"{fix}"
                )
            ranks[int(rank)] = label
        out[kind] = ranks
    return out


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} of type {type(value).__name__}"
