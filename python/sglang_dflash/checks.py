"""Type checks for values read from JSON settings and checkpoint configs.

JSON gives bools where ints are expected (`true` is an `int` subclass in
Python) and NaN where numbers are; both must be refused with the key's name,
not silently used. Shared by the drafter config (config.py) and the
speculation policy's settings (policy.py, cost_model.py).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any


def is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real number that is not a bool or NaN (infinity allowed)."""
    return isinstance(value, Real) and not isinstance(value, bool) and not math.isnan(value)


def is_finite(value: Any) -> bool:
    """A finite real number that is not a bool."""
    return is_real(value) and math.isfinite(value)
