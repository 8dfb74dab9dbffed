"""The one validator of user-given settings: numbers in a range, booleans, choices."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from jaxpace.errors import ConfigError

__all__ = ["check_bool", "check_choice", "check_number"]


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
