"""Byte sizes and memory budgets: parsing and formatting.

The budget contract (DESIGN.md, "The budget contract"), one meaning for the
API and every CLI command.  A budget is

- an ``int``: bytes (``>= 1``);
- a string with a unit: ``"12GiB"``, ``"800MB"``, ``"512KiB"``, ``"1000000B"``
  (``K``/``M``/``G``/``T`` alone are binary);
- a percentage string ``"60%"``, or a ``float`` in ``(0, 1]``: that fraction
  of the reference peak (the simulated no-remat graph peak).

Everything else raises :class:`~libra_opt.errors.BudgetError` (a
``LibraOptError`` and a ``ValueError``) with a hint: a bare number string
(``"80"``: "did you mean 80% or 80MiB?"), a float above 1, zero, negatives,
NaN, infinity, unknown units, and a fraction that rounds to 0 bytes.
:func:`check_budget` checks the form alone (no reference needed), so callers
can reject a budget before capturing or profiling anything.
"""
from __future__ import annotations

import math
import numbers
import re

from ..errors import BudgetError

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (or K, M, G, T)"
_NUMBER = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)"
_SIZE_RE = re.compile(rf"^\s*({_NUMBER})\s*([a-zA-Z]*)\s*$", re.IGNORECASE)
_FORMS = "write bytes as an int or with a unit ('12GiB', '800MB', '1000000B'), or a fraction ('60%' or 0.6)"


def _number(text: str, what: str) -> float:
    """A finite, positive float from ``text`` (already matched by the regex)."""
    v = float(text)
    if math.isnan(v):
        raise BudgetError(f"{what} is NaN; {_FORMS}")
    if math.isinf(v):
        raise BudgetError(f"{what} is infinite; {_FORMS}")
    if v <= 0:
        raise BudgetError(f"{what} must be > 0; {_FORMS}")
    return v


def classify_budget(budget) -> tuple[str, float | int]:
    """What kind of budget ``budget`` is, by the budget contract (module
    docstring; DESIGN.md, "The budget contract"), without a reference peak.

    Parameters
    ----------
    budget : int or float or str
        Bytes, a size string (``"12GiB"``), a percentage (``"60%"``) or a
        fraction in ``(0, 1]``.

    Returns
    -------
    ("bytes", int) or ("fraction", float)
        Bytes (``>= 1``), or the fraction of the reference peak in ``(0, 1]``.

    Raises
    ------
    BudgetError
        The budget breaks the contract; the message has a hint.
    """
    if budget is None:
        raise BudgetError(f"no memory budget given; {_FORMS}")
    if isinstance(budget, bool):
        raise BudgetError(f"a memory budget cannot be a bool ({budget!r}); {_FORMS}")
    if isinstance(budget, numbers.Integral):
        if budget <= 0:
            raise BudgetError(f"a memory budget must be > 0 bytes, got {int(budget)}; {_FORMS}")
        return "bytes", int(budget)
    if isinstance(budget, numbers.Real):
        f = float(budget)
        if math.isnan(f) or math.isinf(f):
            raise BudgetError(f"a memory budget cannot be {f}; {_FORMS}")
        if f <= 0:
            raise BudgetError(f"a memory budget must be > 0, got {f}; {_FORMS}")
        if f > 1:
            raise BudgetError(f"a float budget is a fraction of the no-remat peak in (0, 1], got {f}; "
                              f"for bytes pass an int ({int(f)}) or a size string ('{int(f)}B')")
        return "fraction", f
    if not isinstance(budget, str):
        raise BudgetError(f"a memory budget must be an int, a float or a string, got {type(budget).__name__}; "
                          f"{_FORMS}")
    text = budget.strip()
    if not text:
        raise BudgetError(f"the memory budget is empty; {_FORMS}")
    if text.endswith("%"):
        num = text[:-1].strip()
        if not re.fullmatch(_NUMBER, num, re.IGNORECASE):
            raise BudgetError(f"not a percentage budget: {budget!r}; write e.g. '60%'")
        return "fraction", _number(num, f"the percentage budget {budget!r}") / 100.0
    m = _SIZE_RE.match(text)
    if not m:
        raise BudgetError(f"not a memory budget: {budget!r}; {_FORMS}")
    num, unit = m.group(1), m.group(2)
    if unit and unit.lower() not in _UNITS:
        raise BudgetError(f"unknown unit {unit!r} in the budget {budget!r}; use {_UNIT_NAMES}")
    v = _number(num, f"the budget {budget!r}")
    if not unit:
        raise BudgetError(f"the budget {budget!r} has no unit: did you mean {num}% or {num}MiB? "
                          f"(or '{num}B' for bytes)")
    n = v * _UNITS[unit.lower()]
    if math.isinf(n) or n >= 2**63:
        raise BudgetError(f"the budget {budget!r} is too large to be a byte count; {_FORMS}")
    if int(n) < 1:
        raise BudgetError(f"the budget {budget!r} is less than one byte; {_FORMS}")
    return "bytes", int(n)


def check_budget(budget) -> None:
    """Check that ``budget`` follows the budget contract, without a reference
    peak (so before any capture or profiling).

    Parameters
    ----------
    budget : int or float or str
        See the module docstring.

    Raises
    ------
    BudgetError
        The budget breaks the contract; the message has a hint.
    """
    classify_budget(budget)


def parse_budget(budget: str | int | float, reference_bytes: int | None = None) -> int:
    """Turn a memory budget into bytes (the budget contract, module docstring).

    Parameters
    ----------
    budget : int or float or str
        Bytes (``int``), a fraction in ``(0, 1]`` of ``reference_bytes``
        (``float``), ``"60%"`` of ``reference_bytes``, or a size string such as
        ``"12GiB"``.
    reference_bytes : int, optional
        The peak a fraction refers to (the no-remat peak, bytes).

    Returns
    -------
    int
        The budget in bytes, ``>= 1``.

    Raises
    ------
    BudgetError
        The budget breaks the contract, is a fraction without a reference, or
        is a fraction that comes to less than one byte.
    """
    kind, value = classify_budget(budget)
    if kind == "bytes":
        return int(value)
    if reference_bytes is None:
        raise BudgetError(f"budget {budget!r} is relative, but no reference peak was given; pass bytes instead")
    n = int(value * reference_bytes)
    if n < 1:
        raise BudgetError(f"budget {budget!r} of a {reference_bytes}-byte peak is less than one byte; raise it")
    return n


def parse_bytes(text: str | int) -> int:
    """Parse a byte size (a memory cap, a reserve): an ``int`` or a string with
    a unit, as for budgets (``"16GiB"``, ``"800MB"``, ``"16G"``; ``K``/``M``/
    ``G``/``T`` alone are binary).

    Returns
    -------
    int
        Bytes, ``>= 1``.

    Raises
    ------
    BudgetError
        Not a size (a bare number string, a fraction, zero, a negative, NaN,
        infinity, an unknown unit); the message shows the accepted forms.
    """
    if isinstance(text, float) and not isinstance(text, bool):
        if not (math.isfinite(text) and text.is_integer() and text >= 1):
            raise BudgetError(f"not a byte size: {text!r}; write e.g. '16GiB', '800MB' or 1073741824")
        text = int(text)
    if isinstance(text, str) and text.strip().endswith("%"):
        raise BudgetError(f"a byte size cannot be a percentage ({text!r}); write e.g. '16GiB' or '800MB'")
    if isinstance(text, str) and re.fullmatch(_NUMBER, text.strip(), re.IGNORECASE):
        num = text.strip()
        raise BudgetError(f"the byte size {text!r} has no unit: did you mean {num}GiB or {num}MiB? "
                          f"(or '{num}B' for bytes)")
    kind, value = classify_budget(text)
    if kind != "bytes":
        raise BudgetError(f"not a byte size: {text!r}; write e.g. '16GiB', '800MB' or 1073741824")
    return int(value)


def format_bytes(n: float) -> str:
    """Format bytes with a binary unit, e.g. ``format_bytes(3 * 2**30) == '3.00 GiB'``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def format_seconds(s: float) -> str:
    """Format seconds as ``'12.3 ms'`` / ``'4.56 s'`` / ``'850 us'``."""
    if abs(s) >= 1:
        return f"{s:.3f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def budget_from_text(text: str) -> str | float:
    """A budget typed on the command line, ready for :func:`parse_budget`.

    A plain number in ``(0, 1]`` (``"0.6"``, ``"1"``, ``"1.0"``) becomes that
    float, a fraction of the no-remat peak; anything else stays a string, so a
    bare ``"80"`` is rejected with "did you mean 80% or 80MiB?".
    """
    try:
        value = float(text)
    except (TypeError, ValueError):
        return text
    return value if 0 < value <= 1 else text
