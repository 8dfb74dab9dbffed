"""The report's text formatting: milliseconds and integer ranges, one home for each."""

from __future__ import annotations

import math
from collections.abc import Iterable

from jaxpace import _text

__all__ = ["format_ms", "ranges"]


def format_ms(x: float, unit: bool = True) -> str:
    """Seconds as milliseconds to 3 significant digits; "n/a" when not finite.

    >>> format_ms(0.0012345), format_ms(0.0012345, unit=False), format_ms(float("nan"))
    ('1.23 ms', '1.23', 'n/a')
    """
    if not math.isfinite(x):
        return "n/a"
    return f"{x * 1e3:.3g} ms" if unit else f"{x * 1e3:.3g}"


def ranges(values: Iterable[int], limit: int = 6) -> str:
    """'0-3, 7, 9-10' for a sorted integer sequence, truncated after `limit` runs.

    >>> ranges([0, 1, 2, 3, 7, 9, 10])
    '0-3, 7, 9-10'
    >>> ranges(range(0, 20, 2), limit=2)
    '0, 2, ... (10 in all)'
    """
    return _text.ranges(values, limit=limit)
